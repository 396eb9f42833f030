"""REST API of the tasks app: serializers, viewsets and routes."""
