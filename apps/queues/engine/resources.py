"""Turning a task's request into what placement works with, and GPU-equivalents.

A GPU request is normalised into *alternatives*: ``(model, cards, milli, equivalents)`` per
instance, where ``cards`` > 0 asks for whole cards and ``milli`` (1..999) for a share of
one card. "Any model", ``A100|H100`` and the vendor-neutral ``vram=16Gi,tflops-fp16=100``
form all become a list of alternatives, so the placement code only ever sees concrete
models and the equivalents used by quotas, DRF and queue capacity always match the card
that was actually chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

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

    Raises :class:`RequestError` with code ``invalid_request`` or ``no_matching_gpu_model``.
    """
    if req is None:
        return (CPU_ONLY,)
    count = _as_float(getattr(req, "count", 0))
    names = tuple(getattr(req, "models", ()) or ())
    min_vram = getattr(req, "min_vram_gib", None)
    t16 = getattr(req, "min_tflops_fp16", None)
    t32 = getattr(req, "min_tflops_fp32", None)
    vram = getattr(req, "vram_gib", None)
    cores = getattr(req, "cores_percent", None)
    neutral = any(v is not None for v in (min_vram, t16, t32))
    if count <= 0 and not neutral:
        return (CPU_ONLY,)
    if count < 0:
        raise RequestError("invalid_request", "GPU count must not be negative")
    if names:
        unknown = [n for n in names if n not in catalog]
        models = [catalog[n] for n in names if n in catalog]
        if not models:
            raise RequestError("no_matching_gpu_model", f"no GPU model in the catalog matches {unknown}")
    else:
        models = sorted(catalog.values(), key=lambda m: m.name)

    shared = bool(getattr(req, "shared", False))
    alts: list[Alternative] = []
    if neutral:
        # Totals over all cards (as apps.clusters.gpuspec reads them): the fewest cards of a
        # model that reach every total; a model without the figure asked for cannot qualify.
        for m in models:
            cards = 1
            for need, have in ((min_vram, m.vram_gib), (t16, m.tflops_fp16), (t32, m.tflops_fp32)):
                if need is not None:
                    if not have or have <= 0:
                        cards = 0
                        break
                    cards = max(cards, math.ceil(float(need) / have - EPS))
            if cards > 0:
                alts.append((m.name, cards, 0, cards * m.exchange_rate))
    elif vram is not None or cores is not None:
        # The sharing form asks for part of one card: the share depends on the card's size.
        if count > 1:
            raise RequestError("invalid_request", "a memory/compute share is placed on one card: use count 1")
        for m in models:
            if not m.shareable:
                continue
            share = 0
            if vram is not None:
                if m.vram_gib <= 0 or float(vram) > m.vram_gib + EPS:
                    continue
                share = math.ceil(float(vram) / m.vram_gib * WHOLE - EPS)
            if cores is not None:
                share = max(share, math.ceil(float(cores) * 10 - EPS))
            share = max(1, share)
            if share >= WHOLE:
                alts.append((m.name, 1, 0, m.exchange_rate))
            else:
                alts.append((m.name, 0, share, share / WHOLE * m.exchange_rate))
    elif count < 1:
        milli = max(1, round(count * WHOLE))
        for m in models:
            if m.shareable:
                alts.append((m.name, 0, milli, milli / WHOLE * m.exchange_rate))
    else:
        if abs(count - round(count)) > EPS:
            raise RequestError("invalid_request", f"a GPU count above 1 must be whole, got {count}")
        cards = round(count)
        for m in models:
            # "1(vgpu)": whole cards that must be of a shareable model.
            if not shared or m.shareable:
                alts.append((m.name, cards, 0, cards * m.exchange_rate))
    if not alts:
        raise RequestError("no_matching_gpu_model", "no GPU model in the catalog satisfies the request")
    # Cheapest card first: a task that accepts any model should not take the most valuable one.
    alts.sort(key=lambda a: (a[3], a[0]))
    return tuple(alts)


def demand_of(task: Task, catalog: dict[str, GpuModel], instances: int | None = None) -> Demand:
    """Build the :class:`Demand` of a task (``instances`` overrides the gang size, for elastic starts)."""
    alts = gpu_alternatives(task.gpu, catalog)
    n = task.instances if instances is None else instances
    if n < 1:
        raise RequestError("invalid_request", "a task needs at least one instance")
    models = frozenset(a[0] for a in alts if a[0] is not None)
    cpu = float(task.cpu)
    mem = float(task.memory_gib)
    return Demand(alts, cpu, mem, n, models, (alts, cpu, mem, n))


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
