"""REST API of the billing app: serializers, viewsets and routes."""
