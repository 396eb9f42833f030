"""Signals the tasks app sends; live pages and the scheduler trigger connect to them."""

from django.dispatch import Signal

# Sent on commit, with task_ids (a list), when tasks' status, position or timeline changed. The scheduler
# sends one signal per cycle for every task it touched, so receivers work in bulk (one query, not one per task).
task_changed = Signal()
