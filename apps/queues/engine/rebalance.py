"""Inter-project rebalancing (docs/rules.md#rebalancing): the rules that open and return explicit, time-bounded
capacity loans.

Pure: plain project states and loans in, loans to open and loans to return out; no Django, no clock of its own.
The control loop (``apps.control.rebalance``) maps rows onto these types, runs :func:`plan` per VDC and writes
the result; the scheduling snapshot applies the active loans with :func:`quota_adjustments`.

A loan moves part of a lender's *unused guarantee* to a borrower whose waiting work its own limit blocks:

* **opened** only when, in a resource the borrower is blocked on, the lender's utilisation of its guarantee
  (used + already lent, over guaranteed) is below the borrower's (used over guaranteed; a borrower with no
  guarantee counts as fully used) by more than ``threshold``; the lender has no waiting work and no loan of its
  own; the amount is at most the lender's unused guarantee and at most the borrower's blocked demand (what its
  waiting work needs beyond its limit and the loans it already has); and the pair has not had a loan returned
  within ``cooldown_s``.
* **returned** when it expires (``max_duration_s``); when the lender has waiting work its remaining unlent
  guarantee cannot hold (newest loans first, only as many as that work needs; at once, whatever the loan's
  age); or when the borrower no longer uses it (its running and waiting work fits under its own limit and
  older loans), but only after ``min_lifetime_s``.

Effect on the engine (:func:`quota_adjustments`): a loan raises the borrower's guarantee *and* limit by the
amount and lowers the lender's guarantee by it (the lender's limit is unchanged). The sum of the guarantees
stays the same; the borrower's loaned usage is within its guarantee, so a third project cannot reclaim it;
and once the loan is returned the borrower is above its guarantee and limit again, so the lender's waiting
work takes the capacity back through the ordinary reclaim rules (minimal victims, minimum run first).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .model import Id, Loan, Resources

EPS = 1e-9
DIMENSIONS = ("gpu", "cpu", "memory_gib")
UNITS = {"gpu": "GPU-eq", "cpu": "cores", "memory_gib": "GiB"}


class ReturnReason:
    """Why a loan ended (``CapacityLoan.return_reason``)."""

    EXPIRED = "expired"
    LENDER_DEMAND = "lender_demand"
    BORROWER_IDLE = "borrower_idle"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class ProjectState:
    """One project's quota and load in a VDC.

    ``guaranteed`` and ``limit`` are the project's own (no loans applied); ``used`` is what its running work
    holds; ``waiting`` the demand of its queued work that could run (not set aside as invalid or out of budget);
    ``blocked`` the part of ``waiting`` whose tasks wait on the project's quota limit and could run on a loan;
    ``loanable`` the part of ``waiting`` that could run on a loan (None: all of it). With "loans for low-class work
    only" (``VdcSettings.loans_low_class_only``) the caller counts only low-class work in ``blocked`` and
    ``loanable``: no loan opens for work that could not use it, and one that only such work wants is returned.
    """

    project_id: Id
    guaranteed: Resources = Resources()
    limit: Resources = Resources()
    used: Resources = Resources()
    waiting: Resources = Resources()
    blocked: Resources = Resources()
    enforce: bool = True
    name: str = ""
    loanable: Resources | None = None

    @property
    def label(self) -> str:
        return self.name or str(self.project_id)


@dataclass(frozen=True, slots=True)
class PastLoan:
    """A returned loan, for the cool-down: the pair is not lent to again until ``returned_at + cooldown_s``."""

    lender_id: Id
    borrower_id: Id
    returned_at: float


@dataclass(frozen=True, slots=True)
class Policy:
    """A VDC's rebalancer settings, in seconds and fractions."""

    threshold: float = 0.20
    max_duration_s: float = 4 * 3600.0
    min_lifetime_s: float = 600.0
    cooldown_s: float = 900.0

    def __post_init__(self):
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"threshold must be between 0 and 1, got {self.threshold!r}")
        if self.max_duration_s <= 0 or self.min_lifetime_s < 0 or self.cooldown_s < 0:
            raise ValueError("max duration must be > 0, minimum lifetime and cool-down >= 0")


@dataclass(frozen=True, slots=True)
class NewLoan:
    """A loan to open, with the figures that justified it (kept on the loan as its reason)."""

    lender_id: Id
    borrower_id: Id
    amount: Resources
    started_at: float
    expires_at: float
    reason: str
    figures: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Return:
    """A loan to return, and why."""

    loan_id: Id
    reason: str
    message: str
    figures: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Plan:
    opened: tuple[NewLoan, ...] = ()
    returned: tuple[Return, ...] = ()


def _get(r: Resources, d: str) -> float:
    return getattr(r, d)


def _vec(**values: float) -> Resources:
    return Resources(**{d: max(0.0, values.get(d, 0.0)) for d in DIMENSIONS})


def _add(a: Resources, b: Resources, sign: int = 1) -> Resources:
    return Resources(a.cpu + sign * b.cpu, a.memory_gib + sign * b.memory_gib, a.gpu + sign * b.gpu)


def _clip(r: Resources) -> Resources:
    return Resources(max(0.0, r.cpu), max(0.0, r.memory_gib), max(0.0, r.gpu))


def _any(r: Resources) -> bool:
    return any(_get(r, d) > EPS for d in DIMENSIONS)


def _sum(rs: Iterable[Resources]) -> Resources:
    total = Resources()
    for r in rs:
        total = _add(total, r)
    return total


def _fmt(r: Resources) -> str:
    parts = [f"{_get(r, d):g} {UNITS[d]}" for d in DIMENSIONS if _get(r, d) > EPS]
    return ", ".join(parts) or "nothing"


def _figures(r: Resources) -> dict[str, float]:
    return {d: round(_get(r, d), 6) for d in DIMENSIONS}


def quota_adjustments(loans: Iterable[Loan]) -> dict[Id, tuple[Resources, Resources]]:
    """Per project, what its active loans add to its guarantee and to its limit (negative for a lender's guarantee).

    Apply with ``guaranteed + g`` (clipped at 0) and ``limit + l``.
    """
    out: dict[Id, tuple[Resources, Resources]] = {}
    for loan in loans:
        g, lim = out.get(loan.borrower_id, (Resources(), Resources()))
        out[loan.borrower_id] = (_add(g, loan.amount), _add(lim, loan.amount))
        g, lim = out.get(loan.lender_id, (Resources(), Resources()))
        out[loan.lender_id] = (_add(g, loan.amount, -1), lim)
    return out


def apply_adjustment(base: Resources, delta: Resources) -> Resources:
    """``base + delta``, never below zero."""
    return _clip(_add(base, delta))


def loans_in_use(projects: Mapping[Id, ProjectState], loans: Iterable[Loan]) -> dict[Id, Resources]:
    """Per loan, how much of it the borrower's *running* work uses now: its usage above its own limit, given to
    its loans oldest first (what billing accrues as loaned usage)."""
    out: dict[Id, Resources] = {}
    for borrower_id, own in _by_borrower(loans).items():
        p = projects.get(borrower_id)
        excess = _clip(_add(p.used, p.limit, -1)) if p is not None else Resources()
        for loan in own:
            part = Resources(*(min(_get(excess, d), _get(loan.amount, d)) for d in ("cpu", "memory_gib", "gpu")))
            out[loan.id] = part
            excess = _clip(_add(excess, part, -1))
    return out


def _by_borrower(loans: Iterable[Loan]) -> dict[Id, list[Loan]]:
    groups: dict[Id, list[Loan]] = {}
    for loan in sorted(loans, key=lambda x: (x.started_at, str(x.id))):
        groups.setdefault(loan.borrower_id, []).append(loan)
    return groups


def _utilisation(used: Resources, guaranteed: Resources, d: str) -> float:
    g = _get(guaranteed, d)
    if g <= EPS:
        return float("inf")  # no guarantee: any use, or any blocked work, is all of it
    return _get(used, d) / g


def plan(
    projects: Iterable[ProjectState],
    loans: Iterable[Loan],
    past: Iterable[PastLoan],
    now: float,
    policy: Policy = Policy(),
    open_new: bool = True,
) -> Plan:
    """The loans to return and (when ``open_new``) to open in one VDC now. Deterministic for the same input."""
    states = {p.project_id: p for p in projects}
    active = sorted(loans, key=lambda x: (x.started_at, str(x.id)))
    returned: list[Return] = []
    gone: set[Id] = set()

    def give_back(loan: Loan, reason: str, message: str, **figures) -> None:
        returned.append(Return(loan.id, reason, message, {"amount": _figures(loan.amount), **figures}))
        gone.add(loan.id)

    for loan in active:
        if loan.expires_at <= now + EPS:
            give_back(loan, ReturnReason.EXPIRED, f"expired after {(now - loan.started_at) / 60:.0f} min")

    # The lender's own demand first: it takes its guarantee back at once, newest loans first, as much as it needs.
    for lender_id in sorted({x.lender_id for x in active}, key=str):
        p = states.get(lender_id)
        own = [x for x in active if x.lender_id == lender_id and x.id not in gone]
        if p is None or not own:
            continue
        free = _clip(_add(p.guaranteed, _add(p.used, _sum(x.amount for x in own)), -1))
        need = _clip(_add(p.waiting, free, -1))
        for loan in reversed(own):
            if not any(_get(need, d) > EPS and _get(loan.amount, d) > EPS for d in DIMENSIONS):
                continue
            give_back(
                loan,
                ReturnReason.LENDER_DEMAND,
                f"{p.label} has {_fmt(p.waiting)} waiting, {_fmt(need)} more than its unlent guarantee holds",
                lender_waiting=_figures(p.waiting),
                lender_used=_figures(p.used),
            )
            need = _clip(_add(need, loan.amount, -1))

    # The borrower no longer needs it: its work fits under its own limit and its older loans.
    for borrower_id, own in _by_borrower(x for x in active if x.id not in gone).items():
        p = states.get(borrower_id)
        waiting = (p.waiting if p.loanable is None else p.loanable) if p is not None else Resources()
        wanted = _clip(_add(_add(p.used, waiting), p.limit, -1)) if p is not None else Resources()
        for loan in own:
            share = Resources(*(min(_get(wanted, d), _get(loan.amount, d)) for d in ("cpu", "memory_gib", "gpu")))
            wanted = _clip(_add(wanted, share, -1))
            if not _any(share) and now - loan.started_at >= policy.min_lifetime_s - EPS:
                give_back(
                    loan,
                    ReturnReason.BORROWER_IDLE,
                    f"{p.label if p else borrower_id} no longer needs capacity beyond its limit",
                )

    if not open_new:
        return Plan((), tuple(returned))

    remaining = [x for x in active if x.id not in gone]
    lent = {pid: _sum(x.amount for x in remaining if x.lender_id == pid) for pid in states}
    borrowed = {pid: _sum(x.amount for x in remaining if x.borrower_id == pid) for pid in states}
    cooling: dict[tuple[Id, Id], float] = {}
    for x in past:
        key = (x.lender_id, x.borrower_id)
        cooling[key] = max(cooling.get(key, float("-inf")), x.returned_at)
    loans_by_id = {x.id: x for x in active}
    for r in returned:
        x = loans_by_id[r.loan_id]
        cooling[(x.lender_id, x.borrower_id)] = now

    def blocked_extra(p: ProjectState) -> Resources:
        return _clip(_add(_add(p.used, p.blocked), _add(p.limit, borrowed[p.project_id]), -1))

    def lender_util(p: ProjectState, d: str) -> float:
        return _utilisation(_add(p.used, lent[p.project_id]), p.guaranteed, d)

    borrowers = [
        p
        for p in states.values()
        if p.enforce and _any(p.blocked) and not _any(lent[p.project_id]) and _any(blocked_extra(p))
    ]
    borrowers.sort(key=lambda p: (-max(_utilisation(p.used, p.guaranteed, d) for d in DIMENSIONS), str(p.project_id)))
    lenders = [p for p in states.values() if not _any(p.waiting) and not _any(borrowed[p.project_id])]

    opened: list[NewLoan] = []
    for b in borrowers:
        lenders.sort(key=lambda p: (min(lender_util(p, d) for d in DIMENSIONS), str(p.project_id)))
        for lender in lenders:
            if lender.project_id == b.project_id:
                continue
            if now - cooling.get((lender.project_id, b.project_id), float("-inf")) < policy.cooldown_s - EPS:
                continue
            need = blocked_extra(b)
            unused = _clip(_add(lender.guaranteed, _add(lender.used, lent[lender.project_id]), -1))
            amount: dict[str, float] = {}
            gaps: dict[str, dict[str, float]] = {}
            for d in DIMENSIONS:
                if _get(need, d) <= EPS or _get(unused, d) <= EPS:
                    continue
                bu, lu = _utilisation(b.used, b.guaranteed, d), lender_util(lender, d)
                if bu - lu > policy.threshold + EPS:
                    amount[d] = min(_get(need, d), _get(unused, d))
                    gaps[d] = {"borrower": _ratio(bu), "lender": round(lu, 6)}
            # A GPU task blocked on GPUs is helped only by GPUs: cpu or memory alone is not worth a loan then.
            if not amount or (_get(need, "gpu") > EPS and "gpu" not in amount):
                continue
            vec = _vec(**amount)
            figures = {
                "threshold": policy.threshold,
                "utilisation": gaps,
                "borrower_used": _figures(b.used),
                "borrower_guaranteed": _figures(b.guaranteed),
                "borrower_limit": _figures(b.limit),
                "borrower_blocked": _figures(need),
                "lender_used": _figures(lender.used),
                "lender_guaranteed": _figures(lender.guaranteed),
                "lender_unused": _figures(unused),
            }
            reason = "; ".join(
                f"{d.replace('_gib', '')}: {b.label} uses {_pct(g['borrower'])} of its guarantee with "
                f"{_get(need, d):g} {UNITS[d]} waiting beyond its limit, {lender.label} uses {_pct(g['lender'])} "
                f"(gap above {policy.threshold:.0%})"
                for d, g in gaps.items()
            )
            opened.append(
                NewLoan(lender.project_id, b.project_id, vec, now, now + policy.max_duration_s, reason, figures)
            )
            lent[lender.project_id] = _add(lent[lender.project_id], vec)
            borrowed[b.project_id] = _add(borrowed[b.project_id], vec)
            if not _any(blocked_extra(b)):
                break
    return Plan(tuple(opened), tuple(returned))


def _ratio(value: float) -> float | None:
    """A utilisation for the figures: None stands for "no guarantee" (infinite)."""
    return None if value == float("inf") else round(value, 6)


def _pct(value: float | None) -> str:
    return "all (no guarantee)" if value is None else f"{value:.0%}"
