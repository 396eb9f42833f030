"""Run every benchmark in one go: ``python -m benchmarks.run_all`` (about 5 minutes on 2 cores; the autoscaling
day's Holt-Winters fits take about a minute of it)."""

from __future__ import annotations

import time

from . import autoscale_day, engine_speed, placement_quality, rebalance, trace_replay


def main() -> None:
    """Engine speed, placement quality (inflation), the trace replay, the autoscaling day and the rebalancer's
    two-project replay, one table each (the last two with their own defaults, the replay on mixed work only)."""
    t0 = time.perf_counter()
    for title, fn in (
        ("Engine speed (synthetic reference VDC)", engine_speed.run),
        ("Placement quality (openb, inflation)", placement_quality.run),
        ("Trace replay (openb, fifo / drf / backfill)", trace_replay.run),
        ("Autoscaling day (static / reactive / predictive)", lambda: autoscale_day.run([])),
        ("Rebalancer two-project replay (mixed work)", lambda: rebalance.main(["--classes", "mixed"])),
    ):
        print(f"== {title} ==")
        fn()
    print(f"all benchmarks: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
