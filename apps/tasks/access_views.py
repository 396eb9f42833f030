"""Pages into running work: the Web Console (a browser terminal on ``ws/tasks/<id>/terminal/``)."""

from __future__ import annotations

from csp.constants import UNSAFE_INLINE
from csp.decorators import csp_update
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from apps.tasks.models import Task
from apps.vdc.services import can_act


def _instance(request: HttpRequest, task: Task) -> int:
    try:
        instance = int(request.GET.get("instance", "0"))
    except ValueError:
        return 0
    return instance if 0 <= instance < max(task.instances, 1) else 0


@login_required
@require_GET
# xterm.js sizes its character grid with <style> elements it writes at run time; scripts stay 'self' only.
@csp_update({"style-src": [UNSAFE_INLINE]})
def task_terminal(request: HttpRequest, pk: int) -> HttpResponse:
    """The terminal page of one instance; the socket decides (and says) whether a shell opens."""
    task = get_object_or_404(Task.objects.visible_to(request.user).select_related("project", "cluster"), pk=pk)
    instance = _instance(request, task)
    return render(
        request,
        "portal/task_terminal.html",
        {
            "task": task,
            "instance": instance,
            "may_open": can_act(request.user, task.project),
            "socket_path": f"/ws/tasks/{task.pk}/terminal/?instance={instance}",
            "nav": "compute-tasks",
        },
    )
