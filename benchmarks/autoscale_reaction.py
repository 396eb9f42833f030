"""The autoscaler's reaction time through the real worker pools, quiet and with the machine busy
(docs/rules.md#autoscaling: from a step in a service's load to a new replica serving, under 30 s p95, measured
with the machine busy).

    python -m benchmarks.autoscale_reaction [--runs 10] [--busy-procs 2xcores] [--limit 120] [--keep]

Starts a whole portal of separate processes, as ``make run`` does (the harness of the whole-portal tests,
``tests/control/portal_processes.py``): the web server, the three Celery pools (``scheduling``, ``autoscale``,
``default``: ``WORKER_POOLS`` of the runportal command) and beat, on the embedded default (a redis-server of its
own, SQLite in a temporary directory) or on ``DATABASE_URL`` (a database of its own on that PostgreSQL server)
and ``REDIS_URL`` when set (that Redis must be this portal's alone: its workers take the jobs queued there).
The scheduling interval is the production default; nothing is called by hand: beat runs the autoscaler pass every
5 s on the ``autoscale`` pool, the cycle and launches run on ``scheduling``, the reconciliation on ``default``.

Each run submits through the REST API an inference service on the seeded local cluster (one card a replica,
``autoscale_min`` 1, ``autoscale_max`` 2, ``autoscale_rps`` ``--target-rps``: a small ``http.server`` whose answer
names the cards of the replica that served it), waits until it answers through Connect's app host
(``<task>-8000.<HCS_APPS_DOMAIN>``, with the app cookie the hand-over sets), then steps the load from nothing to
``--step`` x one replica's target (the generator sends at fixed instants from a thread pool; the rate it achieved
is printed) at a random moment of beat's 5 s period, and measures the time from the step's start to the first
answer of the second replica, split into step -> decision (the service's ``autoscaled`` event) and decision ->
serving. The load then stops and the service is stopped; the next run submits a new one (faster than waiting out
the 5-minute scale-down window, and the same start from one replica).

Two conditions, interleaved run by run (quiet first in even rounds, busy first in odd ones): **quiet**, and
**busy**: ``--busy-procs`` Python busy loops (2 per core by default) at plain priority, like a competing batch
job that is not niced, running from before the service is submitted until its run ends. A run whose second
replica does not serve within ``--limit`` s counts as ``--limit`` (and is marked). Each run's line also counts
the answers other than 200 by status; every run's figures and the timeline of its task events after the step go
to ``--out`` (JSON) too. Figures: docs/tasks.md, "Reaction time through the worker pools".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import requests

from benchmarks.table import print_table

# Answers every GET with the cards its replica was given (as tests/control/test_autoscaling_local.py's service), so
# the load generator sees which replica served it.
SERVICE = r"""
cat > serve.py <<'PY'
import http.server, os
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("cards=" + os.environ.get("CUDA_VISIBLE_DEVICES", "")).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", PORT_NUMBER), Handler).serve_forever()
PY
exec python3 serve.py
""".replace("PORT_NUMBER", "8000")

TARGET = 30.0  # docs/rules.md#autoscaling: p95 of the reaction time
PORT = 8000
BEAT_S = 5.0  # apps.control.autoscaling.INTERVAL_S


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) with linear interpolation between the closest ranks."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


class Busy:
    """``n`` Python busy loops at plain priority (each its own process)."""

    def __init__(self, n: int):
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait(10)


class Load:
    """Requests to the service's app host at ``rate`` per second, each sent at its own instant from a pool of
    threads (one HTTP session each), until stopped. Keeps when each request started and what it answered."""

    def __init__(self, url: str, host: str, cookies: dict[str, str], rate: float, threads: int = 48):
        self.url, self.host, self.cookies, self.rate = url, host, cookies, rate
        self.pool = ThreadPoolExecutor(threads)
        self.local = threading.local()
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.started: list[float] = []
        self.answers: list[tuple[float, int, str]] = []  # (monotonic time answered, status, body)
        self.first_new: float | None = None
        self.known: str = ""

    def _session(self) -> requests.Session:
        if not hasattr(self.local, "session"):
            session = requests.Session()
            session.headers["Host"] = self.host
            session.cookies.update(self.cookies)
            self.local.session = session
        return self.local.session

    def _one(self) -> None:
        begun = time.monotonic()
        with self.lock:
            self.started.append(begun)
        try:
            answer = self._session().get(self.url, timeout=10)
            status, body = answer.status_code, answer.text
        except requests.RequestException as exc:
            status, body = 0, type(exc).__name__
        done = time.monotonic()
        with self.lock:
            self.answers.append((done, status, body))
            if status == 200 and body != self.known and self.first_new is None:
                self.first_new = done

    def run(self, t0: float) -> None:
        """Send from ``t0`` on (monotonic) until :meth:`stop`; call in a thread of its own."""
        sent = 0
        while not self.stopped.is_set():
            due = t0 + sent / self.rate
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, 0.05))
                continue
            self.pool.submit(self._one)
            sent += 1

    def stop(self) -> None:
        self.stopped.set()
        self.pool.shutdown(wait=True, cancel_futures=True)

    def achieved(self, t0: float, t1: float) -> float:
        """Requests started per second between ``t0`` and ``t1``."""
        with self.lock:
            n = sum(1 for at in self.started if t0 <= at < t1)
        return n / (t1 - t0) if t1 > t0 else 0.0


class Bench:
    def __init__(self, portal, args):
        self.portal, self.args = portal, args

    def app(self, task_id: int) -> tuple[str, str, dict[str, str]]:
        """The service's URL (the portal's address, asked for the app host's name), that name, and the app cookie
        the hand-over sets: a Connect ticket from the REST API, redeemed once at the app host."""
        answer = self.portal.api("post", f"tasks/{task_id}/connect-ticket/", json={"port": PORT})
        answer.raise_for_status()
        ticket = urlsplit(answer.json()["url"])
        host = ticket.hostname
        redeemed = requests.get(
            f"{self.portal.url}{ticket.path}?{ticket.query}", headers={"Host": host}, allow_redirects=False, timeout=30
        )
        cookies = dict(redeemed.cookies)
        if not cookies:
            raise RuntimeError(f"the ticket of task {task_id} set no cookie: {redeemed.status_code} {redeemed.text}")
        return f"{self.portal.url}/", host, cookies

    def submit(self, name: str) -> int:
        body = {
            "project": "multi",
            "queue": "high",
            "name": name,
            "kind": "inference",
            "gpu_spec": "1(A100)",
            "cpu": "1",
            "memory_gib": "1",
            "port": PORT,
            "command": SERVICE,
            "autoscale_min": 1,
            "autoscale_max": 2,
            "autoscale_rps": self.args.target_rps,
        }
        answer = self.portal.api("post", "tasks/", json=body)
        if answer.status_code != 201:
            raise RuntimeError(f"submit refused: {answer.status_code} {answer.text[:500]}")
        return answer.json()["id"]

    def serving(self, url: str, host: str, cookies: dict[str, str], task_id: int, within: float = 120.0) -> str:
        """Wait until the service answers through its app host; its first answer (the first replica's cards)."""
        session = requests.Session()
        session.headers["Host"] = host
        session.cookies.update(cookies)
        deadline = time.monotonic() + within
        while True:
            try:
                answer = session.get(url, timeout=5)
                if answer.status_code == 200 and answer.text.startswith("cards="):
                    return answer.text
                last = f"{answer.status_code} {answer.text[:200]}"
            except requests.RequestException as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"task {task_id} did not answer within {within:g} s: {last}")
            time.sleep(0.5)

    def events(self, task_id: int) -> list[dict]:
        answer = self.portal.api("get", f"tasks/{task_id}/events/", params={"page_size": 200})
        answer.raise_for_status()
        data = answer.json()
        return data["results"] if isinstance(data, dict) else data

    def run(self, index: int, condition: str) -> dict:
        task_id = self.submit(f"reaction-{index}-{condition}")
        try:
            self.portal.wait_for(task_id, ("running",), within=180)
            url, host, cookies = self.app(task_id)
            first = self.serving(url, host, cookies, task_id)
            load = Load(url, host, cookies, self.args.step * self.args.target_rps)
            load.known = first
            # A random phase against beat's period: a real step does not wait for the autoscaler's pass.
            time.sleep(random.uniform(0, BEAT_S))
            wall0, t0 = time.time(), time.monotonic()
            sender = threading.Thread(target=load.run, args=(t0,), daemon=True)
            sender.start()
            while load.first_new is None and time.monotonic() - t0 < self.args.limit:
                time.sleep(0.05)
            t1 = time.monotonic()
            load.stop()
            sender.join(10)
            served = load.first_new
            reaction = (served - t0) if served is not None else self.args.limit
            timeline = []
            decided = None
            for event in self.events(task_id):
                at = datetime.fromisoformat(event["created_at"].replace("Z", "+00:00")).timestamp() - wall0
                if at >= -1:
                    timeline.append((round(at, 2), event["kind"], event["message"][:120]))
                if decided is None and event["kind"] == "autoscaled" and (event["data"] or {}).get("desired") == 2:
                    decided = at
            errors = Counter(str(status) for _, status, _ in load.answers if status != 200)
            return {
                "condition": condition,
                "task": task_id,
                "reaction_s": round(reaction, 2),
                "served": served is not None,
                "decision_s": round(decided, 2) if decided is not None else None,
                "decision_to_serving_s": round(reaction - decided, 2) if decided is not None else None,
                "achieved_rps": round(load.achieved(t0, t1), 2),
                "wanted_rps": self.args.step * self.args.target_rps,
                "errors": dict(errors),  # answers other than 200 by status (0: no answer)
                "answers": len(load.answers),
                "timeline": timeline,
            }
        finally:
            self.portal.api("post", f"tasks/{task_id}/stop/", json={})
            try:
                self.portal.wait_for(task_id, ("stopped", "completed", "failed"), within=60)
            except AssertionError as exc:
                print(f"  (task {task_id} not stopped yet: {exc})", flush=True)


def summary(runs: list[dict]) -> list[list]:
    rows = []
    for condition in ("quiet", "busy"):
        these = [r for r in runs if r["condition"] == condition]
        if not these:
            continue
        reaction = [r["reaction_s"] for r in these]
        decision = [r["decision_s"] for r in these if r["decision_s"] is not None]
        serving = [r["decision_to_serving_s"] for r in these if r["decision_to_serving_s"] is not None]

        def three(values):
            if not values:
                return ["-", "-", "-"]
            return [round(percentile(values, 0.5), 1), round(percentile(values, 0.95), 1), round(max(values), 1)]

        p95 = percentile(reaction, 0.95)
        missed = sum(1 for r in these if not r["served"])
        rows.append(
            [
                condition,
                len(these),
                *three(reaction),
                *three(decision),
                *three(serving),
                f"{statistics.mean(r['achieved_rps'] for r in these):.1f}/{these[0]['wanted_rps']:g}",
                ("yes" if p95 < TARGET and not missed else "no") + (f" ({missed} unserved)" if missed else ""),
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per condition")
    parser.add_argument("--busy-procs", type=int, default=2 * (os.cpu_count() or 1))
    parser.add_argument("--target-rps", type=float, default=5.0, help="the service's requests/s per replica")
    parser.add_argument("--step", type=float, default=3.0, help="the load after the step, in targets of one replica")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds a run waits for the second replica")
    parser.add_argument("--conditions", default="quiet,busy")
    parser.add_argument("--out", default="", help="write every run's figures (JSON) here")
    parser.add_argument("--keep", action="store_true", help="keep the portal's logs and database")
    args = parser.parse_args()

    from tests.control.portal_processes import Portal, RedisServer

    workdir = Path(tempfile.mkdtemp(prefix="hcs-reaction-"))
    (workdir / "portal").mkdir()
    server = None
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url:
        (workdir / "redis").mkdir()
        server = RedisServer(workdir / "redis")
        server.start()
        redis_url = server.url
    # The production scheduling interval (the harness's tests use 1 s).
    portal = Portal(workdir / "portal", redis_url, env={"HCS_SCHEDULER_INTERVAL_S": "2"})
    runs: list[dict] = []
    try:
        portal.setup()
        portal.start("web", "scheduler", "autoscaler", "default", "beat")
        bench = Bench(portal, args)
        conditions = args.conditions.split(",")
        print(f"portal at {portal.url}, files in {workdir}; {args.busy_procs} busy loops when busy", flush=True)
        for index in range(args.runs):
            order = conditions if index % 2 == 0 else conditions[::-1]
            for condition in order:
                if condition == "busy":
                    with Busy(args.busy_procs):
                        result = bench.run(index, condition)
                else:
                    result = bench.run(index, condition)
                runs.append(result)
                shown = {k: v for k, v in result.items() if k != "timeline"}
                print(json.dumps(shown), flush=True)
                for at, kind, message in result["timeline"]:
                    print(f"    {at:7.2f} s {kind:<12} {message}", flush=True)
    finally:
        if args.out:
            Path(args.out).write_text(json.dumps(runs, indent=1))
        try:
            portal.stop()
        finally:
            if server is not None:
                server.kill()
            if args.keep:
                print(f"logs of the portal's processes: {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(
        f"Autoscaler reaction through the worker pools: load 0 -> {args.step:g} x {args.target_rps:g} req/s, "
        f"target < {TARGET:g} s p95\n"
    )
    print_table(
        [
            "condition",
            "runs",
            "reaction p50 s",
            "p95",
            "max",
            "step->decision p50 s",
            "p95",
            "max",
            "decision->serving p50 s",
            "p95",
            "max",
            "achieved/wanted req/s",
            f"met (<{TARGET:g} s p95)",
        ],
        summary(runs),
    )


if __name__ == "__main__":
    main()
