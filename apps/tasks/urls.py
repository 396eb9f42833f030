"""User pages: dashboard, task lists and forms, monitoring, queues."""

app_name = "portal"
urlpatterns: list = []
