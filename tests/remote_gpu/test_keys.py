"""The portal's side of remote GPU: one key per project, derived (never stored), given to every task of the
project as a secret variable."""

from apps.control.jobspec import job_spec
from apps.control.scheduling import run_cycle
from apps.remotegpu.keys import project_key
from apps.tasks.services import submit_task
from apps.vdc.models import Project
from hcs_remote import wire


def test_each_project_has_its_own_stable_key(world):
    alpha, beta = project_key(world.project), project_key(world.other_project)
    assert alpha != beta
    assert project_key(Project.objects.get(pk=world.project.pk)) == alpha
    assert len(wire.parse_key(alpha)) == 32


def test_a_project_made_again_under_a_deleted_ones_name_gets_another_key(world):
    doomed = Project.objects.create(name="gamma")
    before = project_key(doomed)
    doomed.delete()
    assert project_key(Project.objects.create(name="gamma")) != before


def test_every_task_gets_its_projects_key_as_a_secret_variable(world):
    cpu = submit_task(
        world.member, project=world.project, queue="high", kind="training", name="cpu", gpu_spec="", command="true"
    )
    other = submit_task(
        world.outsider,
        project=world.other_project,
        queue="high",
        kind="inference",
        name="gpu",
        gpu_spec="1(A100)",
        command="true",
        port=9100,
    )
    run_cycle(world.vdc.pk)
    for task, project in ((cpu, world.project), (other, world.other_project)):
        task.refresh_from_db()
        spec = job_spec(task, "install")
        assert spec.secret_env["HCS_REMOTE_GPU_KEY"] == project_key(project)
        # A secret: kept out of the plain variables (a Kubernetes pod spec shows those) and out of repr.
        assert "HCS_REMOTE_GPU_KEY" not in spec.env and project_key(project) not in repr(spec)
