"""Run every benchmark in one go: ``python -m benchmarks.run_all`` (about 3 minutes on 2 cores)."""

from __future__ import annotations

import time

from . import engine_speed, placement_quality, trace_replay


def main() -> None:
    """Engine speed, placement quality (inflation) and the trace replay, one table each."""
    t0 = time.perf_counter()
    for title, fn in (
        ("Engine speed (synthetic reference VDC)", engine_speed.run),
        ("Placement quality (openb, inflation)", placement_quality.run),
        ("Trace replay (openb, fifo / drf / backfill)", trace_replay.run),
    ):
        print(f"== {title} ==")
        fn()
    print(f"all benchmarks: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
