"""Seed the GPU model catalog (docs/rules.md#exchange-rates) from apps.clusters.catalog."""

from decimal import Decimal

from django.db import migrations

from apps.clusters.catalog import GPU_CATALOG


def _dec(value):
    return None if value is None else Decimal(str(value))


def seed(apps, schema_editor):
    GPUModel = apps.get_model("clusters", "GPUModel")
    for entry in GPU_CATALOG:
        GPUModel.objects.update_or_create(
            name=entry["name"],
            defaults={
                "vendor": entry["vendor"],
                "aliases": list(entry["aliases"]),
                "vram_gib": _dec(entry["vram_gib"]),
                "tflops_fp16": _dec(entry["tflops_fp16"]),
                "tflops_fp32": _dec(entry["tflops_fp32"]),
                "exchange_rate": _dec(entry["exchange_rate"]),
                "resource_name": entry["resource_name"],
                "visible_devices_env": entry["visible_devices_env"],
                "slurm_gres_type": entry.get("slurm_gres_type", ""),
                "shareable": entry["shareable"],
            },
        )


def unseed(apps, schema_editor):
    GPUModel = apps.get_model("clusters", "GPUModel")
    GPUModel.objects.filter(name__in=[e["name"] for e in GPU_CATALOG], devices__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [("clusters", "0001_initial")]
    operations = [migrations.RunPython(seed, unseed)]
