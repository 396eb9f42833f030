"""Signals the tasks app sends; live pages and the scheduler trigger connect to them."""

from django.dispatch import Signal

# Sent on commit, with task_id, whenever a task's status, position or timeline changed.
task_changed = Signal()
