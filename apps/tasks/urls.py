"""User pages: dashboard, task lists and forms, monitoring, queues."""

from django.urls import path, re_path

from apps.tasks import access_views, sweep_views, template_views, views

app_name = "portal"
urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("compute-tasks/", views.compute_tasks, name="compute-tasks"),
    path("compute-tasks/stop-selected/", views.tasks_stop_selected, name="tasks-stop-selected"),
    path("compute-tasks/<int:pk>/stop/", views.task_stop, name="task-stop"),
    path("compute-tasks/<int:pk>/delete/", views.task_delete, name="task-delete"),
    path("task-monitoring/<int:pk>/", views.task_monitoring, name="task-monitoring"),
    path("task-monitoring/<int:pk>/logs/", views.task_logs, name="task-logs"),
    path("task-monitoring/<int:pk>/instances/", views.task_instances_part, name="task-instances"),
    path("task-monitoring/<int:pk>/autoscaling/", views.task_autoscaling, name="task-autoscaling"),
    path("tasks/<int:pk>/task.yaml", views.task_file_download, name="task-file"),
    path("task-monitoring/<int:pk>/terminal/", access_views.task_terminal, name="task-terminal"),
    path("task-monitoring/<int:pk>/service-test/", access_views.service_test, name="task-service-test"),
    re_path(
        r"^tasks/(?P<pk>[0-9]+)/connect/(?P<port>[0-9]{1,5})/(?P<path>.*)$",
        access_views.task_connect,
        name="task-connect",
    ),
    path("sweeps/", sweep_views.sweep_list, name="sweeps"),
    path("sweeps/new/", sweep_views.sweep_new, name="sweep-new"),
    path("sweeps/<int:pk>/", sweep_views.sweep_detail, name="sweep"),
    path("sweeps/<int:pk>/stop/", sweep_views.sweep_stop, name="sweep-stop"),
    path("templates/", template_views.template_list, name="templates"),
    path("templates/<int:pk>/", template_views.template_detail, name="template"),
    path("templates/<int:pk>/delete/", template_views.template_delete, name="template-delete"),
    path("task-monitoring/<int:pk>/save-template/", template_views.task_save_template, name="task-save-template"),
    path("price-estimate/", views.price_estimate, name="price-estimate"),
    path("task-queues/", views.task_queues, name="task-queues"),
    path("task-queues/<int:pk>/policy/", views.queue_policy, name="queue-policy"),
    path("task-queues/<int:pk>/open/", views.queue_open, name="queue-open"),
    *[
        route
        for slug in views.KIND_PAGES
        for route in (
            path(f"{slug}/", views.kind_list, {"slug": slug}, name=slug),
            path(f"{slug}/new/", views.kind_create, {"slug": slug}, name=f"{slug}-new"),
        )
    ],
]
