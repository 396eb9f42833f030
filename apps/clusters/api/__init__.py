"""REST API of the clusters app: serializers, viewsets and routes."""
