"""The process's copy of the GPU catalog: reused between submits, dropped when a model changes."""

from decimal import Decimal

import pytest

from apps.clusters import services
from apps.clusters.models import GPUModel

pytestmark = pytest.mark.django_db


def test_catalog_is_read_once_then_reused(django_assert_num_queries):
    services.forget_catalog()
    with django_assert_num_queries(1):
        first = services.catalog()
    with django_assert_num_queries(0):
        assert services.catalog() is first


def test_saving_a_gpu_model_drops_the_copy_so_a_new_rate_counts_at_once():
    before = services.catalog().entry("A100-80G").exchange_rate
    model = GPUModel.objects.get(name="A100-80G")
    model.exchange_rate = before * 2
    model.save()
    assert services.catalog().entry("A100-80G").exchange_rate == before * 2


def test_deleting_a_gpu_model_drops_the_copy():
    model = GPUModel.objects.create(name="Z9-TEST", vendor="acme", vram_gib=Decimal(16), exchange_rate=Decimal("0.5"))
    assert services.catalog().entry("Z9-TEST").name == "Z9-TEST"
    model.delete()
    with pytest.raises(KeyError):
        services.catalog().entry("Z9-TEST")


def test_the_copy_expires_for_edits_made_by_other_processes(monkeypatch):
    services.catalog()
    GPUModel.objects.filter(name="A100-80G").update(exchange_rate=Decimal("7"))  # no signal: as in another process
    assert services.catalog().entry("A100-80G").exchange_rate != Decimal("7")
    monkeypatch.setattr(services, "CATALOG_TTL_S", 0.0)
    assert services.catalog().entry("A100-80G").exchange_rate == Decimal("7")
