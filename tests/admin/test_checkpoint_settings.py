"""Checkpoint settings in the admin: a cluster's checkpoint storage, a task's checkpoint path and TensorBoard dir."""

from __future__ import annotations

from apps.tasks.models import Task
from tests.admin.conftest import admin_url, form_data
from tests.admin.test_forms import _submission


def test_admins_set_a_clusters_checkpoint_storage_in_the_admin(admin_web, world):
    page = admin_web.get(admin_url(world.cluster))
    assert "Checkpoints" in page.content.decode()
    data = form_data(page)
    data.update(checkpoint_root="/shared/ckpt", checkpoint_storage_class="fast-rwx", checkpoint_size_gib="50")
    assert admin_web.post(admin_url(world.cluster), data).status_code == 302
    world.cluster.refresh_from_db()
    assert (
        world.cluster.checkpoint_root,
        world.cluster.checkpoint_storage_class,
        world.cluster.checkpoint_size_gib,
    ) == ("/shared/ckpt", "fast-rwx", 50)
    data.update(checkpoint_root="/")
    response = admin_web.post(admin_url(world.cluster), data)
    assert response.status_code == 200 and "narrower than /" in str(response.context["adminform"].form.errors)


def test_a_tasks_checkpoint_path_and_tensorboard_dir_are_set_and_checked_in_the_admin(admin_web, world):
    data = _submission(world, checkpoint_path="/workspace/ckpt", tensorboard_dir="/workspace/tb")
    assert admin_web.post(admin_url(Task, "add"), data).status_code == 302
    task = Task.objects.get()
    assert (task.checkpoint_path, task.tensorboard_dir) == ("/workspace/ckpt", "/workspace/tb")
    page = admin_web.get(admin_url(task))
    assert "TensorBoard log dir" in page.content.decode()
    change = form_data(page)
    change.update(checkpoint_path="/etc/ckpt")
    response = admin_web.post(admin_url(task), change)
    assert response.status_code == 200 and "checkpoint_path" in response.context["adminform"].form.errors
