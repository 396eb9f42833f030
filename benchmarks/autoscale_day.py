"""Autoscaling of one inference service over synthetic days of load (issue 12, seed 003): static, reactive,
predictive.

Run: ``python -m benchmarks.autoscale_day`` (``--days``, ``--seed``, ``--capacity``, ``--startup``). Driven
through the real code: every ``--interval`` s (5 s, the beat loop's period) the replica count is decided by
:func:`apps.queues.engine.autoscale.decide` with the same behaviour as the portal's loop (scale up at once, at
most max(2 x n, n + 4) per decision, scale down to the highest recommendation of the last 5 minutes), the rate
read as the Connect proxy reads it (mean of the last 15 s); the predictive modes also pass the peak of
:func:`apps.queues.engine.forecast.forecast` over the next ``--lead`` minutes, refitted on 5-minute buckets of
the measured rate at each new bucket, as ``apps.control.autoscaling`` does.

Load generator (seeded, documented so the figures can be reproduced): per minute,
``demand = trough + (peak - trough) x shape(hour) x day_factor + noise`` where ``shape`` (:func:`daily_shape`)
is a smooth daily cycle (``(1 - cos)/2`` raised to 1.5, low at 04:00) plus office hours that start steeply
at 08:45 and a scheduled batch at 13:00-13:30, ``day_factor`` is uniform in [0.9, 1.1] per day (times
``(1 + --growth)`` per day), noise is Gaussian (5 % of the level), plus random spikes (Poisson, ``--spikes``
a day, each +30 to +100 % of the level for 3 to 20 minutes, ramping up over 2 minutes: no history predicts
them).

Serving model: each replica (one GPU) serves ``--capacity`` requests/s once it has started, ``--startup`` s
after the decision that asked for it (image pulled, model loaded); replicas stop at once on a scale-down. The
engine's placement is assumed to find room (the service's queue class and quota are not the question here).
The autoscaler's target is ``--target`` x capacity per replica (headroom, as an operator sets it). An **SLO
violation minute** is a minute in which, at some decision step, demand exceeds the capacity of the replicas serving.

Modes: **static at peak** (the whole run's peak demand / capacity replicas, always on), **reactive** (the
HPA-like rules on the measured rate), **predictive (seasonal naive)** and **predictive (Holt-Winters)**:
reactive plus the forecast (Holt-Winters needs two days of history; before that it falls back to seasonal
naive). The table reports the last day (by default day 3: two seasons of history behind it).

``--reaction`` measures instead, on the local cluster with real processes, the time from a step in a service's
load to a new replica serving (:func:`reaction`; the test environment's DATABASE_URL and REDIS_URL).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from apps.queues.engine import autoscale as rules
from apps.queues.engine import forecast as fc

from .table import print_table

DAY_MIN = 1440
BUCKET_MIN = 5  # the history's step, as apps.control.autoscaling stores it
SEASON = DAY_MIN // BUCKET_MIN
RATE_WINDOW_S = 15.0  # apps.tasks.request_rate.WINDOW_S


def daily_shape(hour: float) -> float:
    """The day's load between 0 (night) and 1 (peak): a smooth daily cycle (low at 04:00, high at 16:00),
    office hours that start steeply at 08:45 (10 % to 90 % in about 20 minutes) and end slowly after 18:00,
    and a scheduled batch at 13:00-13:30 (the same every day, so history can see it coming)."""
    cycle = ((1 - math.cos(2 * math.pi * (hour - 4.0) / 24.0)) / 2) ** 1.5
    office = 1 / (1 + math.exp(-(hour - 8.75) * 12)) / (1 + math.exp((hour - 18.5) * 3))
    batch = 0.5 / (1 + math.exp(-(hour - 13.0) * 30)) / (1 + math.exp((hour - 13.5) * 30))
    return min(1.0, 0.3 * cycle + 0.55 * office + batch)


def demand_per_minute(
    days: int, seed: int, trough: float, peak: float, spikes_per_day: float, growth: float = 0.0
) -> tuple[list[float], list[bool]]:
    """The offered load (requests/s) of each minute of ``days`` synthetic days, and whether a random spike
    is on in that minute."""
    rng = random.Random(seed)
    out, spiking = [], []
    for day in range(days):
        factor = rng.uniform(0.9, 1.1) * (1 + growth) ** day
        level = []
        for m in range(DAY_MIN):
            base = trough + (peak - trough) * daily_shape(m / 60.0) * factor
            level.append(max(0.0, base + rng.gauss(0.0, 0.05 * base)))
        extra = [0.0] * DAY_MIN
        t = rng.expovariate(spikes_per_day / DAY_MIN) if spikes_per_day > 0 else DAY_MIN
        while t < DAY_MIN:
            start, length, height = int(t), rng.randint(3, 20), rng.uniform(0.3, 1.0)
            for k in range(length):
                if start + k < DAY_MIN:
                    extra[start + k] = max(extra[start + k], height * min(1.0, (k + 1) / 2))
            t += rng.expovariate(spikes_per_day / DAY_MIN)
        out.extend(v * (1 + e) for v, e in zip(level, extra, strict=True))
        spiking.extend(e > 0 for e in extra)
    return out, spiking


@dataclass
class Result:
    mode: str
    gpu_hours: float = 0.0
    violation_minutes: int = 0
    in_spikes: int = 0
    scale_events: int = 0
    peak_replicas: int = 0
    methods: set | None = None


def simulate(mode: str, demand: list[float], spiking: list[bool], args, report_from_min: int) -> Result:
    """Run one mode over the whole demand; figures are counted from ``report_from_min`` on."""
    step = args.interval
    steps_per_min = round(60 / step)
    targets = rules.Targets(min_replicas=1, max_replicas=args.max_replicas, rps_per_replica=args.target * args.capacity)
    static = math.ceil(max(demand) / args.capacity) if mode == "static" else None
    serving_at: list[float] = [0.0] * (static or 1)  # start times of replicas (started or starting)
    history: tuple = ()
    buckets: list[float] = []
    bucket_sum, bucket_n = 0.0, 0
    plan: fc.Forecast | None = None
    result = Result(mode, methods=set())
    violated_minute = -1
    for i in range(len(demand) * steps_per_min):
        now = i * step
        minute = i // steps_per_min
        rate_now = demand[minute]
        counted = minute >= report_from_min
        if static is None:
            # The proxy's rate: the mean of the last RATE_WINDOW_S of offered load.
            back = [demand[max(0, (i - k) // steps_per_min)] for k in range(round(RATE_WINDOW_S / step))]
            measured = sum(back) / len(back)
            bucket_sum, bucket_n = bucket_sum + measured, bucket_n + 1
            if i % (BUCKET_MIN * steps_per_min) == 0 and i:
                buckets.append(bucket_sum / bucket_n)
                bucket_sum, bucket_n = 0.0, 0
                if mode.startswith("predictive"):
                    if mode.endswith("naive"):
                        plan = fc.seasonal_naive(buckets, SEASON, args.lead // BUCKET_MIN + 1)
                    else:
                        plan = fc.forecast(buckets, SEASON, args.lead // BUCKET_MIN + 1)
            ahead = None
            if plan is not None:
                ahead = plan.peak(math.ceil(args.lead / BUCKET_MIN))
                if counted:
                    result.methods.add(plan.method)
            current = len(serving_at)
            d = rules.decide(targets, current, rules.Metrics(rps=measured), history, now, forecast_rps=ahead)
            history = d.history
            if d.desired != current:
                if counted:
                    result.scale_events += 1
                if d.desired > current:
                    serving_at += [now + args.startup] * (d.desired - current)
                else:
                    serving_at = sorted(serving_at)[: d.desired]  # the newest replicas go first
        serving = sum(1 for s in serving_at if s <= now)
        if counted:
            result.gpu_hours += len(serving_at) * step / 3600
            result.peak_replicas = max(result.peak_replicas, len(serving_at))
            if rate_now > serving * args.capacity and violated_minute != minute:
                violated_minute = minute
                result.violation_minutes += 1
                result.in_spikes += spiking[minute]
    return result


MODES = ("static", "reactive", "predictive naive", "predictive holt-winters")
LABELS = {
    "static": "static at peak",
    "reactive": "reactive",
    "predictive naive": "reactive + predictive (seasonal naive)",
    "predictive holt-winters": "reactive + predictive (Holt-Winters)",
}


def reaction() -> dict:
    """Measure the reaction time on the local cluster: runs the end-to-end test
    ``tests/control/test_autoscaling_reaction_local.py`` (needs the test environment: DATABASE_URL, REDIS_URL)
    and prints its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "reaction.json")
        test = "tests/control/test_autoscaling_reaction_local.py"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
            env={**os.environ, "HCS_REACTION_OUT": out},
            capture_output=True,
            text=True,
        )
        if not os.path.exists(out):
            sys.exit(f"the reaction test gave no figures (rc {done.returncode}):\n{done.stdout[-3000:]}")
        with open(out) as f:
            figures = json.load(f)
    print(
        f"Local cluster: load steps from 0 to {figures['step_rps']} req/s (target {figures['target_rps']} per "
        f"replica, 1 replica) just after an autoscaler pass (beat every {figures['beat_s']:g} s, rate over "
        f"{figures['rate_window_s']} s)"
    )
    print_table(
        ["load step to decision s", "decision to new replica serving s", "reaction time s", "seed 003 target"],
        [[figures["decision_s"], figures["decision_to_serving_s"], figures["reaction_s"], "< 30 s"]],
    )
    return figures


def run(argv: list[str] | None = None) -> list[Result]:
    """Simulate every mode and print the table of the last day."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--days", type=int, default=3)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--trough", type=float, default=20.0, help="requests/s at night")
    p.add_argument("--peak", type=float, default=300.0, help="requests/s at the daily peak (before spikes)")
    p.add_argument("--spikes", type=float, default=8.0, help="spikes a day")
    p.add_argument("--growth", type=float, default=0.0, help="day-on-day growth of the load (0.2: +20 %% a day)")
    p.add_argument("--capacity", type=float, default=20.0, help="requests/s one replica serves")
    p.add_argument("--target", type=float, default=0.8, help="autoscaler target, a fraction of the capacity")
    p.add_argument("--startup", type=float, default=180.0, help="seconds from decision to a replica serving")
    p.add_argument("--lead", type=int, default=10, help="minutes ahead the forecast looks (>= start-up + a step)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between decisions")
    p.add_argument("--max-replicas", type=int, default=40)
    p.add_argument("--reaction", action="store_true", help="measure the reaction time on the local cluster instead")
    args = p.parse_args(argv)
    if args.reaction:
        reaction()
        return []
    demand, spiking = demand_per_minute(args.days, args.seed, args.trough, args.peak, args.spikes, args.growth)
    report_from = (args.days - 1) * DAY_MIN
    results = []
    for mode in MODES:
        t0 = time.perf_counter()
        r = simulate(mode, demand, spiking, args, report_from)
        r.seconds = time.perf_counter() - t0
        results.append(r)
    day = demand[report_from:]
    print(
        f"Day {args.days} of {args.days} (seed {args.seed}): demand {min(day):.0f}-{max(day):.0f} req/s, "
        f"{args.capacity:g} req/s per replica (1 GPU), target {args.target:.0%}, start-up {args.startup:g} s, "
        f"decisions every {args.interval:g} s, forecast {args.lead} min ahead"
    )
    print_table(
        [
            "mode",
            "GPU-hours",
            "SLO-violation min",
            "of which in spikes",
            "scale events",
            "peak replicas",
            "forecast",
            "sim s",
        ],  # fmt: skip
        [
            [
                LABELS[r.mode],
                round(r.gpu_hours, 1),
                r.violation_minutes,
                r.in_spikes,
                r.scale_events,
                r.peak_replicas,
                ", ".join(sorted(r.methods)) or "-",
                round(r.seconds, 1),
            ]
            for r in results
        ],
    )
    return results


if __name__ == "__main__":
    run()
