"""Signals the tasks app sends; the control plane and live pages connect to them.

The tasks app never calls the runtime (scheduler, executors, Celery) directly: it records what users want
in the database and signals it. Receivers must tolerate being called late or not at all (a broker outage):
the control plane's periodic loops act on the database state anyway.
"""

from django.dispatch import Signal

# Sent on commit, with task_ids (a list), when tasks' status, position or timeline changed. The scheduler
# sends one signal per cycle for every task it touched, so receivers work in bulk (one query, not one per task).
# ``new=True`` says the tasks were just submitted: they never ran, so there is nothing to meter.
task_changed = Signal()

# Sent on commit when the work waiting for or holding resources changed (a submit, a stop, a finish):
# a scheduling cycle is wanted soon.
demand_changed = Signal()

# Sent on commit, with cluster_id, when something on that cluster's backend must be carried out soon
# (a stopped task's job to cancel).
cluster_work = Signal()

# Sent on commit, with task_id, when a running service's autoscaling settings changed: a backend that scales it
# itself (a Kubernetes HPA) must get the new bounds and targets.
autoscaling_changed = Signal()
