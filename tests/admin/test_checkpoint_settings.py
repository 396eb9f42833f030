"""A cluster's checkpoint storage, set by admins in the cluster's form."""

from __future__ import annotations

from tests.admin.conftest import admin_url, form_data


def test_admins_set_a_clusters_checkpoint_storage_in_the_admin(admin_web, world):
    page = admin_web.get(admin_url(world.cluster))
    assert "Checkpoints" in page.content.decode()
    data = form_data(page)
    data.update(checkpoint_root="/shared/ckpt", checkpoint_storage_class="fast-rwx", checkpoint_size_gib="50")
    assert admin_web.post(admin_url(world.cluster), data).status_code == 302
    world.cluster.refresh_from_db()
    assert (world.cluster.checkpoint_root, world.cluster.checkpoint_storage_class, world.cluster.checkpoint_size_gib) \
        == ("/shared/ckpt", "fast-rwx", 50)  # fmt: skip
    data.update(checkpoint_root="/")
    response = admin_web.post(admin_url(world.cluster), data)
    assert response.status_code == 200 and "narrower than /" in str(response.context["adminform"].form.errors)
