"""REST API of the queues app: serializers, viewsets and routes."""
