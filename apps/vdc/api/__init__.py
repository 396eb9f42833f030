"""REST API of the vdc app: serializers, viewsets and routes."""
