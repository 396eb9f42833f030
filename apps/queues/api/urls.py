"""Routes of the queues app's API; hcsportal/api_urls.py registers them on the v1 router."""

from apps.queues.api import views

ROUTES = [("queues", views.TaskQueueViewSet, "queue")]

urlpatterns: list = []
