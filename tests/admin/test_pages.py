"""Every admin page renders for a platform admin; our change forms save when posted back unchanged.

The model list comes from the admin registry, so a newly registered model is covered without a new test.
"""

from __future__ import annotations

import pytest
from django.contrib import admin

from tests.admin.conftest import admin_url, form_data

REGISTERED = sorted(admin.site._registry.items(), key=lambda item: item[0]._meta.label)
OUR_APPS = {"vdc", "clusters", "queues", "tasks", "billing"}


def _ids(items):
    return [model._meta.label for model, _ in items]


@pytest.mark.parametrize(("model", "model_admin"), REGISTERED, ids=_ids(REGISTERED))
def test_changelist_renders(admin_web, every_model, model, model_admin):
    assert admin_web.get(admin_url(model, "changelist")).status_code == 200


@pytest.mark.parametrize(("model", "model_admin"), REGISTERED, ids=_ids(REGISTERED))
def test_changelist_search_renders(admin_web, every_model, model, model_admin):
    if not model_admin.search_fields:
        pytest.skip("no search")
    assert admin_web.get(admin_url(model, "changelist"), {"q": "1"}).status_code == 200


@pytest.mark.parametrize(("model", "model_admin"), REGISTERED, ids=_ids(REGISTERED))
def test_add_page_renders_or_is_refused_for_read_only_models(admin_web, every_model, rf, model, model_admin):
    request = rf.get("/")
    request.user = every_model.admin
    expected = 200 if model_admin.has_add_permission(request) else 403
    assert admin_web.get(admin_url(model, "add")).status_code == expected


@pytest.mark.parametrize(("model", "model_admin"), REGISTERED, ids=_ids(REGISTERED))
def test_change_page_renders(admin_web, every_model, model, model_admin):
    obj = model._default_manager.first()
    assert obj is not None, f"add a {model._meta.label} row to the every_model fixture"
    response = admin_web.get(admin_url(obj))
    assert response.status_code == 200
    assert admin_web.get(admin_url(obj, "history")).status_code == 200


EDITABLE = [(m, a) for m, a in REGISTERED if m._meta.app_label in OUR_APPS]


@pytest.mark.parametrize(("model", "model_admin"), EDITABLE, ids=_ids(EDITABLE))
def test_change_form_posted_back_unchanged_saves(admin_web, every_model, rf, model, model_admin):
    obj = model._default_manager.first()
    request = rf.get("/")
    request.user = every_model.admin
    if not model_admin.has_change_permission(request, obj):
        pytest.skip("read-only in the admin")
    response = admin_web.get(admin_url(obj))
    saved = admin_web.post(admin_url(obj), form_data(response))
    errors = saved.context and saved.context["adminform"].form.errors
    assert saved.status_code == 302, errors


def test_site_header_names_the_portal(admin_web, every_model):
    response = admin_web.get("/admin/")
    assert b"HCS Portal administration" in response.content


def test_closed_invoice_is_read_only(admin_web, every_model):
    from apps.billing.models import Invoice

    invoice = Invoice.objects.get()
    invoice.status = "closed"
    invoice.save()
    response = admin_web.get(admin_url(invoice))
    assert response.status_code == 200
    assert not response.context["has_change_permission"]
    assert admin_web.post(admin_url(invoice), {"status": "draft"}).status_code == 403
    invoice.refresh_from_db()
    assert invoice.status == "closed"


def test_ended_task_page_is_read_only_and_the_timeline_is_shown(admin_web, every_model):
    from apps.tasks.models import Task

    task = Task.objects.get()
    task.status = "completed"
    task.save()
    response = admin_web.get(admin_url(task))
    assert not response.context["has_change_permission"]
    assert b"Started" in response.content
