"""Autoscaling of one inference service over days of load (docs/rules.md#autoscaling): every mode next to the
oracle, on several loads and seeds.

Run: ``python -m benchmarks.autoscale_day`` (``--loads``, ``--seeds``, ``--modes``, ``--days``, ``--capacity``,
``--startup``, ``--refit``). Driven through the real code: every ``--interval`` s (5 s, the beat loop's period) the
replica count is decided by :func:`apps.queues.engine.autoscale.decide` with the portal's behaviour (scale up at once,
at most max(2 x n, n + 4) per decision, a 10 % tolerance band, scale down to the highest recommendation of the last 5
minutes), the rate read as the Connect proxy reads it (mean of the last 15 s). The predictive modes do what
``apps.control.autoscaling`` does: the measured rate is averaged into 5-minute buckets, a forecast of the next hour is
made (:func:`apps.queues.engine.forecast.forecast`: Holt-Winters once two days of history exist, seasonal naive
before; refitted every ``--refit`` buckets, 3 by default, to bound the benchmark's run time — the portal refits every
bucket), every bucket keeps the forecast it was given, and the forecast's peak over the next ``--lead`` minutes is
passed to the rules **only while its backtest over the last day beats both "last value" and "same time yesterday"**
(:func:`apps.queues.engine.forecast.backtest`).

Loads (per minute, seeded; each modelled on published statistics of production inference traces, documented so
the figures can be reproduced and compared):

- ``flat``: a production month of GPU inference services as operators describe them (the Alibaba PAI
  inference-serving statistics; most services hold a level for days): a level with 1-2 % noise, slow drift of a
  few percent a day, and rare steps (Poisson, one every two days on average) of -40 % to +60 % lasting 1-8 h.
- ``diurnal``: the daily cycle of interactive inference (Azure LLM inference traces 2023, Azure Functions 2019:
  peak/trough 3-15x, office hours): :func:`daily_shape` with day-to-day factors of 0.9-1.1 and random spikes
  (8 a day, +30 to +100 % for 3-20 minutes).
- ``bursty``: the arrival bursts of LLM serving (Azure LLM inference "conversation" trace, BurstGPT 2024: bursts of
  3-5x the base rate lasting minutes): a Markov-modulated rate, a base level with 2 % noise switching into bursts
  of 2-5x (mean 6 minutes, about 12 an hour at peak hours), on top of a mild daily cycle.
- ``idle``: a rarely used service (Azure Functions 2019: most applications are invoked in sessions with long idle
  gaps): sessions of 20-120 minutes at 5-40 % of the peak separated by idle gaps of 30 minutes to 4 hours with no
  requests at all.

Serving model: each replica (one GPU) serves ``--capacity`` requests/s once it has started, ``--startup`` s after
the decision that asked for it (model load); replicas stop at once on a scale-down. The engine's placement is
assumed to find room. The autoscaler's target is ``--target`` x capacity per replica (headroom). A minute is
**under-provisioned** when at some decision step demand exceeds what the serving replicas serve. **p95 latency**
is over the minutes of the reported day, from the utilisation of the serving replicas (``rho``): a request takes
``--service-ms`` x 1 / (1 - rho) (an M/M/1 mean per replica), ``--timeout`` s when ``rho`` >= 1 (overload).
**Cold starts** count replica starts (each loads the model).

Modes: **oracle** (the replicas the demand needs at the target utilisation, every minute, no start-up: the floor
for GPU-hours), **static** (the reported day's peak demand at the same target utilisation, always on),
**reactive** (the HPA-like rules on the measured rate), **reactive + panic** (the same with the panic window:
the rate of the last 3 s passed too, as the loop passes it; "in panic" is the share of the day's decisions made
in a panic), **reactive + scale to zero** (the same rules, and after ``--zero-after`` s without a request every
replica is released; the next request wakes one replica, ``--startup`` s away, and requests are held until it serves:
their latency is the rest of that wait, a minute with demand and no serving replica is under-provisioned, and
"wakes" counts the cold starts from zero; the oracle keeps at least one replica, so this mode can use fewer
GPU-hours than it), **predictive (seasonal naive)** and **predictive
(Holt-Winters)** (reactive plus the forecast while it earns its place). The table reports the last day of
``--days`` (3 by default: two seasons of history behind it).

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
from dataclasses import dataclass, field

from apps.queues.engine import autoscale as rules
from apps.queues.engine import forecast as fc

from .table import print_table

DAY_MIN = 1440
BUCKET_MIN = 5  # the history's step, as apps.control.autoscaling stores it
SEASON = DAY_MIN // BUCKET_MIN
RATE_WINDOW_S = 15.0  # apps.tasks.request_rate.WINDOW_S
PANIC_WINDOW_S = 3.0  # apps.tasks.request_rate.PANIC_WINDOW_S
PANIC = rules.Behaviour(panic_window_s=PANIC_WINDOW_S, stable_window_s=RATE_WINDOW_S)


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


def flat_per_minute(days: int, seed: int, level: float) -> list[float]:
    """``flat``: a level with 1-2 % noise, a slow drift and rare steps (see the module's docstring)."""
    rng = random.Random(seed)
    noise = rng.uniform(0.01, 0.02)
    out, factor, step_until, step = [], 1.0, -1, 1.0
    for m in range(days * DAY_MIN):
        factor *= 1 + rng.gauss(0.0, 0.03) / DAY_MIN**0.5  # a few percent a day
        if m >= step_until:
            step = 1.0
            if rng.random() < 1 / (2 * DAY_MIN):
                step, step_until = rng.uniform(0.6, 1.6), m + rng.randint(60, 480)
        out.append(max(0.0, level * factor * step * (1 + rng.gauss(0.0, noise))))
    return out


def bursty_per_minute(days: int, seed: int, level: float) -> list[float]:
    """``bursty``: a base rate on a mild daily cycle with Markov-modulated bursts of 2-5x."""
    rng = random.Random(seed)
    out, burst, height = [], 0, 1.0
    for m in range(days * DAY_MIN):
        hour = (m % DAY_MIN) / 60.0
        base = level * (0.6 + 0.4 * daily_shape(hour))
        if burst > 0:
            burst -= 1
        elif rng.random() < 12 / 60 * daily_shape(hour):
            burst, height = max(1, round(rng.expovariate(1 / 6))), rng.uniform(2.0, 5.0)
        out.append(max(0.0, base * (height if burst else 1.0) * (1 + rng.gauss(0.0, 0.02))))
    return out


def idle_per_minute(days: int, seed: int, level: float) -> list[float]:
    """``idle``: sessions of 20-120 minutes at 5-40 % of ``level``, idle gaps of 30 minutes to 4 hours."""
    rng = random.Random(seed)
    out: list[float] = []
    while len(out) < days * DAY_MIN:
        out.extend([0.0] * rng.randint(30, 240))
        rate = level * rng.uniform(0.05, 0.4)
        out.extend(max(0.0, rate * (1 + rng.gauss(0.0, 0.05))) for _ in range(rng.randint(20, 120)))
    return out[: days * DAY_MIN]


def load_of(name: str, days: int, seed: int, peak: float) -> list[float]:
    """The demand per minute (requests/s) of load ``name`` (see the module's docstring)."""
    if name == "flat":
        return flat_per_minute(days, seed, peak * 0.7)
    if name == "diurnal":
        return demand_per_minute(days, seed, peak * 0.07, peak, 8.0)[0]
    if name == "bursty":
        return bursty_per_minute(days, seed, peak * 0.3)
    if name == "idle":
        return idle_per_minute(days, seed, peak)
    raise ValueError(f"unknown load {name!r}: expected one of {', '.join(LOADS)}")


LOADS = ("flat", "diurnal", "bursty", "idle")


@dataclass
class Result:
    load: str
    seed: int
    mode: str
    gpu_hours: float = 0.0
    under_minutes: int = 0
    latencies: list = field(default_factory=list)
    scale_events: int = 0
    cold_starts: int = 0
    forecast_used_share: float = 0.0
    panic_share: float = 0.0
    wakes: int = 0

    @property
    def p95_ms(self) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def latency_ms(demand: float, serving: int, args) -> float:
    """A request's latency at this demand on ``serving`` replicas (the module's docstring: M/M/1 per replica)."""
    if demand <= 0:
        return args.service_ms
    if serving <= 0:
        return args.timeout * 1000
    rho = demand / (serving * args.capacity)
    return args.timeout * 1000 if rho >= 1 else min(args.service_ms / (1 - rho), args.timeout * 1000)


def oracle(load: str, seed: int, demand: list[float], args, report_from: int) -> Result:
    result = Result(load, seed, "oracle")
    per = args.target * args.capacity
    for minute in range(report_from, len(demand)):
        need = max(1, math.ceil(demand[minute] / per - 1e-9))
        result.gpu_hours += need / 60
        result.latencies.append(latency_ms(demand[minute], need, args))
    return result


def simulate(mode: str, load: str, seed: int, demand: list[float], args, report_from_min: int) -> Result:
    """Run one mode over the whole demand; figures are counted from ``report_from_min`` on."""
    step = args.interval
    steps_per_min = round(60 / step)
    per = args.target * args.capacity
    targets = rules.Targets(min_replicas=1, max_replicas=args.max_replicas, rps_per_replica=per)
    static = max(1, math.ceil(max(demand[report_from_min:]) / per - 1e-9)) if mode == "static" else None
    serving_at: list[float] = [0.0] * (static or 1)  # start times of replicas (started or starting)
    history: tuple = ()
    buckets: list[float] = []  # measured rate per closed bucket
    given: list[float | None] = []  # the forecast each closed bucket was given
    bucket_sum, bucket_n = 0.0, 0
    plan: fc.Forecast | None = None
    plan_from = 0  # the bucket index plan.values[0] is for
    earns = False
    decisions_counted = decisions_with_forecast = decisions_in_panic = 0
    result = Result(load, seed, mode)
    zero = mode == "reactive zero"
    last_request = 0.0  # when the proxy last saw a request (scale to zero)
    under_minute = -1
    horizon = args.lead // BUCKET_MIN + 1 + args.refit
    for i in range(len(demand) * steps_per_min):
        now = i * step
        minute = i // steps_per_min
        counted = minute >= report_from_min
        if static is None:
            back = [demand[max(0, (i - k) // steps_per_min)] for k in range(round(RATE_WINDOW_S / step))]
            measured = sum(back) / len(back)
            recent = back[: max(1, round(PANIC_WINDOW_S / step))]
            panic_rps = sum(recent) / len(recent) if mode == "reactive panic" else None
            bucket_sum, bucket_n = bucket_sum + measured, bucket_n + 1
            if i % (BUCKET_MIN * steps_per_min) == 0 and i:
                buckets.append(bucket_sum / bucket_n)
                bucket_sum, bucket_n = 0.0, 0
                if mode.startswith("predictive"):
                    index = len(buckets)  # the bucket that opens now
                    offset = index - plan_from
                    given.append(
                        plan.values[offset - 1] if plan is not None and 0 < offset <= len(plan.values) else None
                    )
                    if plan is None or offset >= args.refit:
                        if mode.endswith("naive"):
                            plan = fc.seasonal_naive(buckets, SEASON, horizon)
                        else:
                            plan = fc.forecast(buckets, SEASON, horizon)
                        plan_from = index
                    window = 2 * SEASON
                    earns = fc.backtest(buckets[-window:], given[-window:], SEASON).earns_place
            if demand[minute] > 0:
                last_request = now
            if zero and not serving_at:
                # Asleep: nothing decides until a request comes; the activator then wakes one replica and holds the
                # requests until it serves (docs/tasks.md "Scale to zero").
                if demand[minute] > 0:
                    serving_at = [now + args.startup]
                    history = ()
                    if counted:
                        result.scale_events += 1
                        result.cold_starts += 1
                        result.wakes += 1
                if counted:
                    result.gpu_hours += len(serving_at) * step / 3600
                    if demand[minute] > 0 and under_minute != minute:
                        under_minute = minute
                        result.under_minutes += 1
                    if i % steps_per_min == steps_per_min - 1:
                        result.latencies.append(latency_ms(demand[minute], 0, args))
                continue
            ahead = None
            if plan is not None and earns:
                offset = len(buckets) - plan_from
                ahead = max(plan.values[offset : offset + math.ceil(args.lead / BUCKET_MIN)], default=None)
            current = len(serving_at)
            metrics = rules.Metrics(rps=measured, panic_rps=panic_rps)
            behaviour = PANIC if panic_rps is not None else rules.DEFAULT
            d = rules.decide(targets, current, metrics, history, now, behaviour, forecast_rps=ahead)
            if counted and panic_rps is not None:
                decisions_counted += 1
                decisions_in_panic += any(r.panic for r in d.history if r.at >= now - RATE_WINDOW_S)
            history = d.history
            if counted and mode.startswith("predictive"):
                decisions_counted += 1
                decisions_with_forecast += ahead is not None
            if d.desired != current:
                if counted:
                    result.scale_events += 1
                if d.desired > current:
                    serving_at += [now + args.startup] * (d.desired - current)
                    if counted:
                        result.cold_starts += d.desired - current
                else:
                    serving_at = sorted(serving_at)[: d.desired]  # the newest replicas go first
            if zero and now - last_request >= args.zero_after:
                serving_at = []  # idle for its whole idle time: every card released
                history = ()
                if counted:
                    result.scale_events += 1
        serving = sum(1 for s in serving_at if s <= now)
        if counted:
            result.gpu_hours += len(serving_at) * step / 3600
            if demand[minute] > serving * args.capacity and under_minute != minute:
                under_minute = minute
                result.under_minutes += 1
            if i % steps_per_min == steps_per_min - 1:
                if serving == 0 and serving_at and demand[minute] > 0:
                    # Held by the activator until the woken replica serves (at most the timeout).
                    wait_ms = (min(serving_at) - now) * 1000 + args.service_ms
                    result.latencies.append(min(wait_ms, args.timeout * 1000))
                else:
                    result.latencies.append(latency_ms(demand[minute], serving, args))
    if decisions_counted:
        result.forecast_used_share = decisions_with_forecast / decisions_counted
        result.panic_share = decisions_in_panic / decisions_counted
    return result


MODES = ("static", "reactive", "reactive panic", "reactive zero", "predictive naive", "predictive holt-winters")
LABELS = {
    "oracle": "oracle",
    "static": "static",
    "reactive": "reactive",
    "reactive panic": "reactive + panic",
    "reactive zero": "reactive + scale to zero",
    "predictive naive": "predictive (seasonal naive)",
    "predictive holt-winters": "predictive (Holt-Winters)",
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
        ["load step to decision s", "decision to new replica serving s", "reaction time s", "target", "met"],
        [
            [
                figures["decision_s"],
                figures["decision_to_serving_s"],
                figures["reaction_s"],
                "< 30 s",
                "yes" if figures["reaction_s"] < 30 else "no",
            ]
        ],
    )
    return figures


def run(argv: list[str] | None = None) -> list[Result]:
    """Simulate every mode on every load and seed and print one table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loads", default=",".join(LOADS), help=f"comma-separated, of {', '.join(LOADS)}")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    p.add_argument("--days", type=int, default=3)
    p.add_argument("--peak", type=float, default=300.0, help="requests/s at the load's peak level (before bursts)")
    p.add_argument("--capacity", type=float, default=20.0, help="requests/s one replica serves")
    p.add_argument("--target", type=float, default=0.8, help="autoscaler target, a fraction of the capacity")
    p.add_argument("--startup", type=float, default=180.0, help="seconds from decision to a replica serving")
    p.add_argument("--lead", type=int, default=10, help="minutes ahead the forecast looks (>= start-up + a step)")
    p.add_argument("--refit", type=int, default=3, help="buckets between two forecast fits (the portal: 1)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between decisions")
    p.add_argument("--service-ms", type=float, default=200.0, help="a request's latency on an idle replica")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a request waits at most (overload)")
    p.add_argument("--max-replicas", type=int, default=60)
    p.add_argument(
        "--zero-after", type=float, default=300.0, help="scale to zero: seconds without a request before it sleeps"
    )
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--reaction", action="store_true", help="measure the reaction time on the local cluster instead")
    args = p.parse_args(argv)
    if args.reaction:
        reaction()
        return []
    results = []
    rows = []
    for load in args.loads.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            demand = load_of(load, args.days, seed, args.peak)
            report_from = (args.days - 1) * DAY_MIN
            best = oracle(load, seed, demand, args, report_from)
            modes = [m for m in MODES if m in args.modes.split(",")]
            group = [best] + [simulate(mode, load, seed, demand, args, report_from) for mode in modes]
            results.extend(group)
            for r in group:
                rows.append(
                    [
                        load,
                        seed,
                        LABELS[r.mode],
                        round(r.gpu_hours, 1),
                        round(r.gpu_hours / best.gpu_hours, 3),
                        r.under_minutes,
                        round(r.p95_ms),
                        r.scale_events,
                        r.cold_starts,
                        f"{r.forecast_used_share:.0%}" if r.mode.startswith("predictive") else "-",
                        f"{r.panic_share:.1%}" if r.mode == "reactive panic" else "-",
                        r.wakes if r.mode == "reactive zero" else "-",
                    ]
                )
    print(
        f"Day {args.days} of {args.days}: {args.capacity:g} req/s per replica (1 GPU), target {args.target:.0%}, "
        f"start-up {args.startup:g} s, decisions every {args.interval:g} s, forecast {args.lead} min ahead "
        f"(refit every {args.refit} buckets), latency {args.service_ms:g} ms idle / {args.timeout:g} s overloaded"
    )
    print_table(
        [
            "load",
            "seed",
            "mode",
            "GPU-hours",
            "x oracle",
            "under-provisioned min",
            "p95 ms",
            "scale events",
            "cold starts",
            "forecast used",
            "in panic",
            "wakes",
        ],
        rows,
    )
    return results


if __name__ == "__main__":
    run()
