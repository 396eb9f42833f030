"""Reaction of the portal's autoscaler on the local cluster: from a step in the load a service gets, through the
proxy's request counting, the beat's autoscaler passes, the scheduling cycle and the reconciliation, to a new
replica answering requests.

``python -m benchmarks.autoscale_day --reaction`` runs this test and prints its figures against the target
(docs/rules.md#autoscaling: under 30 s). The test itself holds the behaviour (a second replica serves, within
``LIMIT_S``), not the target: on a machine busy with the rest of the suite the seconds stretch.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from apps.control import autoscaling
from apps.control.scheduling import run_cycle
from apps.tasks import request_rate
from apps.tasks.services import stop_task
from tests.control.drive import reconcile_all, wait_status
from tests.control.test_autoscaling_local import PORT, get, get_when_up, local_jobs_dir, start  # noqa: F401
from tests.portal.apps_host import app_clients

pytestmark = pytest.mark.django_db(transaction=True)

TARGET_RPS = 5  # per replica
STEP_RPS = 15  # the load steps from nothing to 3 x the target of the one replica
LIMIT_S = 180.0  # the behaviour, generously: the 30 s target is the benchmark's (docs/tasks.md)


def test_a_load_step_gets_a_new_replica_serving(world):
    svc = start(world, "svc", "high", autoscale_max=2, autoscale_rps=TARGET_RPS)
    try:
        client, _ = app_clients(world.member, svc, PORT)  # the service's own origin, as the member
        assert get_when_up(client, svc).startswith("cards=")
        request_rate.forget(svc.pk)
        time.sleep(max(0.0, 1.0 - time.time() % 1.0))  # start the step on a whole second, as the counters count
        # The beat's passes every INTERVAL_S; the step starts just after one, so the next pass sees 15 s of it.
        t0 = time.monotonic()
        next_pass = t0 + autoscaling.INTERVAL_S
        sent, bodies, decided, reconciled = 0, set(), None, 0.0
        while len(bodies) < 2:
            now = time.monotonic()
            assert now - t0 < LIMIT_S, f"no second replica serving {LIMIT_S:g} s after the step (decided: {decided})"
            while sent < (now - t0) * STEP_RPS:
                status, body = get(client)
                sent += 1
                if status == 200:
                    bodies.add(body)
            if decided is None and now >= next_pass:
                next_pass += autoscaling.INTERVAL_S
                [outcome] = autoscaling.run_autoscaler(time.time())
                if outcome.changed:
                    decided = time.monotonic() - t0
                    run_cycle(world.vdc.pk)  # the cycle the autoscaler asks for
            if decided is not None and now - reconciled > 0.2:
                reconcile_all()  # the control plane's reconciliation, which starts the new replica
                reconciled = now
            time.sleep(0.005)
        reaction = time.monotonic() - t0
        figures = {
            "reaction_s": round(reaction, 1),
            "decision_s": round(decided, 1),
            "decision_to_serving_s": round(reaction - decided, 1),
            "step_rps": STEP_RPS,
            "target_rps": TARGET_RPS,
            "beat_s": autoscaling.INTERVAL_S,
            "rate_window_s": request_rate.WINDOW_S,
        }
        print(f"\nreaction time: {json.dumps(figures)}")
        if os.environ.get("HCS_REACTION_OUT"):
            with open(os.environ["HCS_REACTION_OUT"], "w") as out:
                json.dump(figures, out)
        assert decided is not None and reaction < LIMIT_S, figures
    finally:  # a failed run leaves no service running behind it
        stop_task(svc, world.member)
        wait_status(svc, {"stopped"})
