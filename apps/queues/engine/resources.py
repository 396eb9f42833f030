"""Turning a task's request into what placement works with, and GPU-equivalents.

A GPU request is normalised into *alternatives*: ``(model, cards, milli, equivalents)`` per
instance, where ``cards`` > 0 asks for whole cards and ``milli`` (1..999) for a share of
one card. "Any model", ``A100|H100`` and the vendor-neutral ``vram=16Gi,tflops-fp16=100``
form all become a list of alternatives, so the placement code only ever sees concrete
models and the equivalents used by quotas, DRF and queue capacity always match the card
that was actually chosen.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from apps.clusters.gpuspec import card_options

from .model import GpuModel, Resources, Task

WHOLE = 1000
EPS = 1e-9

# (model, cards, milli, equivalents) per instance; model None = no accelerator.
Alternative = tuple[str | None, int, int, float]
CPU_ONLY: Alternative = (None, 0, 0, 0.0)


class RequestError(ValueError):
    """The request cannot be satisfied by any catalog entry, or is malformed."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Demand:
    """A task's normalised per-instance demand; ``key`` identifies the request shape."""

    alternatives: tuple[Alternative, ...]
    cpu: float
    memory_gib: float
    instances: int
    models: frozenset[str]
    key: tuple
    # An autoscaled service's replicas on Slurm share their node's network and port: one instance per node there.
    one_per_node: bool = False

    def vector(self, alt: Alternative, instances: int | None = None) -> Resources:
        """Total resources of ``instances`` (default: all) instances using ``alt``."""
        n = self.instances if instances is None else instances
        return Resources(self.cpu * n, self.memory_gib * n, alt[3] * n)


def _as_float(value) -> float:
    if value is None:
        return 0.0
    if isinstance(value, Decimal):
        return float(value)
    return float(value)


def gpu_alternatives(req, catalog: dict[str, GpuModel]) -> tuple[Alternative, ...]:
    """Normalise a GPU request (a ``GpuRequest`` or any object with its fields) into alternatives.

    Which models fit and what they cost in equivalents come from ``apps.clusters.gpuspec.card_options``,
    the one implementation the submit checks use too. Raises :class:`RequestError` with code
    ``invalid_request`` or ``no_matching_gpu_model``.
    """
    if req is None:
        return (CPU_ONLY,)
    count = _as_float(getattr(req, "count", 0))
    neutral = any(getattr(req, f, None) is not None for f in ("min_vram_gib", "min_tflops_fp16", "min_tflops_fp32"))
    if count <= 0 and not neutral:
        return (CPU_ONLY,)
    sharing = getattr(req, "vram_gib", None) is not None or getattr(req, "cores_percent", None) is not None
    if not neutral and sharing and count > 1:
        raise RequestError("invalid_request", "a memory/compute share is placed on one card: use count 1")
    if not neutral and not sharing and count > 1 and abs(count - round(count)) > EPS:
        raise RequestError("invalid_request", f"a GPU count above 1 must be whole, got {count}")
    names = tuple(getattr(req, "models", ()) or ())
    if names:
        models = [catalog[n] for n in names if n in catalog]
        if not models:
            unknown = [n for n in names if n not in catalog]
            raise RequestError("no_matching_gpu_model", f"no GPU model in the catalog matches {unknown}")
    else:
        # "Any model" is any card: a MIG instance or a time-sliced replica is placed only when the request names it.
        models = sorted((m for m in catalog.values() if not m.partition), key=lambda m: m.name)
    alts = tuple((o.model, o.cards, o.milli, float(o.equivalents)) for o in card_options(req, models))
    if not alts:
        raise RequestError("no_matching_gpu_model", "no GPU model in the catalog satisfies the request")
    return alts


def demand_of(task: Task, catalog: dict[str, GpuModel], instances: int | None = None) -> Demand:
    """Build the :class:`Demand` of a task (``instances`` overrides the gang size, for elastic starts)."""
    alts = gpu_alternatives(task.gpu, catalog)
    n = task.instances if instances is None else instances
    if n < 1:
        raise RequestError("invalid_request", "a task needs at least one instance")
    models = frozenset(a[0] for a in alts if a[0] is not None)
    cpu = float(task.cpu)
    mem = float(task.memory_gib)
    spread = task.autoscaled and n > 1
    return Demand(alts, cpu, mem, n, models, (alts, cpu, mem, n, spread), spread)


def fits_under(usage: Resources, add: Resources, cap: Resources) -> bool:
    """True when ``usage + add`` stays within ``cap`` in every dimension."""
    return (
        usage.cpu + add.cpu <= cap.cpu + EPS
        and usage.memory_gib + add.memory_gib <= cap.memory_gib + EPS
        and usage.gpu + add.gpu <= cap.gpu + EPS
    )


def plus(a: Resources, b: Resources, sign: int = 1) -> Resources:
    """Vector sum (or difference with ``sign=-1``)."""
    return Resources(a.cpu + sign * b.cpu, a.memory_gib + sign * b.memory_gib, a.gpu + sign * b.gpu)


def dominant_share(usage: Resources, total: Resources) -> float:
    """DRF dominant share: the largest of the cpu, memory and GPU-equivalent shares."""
    share = 0.0
    if total.cpu > 0:
        share = usage.cpu / total.cpu
    if total.memory_gib > 0:
        share = max(share, usage.memory_gib / total.memory_gib)
    if total.gpu > 0:
        share = max(share, usage.gpu / total.gpu)
    return share


def within_guarantee(usage: Resources, add: Resources, guaranteed: Resources) -> bool:
    """True when adding ``add`` keeps usage inside the guarantee.

    A GPU task is judged on GPU-equivalents only (guarantees are usually stated in GPUs and
    the cpu that comes with them should not void the guarantee); a CPU task on cpu and memory.
    """
    if add.gpu > 0:
        return usage.gpu + add.gpu <= guaranteed.gpu + EPS
    return (
        usage.cpu + add.cpu <= guaranteed.cpu + EPS and usage.memory_gib + add.memory_gib <= guaranteed.memory_gib + EPS
    )


def borrowing(usage: Resources, guaranteed: Resources, gpu: bool) -> bool:
    """True when usage is above the guarantee in the dimension(s) a reclaimer needs."""
    if gpu:
        return usage.gpu > guaranteed.gpu + EPS
    return usage.cpu > guaranteed.cpu + EPS or usage.memory_gib > guaranteed.memory_gib + EPS
