"""Admin forms: write-only credentials, submission through the service, text instead of raw JSON."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.contrib.admin.models import LogEntry

from apps.billing.models import PriceRule
from apps.clusters.models import Cluster, Device, GPUModel
from apps.clusters.services import validate_gpu_spec
from apps.tasks.models import Task, TaskEvent
from apps.vdc.models import ProjectQuota
from tests.admin.conftest import admin_url, form_data

SECRET = "tok-3f9a-very-secret"


def _edit(client, obj, **changes):
    """Open the change page of ``obj``, change some fields, post it; return the response."""
    data = form_data(client.get(admin_url(obj)))
    data.update(changes)
    return client.post(admin_url(obj), data)


def _errors(response) -> dict:
    return response.context["adminform"].form.errors


# --- cluster credentials ---------------------------------------------------------------------------------------


def test_credentials_are_set_encrypted_and_never_rendered(admin_web, world):
    assert b"not set" in admin_web.get(admin_url(world.cluster)).content

    response = _edit(admin_web, world.cluster, token=SECRET, user="slurm", verify_ssl="false")
    assert response.status_code == 302

    world.cluster.refresh_from_db()
    assert world.cluster.get_credentials() == {"token": SECRET, "user": "slurm", "verify_ssl": False}
    page = admin_web.get(admin_url(world.cluster)).content.decode()
    assert SECRET not in page and world.cluster.credentials_encrypted not in page
    assert "credentials_encrypted" not in page
    assert "set (token, user, verify_ssl)" in page
    change = LogEntry.objects.get(object_id=str(world.cluster.pk)).get_change_message()
    assert change == "Changed Token / JWT, user and Verify TLS." and SECRET not in change


def test_filled_credential_fields_replace_their_keys_and_keep_the_others(admin_web, world):
    world.cluster.set_credentials({"token": "old", "ca_cert": "PEM", "verify_ssl": False})
    world.cluster.save()
    assert _edit(admin_web, world.cluster, description="rack 4").status_code == 302
    world.cluster.refresh_from_db()
    assert world.cluster.get_credentials() == {"token": "old", "ca_cert": "PEM", "verify_ssl": False}
    assert world.cluster.description == "rack 4"

    assert _edit(admin_web, world.cluster, token=SECRET, other_credentials="output_dir=/scratch").status_code == 302
    world.cluster.refresh_from_db()
    assert world.cluster.get_credentials() == {
        "token": SECRET,
        "ca_cert": "PEM",
        "verify_ssl": False,
        "output_dir": "/scratch",
    }


def test_clear_removes_credentials_and_cannot_be_combined_with_new_ones(admin_web, world):
    world.cluster.set_credentials({"token": SECRET})
    world.cluster.save()
    response = _edit(admin_web, world.cluster, clear_credentials="on", token="new")
    assert "not both" in str(_errors(response))
    assert _edit(admin_web, world.cluster, clear_credentials="on").status_code == 302
    world.cluster.refresh_from_db()
    assert not world.cluster.has_credentials


def test_other_keys_may_not_shadow_their_own_fields(admin_web, world):
    response = _edit(admin_web, world.cluster, other_credentials="token=abc")
    assert "own for token" in _errors(response)["other_credentials"][0]
    assert "abc" not in response.content.decode()


def test_a_failed_save_does_not_echo_the_secret(admin_web, world):
    response = _edit(
        admin_web, world.cluster, cluster_type="kubernetes", endpoint="", kubeconfig=SECRET, ca_cert=SECRET
    )
    assert response.status_code == 200
    assert "endpoint" in _errors(response)
    assert SECRET not in response.content.decode()
    world.cluster.refresh_from_db()
    assert not world.cluster.has_credentials


def test_cluster_labels_are_key_value_lines(admin_web, world):
    assert _edit(admin_web, world.cluster, labels="region=north\n gpu = a100 \n").status_code == 302
    world.cluster.refresh_from_db()
    assert world.cluster.labels == {"region": "north", "gpu": "a100"}
    assert "region=north" in admin_web.get(admin_url(world.cluster)).content.decode()

    response = _edit(admin_web, world.cluster, labels="region north")
    assert "expected key=value" in _errors(response)["labels"][0]


# --- task submission ------------------------------------------------------------------------------------------


def _submission(world, **fields) -> dict:
    data = {
        "name": "admin-job",
        "kind": "training",
        "project": world.project.pk,
        "queue": world.high.pk,
        "cpu": "2",
        "memory_gib": "8",
        "gpu_spec": "1(A100)",
        "instances": "1",
        "max_retries": "0",
        "command": "python train.py",
        "env": "EPOCHS=3",
        "preemptible": "on",
    }
    data.update(fields)
    return data


def test_add_form_submits_through_the_service(admin_web, world):
    response = admin_web.post(admin_url(Task, "add"), _submission(world))
    assert response.status_code == 302, _errors(response)
    task = Task.objects.get()
    assert (task.status, task.owner, task.vdc, task.env) == ("queued", world.admin, world.vdc, {"EPOCHS": "3"})
    assert task.events.get().kind == "submitted"
    assert LogEntry.objects.filter(object_id=str(task.pk), action_flag=1).exists()


@pytest.mark.parametrize("spec", ["2x(V100)", "1(NoSuchCard)", "-1"])
def test_add_form_rejects_a_malformed_gpu_spec_with_the_parser_message_and_writes_nothing(admin_web, world, spec):
    with pytest.raises(Exception) as parser:
        validate_gpu_spec(spec, vdc_id=world.vdc.pk)  # the parser's message, its hints from the task's VDC
    response = admin_web.post(admin_url(Task, "add"), _submission(world, gpu_spec=spec))
    assert response.status_code == 200
    assert _errors(response)["gpu_spec"] == parser.value.messages
    assert parser.value.messages[0] in response.content.decode().replace("&#x27;", "'").replace("&quot;", '"')
    assert not Task.objects.exists() and not TaskEvent.objects.exists()


def test_add_form_shows_queue_and_quota_rules_next_to_their_fields(admin_web, world):
    world.low.is_open = False
    world.low.save()
    closed = admin_web.post(admin_url(Task, "add"), _submission(world, queue=world.low.pk))
    assert "closed" in _errors(closed)["queue"][0]
    medium = admin_web.post(admin_url(Task, "add"), _submission(world, queue=world.medium.pk))
    assert "expected duration" in _errors(medium)["expected_duration"][0]
    too_big = admin_web.post(admin_url(Task, "add"), _submission(world, cpu="500"))
    # What no node can hold is refused first, next to the field, with the largest node named.
    assert "no node has 500 cores (largest 64)" in _errors(too_big)["cpu"][0]
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("env", "CUDA_VISIBLE_DEVICES=0,1", "reserved"),
        ("env", "A B=1", "letters, digits and underscores"),
        ("volumes", '[1, "a"]', "Volume 1: expected an object"),
        ("volumes", '[{"mount_path": "/data", "claim_name": "datasets"}]', "expected a name"),
        ("volumes", "[" * 100_000 + "]" * 100_000, "JSON"),
        ("instances", "200000", "1024"),
        ("expected_duration", "999999 00:00:00", "longest expected duration"),
    ],
    ids=[
        "reserved-env",
        "bad-env-name",
        "volumes-not-objects",
        "volume-without-name",
        "deep-json",
        "instances",
        "duration",
    ],
)
def test_add_form_refuses_out_of_bounds_values_on_their_field_and_writes_nothing(
    admin_web, world, field, value, expected
):
    response = admin_web.post(admin_url(Task, "add"), _submission(world, **{field: value}))
    assert response.status_code == 200
    assert expected in " ".join(_errors(response)[field])
    assert not Task.objects.exists() and not TaskEvent.objects.exists()


def test_queue_maximum_expected_duration_is_edited_and_bounded_in_the_admin(admin_web, world):
    response = _edit(admin_web, world.high, max_expected_duration="400 00:00:00")
    assert "366 days" in _errors(response)["max_expected_duration"][0]
    assert _edit(admin_web, world.high, max_expected_duration="30 00:00:00").status_code == 302
    world.high.refresh_from_db()
    assert world.high.max_expected_duration.days == 30


def test_cluster_host_path_prefixes_are_lines_validated_by_the_model(admin_web, world):
    assert _edit(admin_web, world.cluster, allowed_host_paths="/data\n /scratch \n\n").status_code == 302
    world.cluster.refresh_from_db()
    assert world.cluster.allowed_host_paths == ["/data", "/scratch"]
    response = _edit(admin_web, world.cluster, allowed_host_paths="/")
    assert "narrower than /" in _errors(response)["allowed_host_paths"][0]
    response = _edit(admin_web, world.cluster, allowed_host_paths="data")
    assert "absolute" in _errors(response)["allowed_host_paths"][0]


def test_change_form_keeps_state_and_submitted_resources_read_only(admin_web, world):
    admin_web.post(admin_url(Task, "add"), _submission(world))
    task = Task.objects.get()
    response = _edit(admin_web, task, name="renamed", status="running", gpu_spec="8(A100)", env="A=1")
    assert response.status_code == 302
    task.refresh_from_db()
    assert (task.name, task.status, task.gpu_spec, task.env) == ("renamed", "queued", "1(A100)", {"A": "1"})


# --- devices, catalog, prices, quotas -------------------------------------------------------------------------


def test_device_links_are_lines_validated_by_the_model(admin_web, world):
    device = Device.objects.get(node=world.node, index=0)
    assert _edit(admin_web, device, links="1 nvlink 600\n2 PCIe").status_code == 302
    device.refresh_from_db()
    assert device.links == [{"peer": 1, "type": "nvlink", "bandwidth_gbps": 600}, {"peer": 2, "type": "pcie"}]
    assert "1 nvlink 600" in admin_web.get(admin_url(device)).content.decode()

    response = _edit(admin_web, device, links="1 infiniband")
    assert "Expected a link type of nvlink, hccs, pcie, xgmi, mlulink, got 'infiniband'." in _errors(response)["links"]
    response = _edit(admin_web, device, links="one nvlink")
    assert "expected 'peer type [bandwidth]'" in _errors(response)["links"][0]


def test_node_inline_on_the_cluster_edits_devices_links_on_the_node(admin_web, world):
    data = form_data(admin_web.get(admin_url(world.node)))
    data["devices-0-links"] = "1 nvlink 300"
    assert admin_web.post(admin_url(world.node), data).status_code == 302
    assert Device.objects.get(node=world.node, index=0).links == [{"peer": 1, "type": "nvlink", "bandwidth_gbps": 300}]


def test_gpu_model_aliases_are_comma_text_and_rates_are_editable_in_the_list(admin_web, world):
    model = GPUModel.objects.get(name="A100-80G")
    assert "a100, a100-80g" in admin_web.get(admin_url(model)).content.decode()
    assert _edit(admin_web, model, aliases="a100, A100-SXM , a100,").status_code == 302
    model.refresh_from_db()
    assert model.aliases == ["a100", "A100-SXM"]

    changelist = admin_web.get(admin_url(GPUModel, "changelist"))
    assert "exchange_rate" in changelist.context["cl"].list_editable


def test_price_tiers_are_readable_lines_validated_by_the_model(admin_web, world):
    a100 = GPUModel.objects.get(name="A100-80G")
    data = {
        "resource_type": "gpu",
        "gpu_model": a100.pk,
        "price_per_hour": "10",
        "currency": "CNY",
        "min_billing_minutes": "1",
        "discount_tiers": "100h: 10%\n1000 25.5",
        "active": "on",
    }
    assert admin_web.post(admin_url(PriceRule, "add"), data).status_code == 302
    rule = PriceRule.objects.get()
    assert rule.discount_tiers == [{"from_hours": 100, "percent": 10}, {"from_hours": 1000, "percent": 25.5}]
    assert "100h: 10%" in admin_web.get(admin_url(rule)).content.decode()

    response = _edit(admin_web, rule, discount_tiers="1000h: 10%\n100h: 20%")
    assert "increasing hours" in _errors(response)["discount_tiers"][0]
    response = _edit(admin_web, rule, discount_tiers="ten percent")
    assert "expected 'hours: percent'" in _errors(response)["discount_tiers"][0]


def test_quota_validation_errors_surface_in_the_form(admin_web, world):
    response = _edit(admin_web, world.quota, guaranteed_gpu="6", limit_gpu="4")
    assert "at least the guaranteed" in _errors(response)["limit_gpu"][0]
    response = _edit(admin_web, world.quota, guaranteed_gpu="7", limit_gpu="8")
    assert "over its capacity" in _errors(response)["guaranteed_gpu"][0]
    world.quota.refresh_from_db()
    assert world.quota.guaranteed_gpu == Decimal("2")
    assert _edit(admin_web, world.quota, guaranteed_gpu="5").status_code == 302


def test_quota_inline_on_the_vdc_surfaces_the_same_errors(admin_web, world):
    data = form_data(admin_web.get(admin_url(world.vdc)))
    index = next(k.split("-")[1] for k, v in data.items() if k.endswith("-id") and v == world.quota.pk)
    data[f"quotas-{index}-guaranteed_gpu"] = "9"
    data[f"quotas-{index}-limit_gpu"] = "9"
    response = admin_web.post(admin_url(world.vdc), data)
    assert response.status_code == 200
    assert "over its capacity" in str(response.context["inline_admin_formsets"][1].formset.errors)
    assert ProjectQuota.objects.get(pk=world.quota.pk).guaranteed_gpu == Decimal("2")


def test_cluster_inline_on_the_vdc_is_read_only_with_links(admin_web, world):
    page = admin_web.get(admin_url(world.vdc)).content.decode()
    assert admin_url(world.cluster) in page
    assert 'name="clusters-0-name"' not in page
    assert Cluster.objects.count() == 1


def test_credentials_unreadable_under_a_new_key_are_reported_and_replaced(admin_web, world):
    Cluster.objects.filter(pk=world.cluster.pk).update(credentials_encrypted="gAAAAAB-not-a-valid-token")
    assert "unreadable" in admin_web.get(admin_url(world.cluster)).content.decode()
    assert _edit(admin_web, world.cluster, token=SECRET).status_code == 302
    world.cluster.refresh_from_db()
    assert world.cluster.get_credentials() == {"token": SECRET}


def test_a_vdc_added_in_the_admin_gets_its_class_queues_unless_unticked(admin_web, world):
    from apps.queues.models import TaskQueue
    from apps.vdc.models import VDC

    form = {
        "name": "west",
        "default_queue_policy": "backfill",
        "cluster_selection_strategy": "load_balancing",
        "node_scorer": "fgd",
        "overcommit_ratio": "1.0",
        "enabled": "on",
        "class_queues": "on",
    }
    page = admin_web.get(admin_url(VDC, "add")).content.decode()
    # Every inline of the page (clusters, quotas, rebalancer settings) posted empty.
    prefixes = re.findall(r'name="([\w-]+)-TOTAL_FORMS"', page)
    assert {"clusters", "quotas"} <= set(prefixes), prefixes
    form.update(
        {
            f"{prefix}-{k}": v
            for prefix in prefixes
            for k, v in (
                ("TOTAL_FORMS", "0"),
                ("INITIAL_FORMS", "0"),
                ("MIN_NUM_FORMS", "0"),
                ("MAX_NUM_FORMS", "1000"),
            )
        }
    )
    assert 'name="class_queues"' in page and "checked" in page.split('name="class_queues"')[1][:80]
    response = admin_web.post(admin_url(VDC, "add"), form)
    assert response.status_code == 302, _errors(response)
    west = VDC.objects.get(name="west")
    assert sorted(TaskQueue.objects.filter(vdc=west).values_list("name", "policy")) == [
        ("high", "backfill"),
        ("low", "backfill"),
        ("medium", "backfill"),
    ]
    del form["class_queues"]
    form["name"] = "north"
    assert admin_web.post(admin_url(VDC, "add"), form).status_code == 302
    assert not TaskQueue.objects.filter(vdc__name="north").exists()


def test_a_quota_limit_above_the_vdcs_capacity_is_saved_with_a_warning(admin_web, world):
    # A project's limit could exceed the VDC's total capacity without a word.
    response = _edit(admin_web, world.quota, limit_gpu="100")
    assert response.status_code == 302
    shown = [str(m) for m in admin_web.get(admin_url(world.quota)).context["messages"]]
    expected = "The gpu limit 100 is more than all of VDC main has (8 GPU-equivalents)"
    assert any(m.startswith(expected) for m in shown), shown
    within = _edit(admin_web, world.quota, limit_gpu="8")
    assert within.status_code == 302
    assert not [m for m in admin_web.get(admin_url(world.quota)).context["messages"] if "more than" in str(m)]
    # The same from the VDC's quota inline.
    data = form_data(admin_web.get(admin_url(world.vdc)))
    index = next(k.split("-")[1] for k, v in data.items() if k.endswith("-id") and v == world.quota.pk)
    data[f"quotas-{index}-limit_cpu"] = "100000"
    assert admin_web.post(admin_url(world.vdc), data).status_code == 302
    shown = [str(m) for m in admin_web.get(admin_url(world.vdc)).context["messages"]]
    assert any(m.startswith("The cpu limit 100000 is more than all of VDC main has (64 cores)") for m in shown)


def _running_service(world, **fields):
    from tests.factories import TaskFactory

    fields = {"autoscale_min": 1, "autoscale_max": 2, **fields}
    return TaskFactory(
        project=world.project,
        vdc=world.vdc,
        queue=world.high,
        owner=world.member,
        kind="inference",
        status="running",
        port=8000,
        **fields,
    )


def test_autoscaling_edits_go_through_the_service_with_an_event(admin_web, world):
    svc = _running_service(world, autoscale_desired=2)
    response = _edit(admin_web, svc, autoscale_max="4", autoscale_rps="25", autoscale_concurrency="8")
    assert response.status_code == 302, _errors(response)
    svc.refresh_from_db()
    assert (svc.autoscale_max, svc.autoscale_rps, svc.autoscale_concurrency) == (4, 25, 8)
    assert "max 2 → 4" in svc.events.get(kind="autoscaled").message


def test_autoscaling_edit_with_min_above_max_is_refused_on_its_field(admin_web, world):
    svc = _running_service(world)
    response = _edit(admin_web, svc, autoscale_min="3")
    assert response.status_code == 200
    assert "autoscale_max" in _errors(response)
    svc.refresh_from_db()
    assert svc.autoscale_min == 1 and not svc.events.filter(kind="autoscaled").exists()


def test_the_admin_sets_scheduled_minimums_given_as_lines_and_refuses_one_past_the_maximum(admin_web, world):
    svc = _running_service(world)
    response = _edit(admin_web, svc, autoscale_schedule='["Mon-Fri 08:00-20:00 2 Europe/Berlin"]')
    assert response.status_code == 302, _errors(response)
    svc.refresh_from_db()
    assert svc.autoscale_schedule == [
        {"days": "Mon-Fri", "from": "08:00", "to": "20:00", "timezone": "Europe/Berlin", "min_replicas": 2}
    ]
    response = _edit(admin_web, svc, autoscale_schedule='["Sat 10:00-12:00 5"]')
    assert "replicas 1..2, got 5" in " ".join(_errors(response)["autoscale_schedule"])
