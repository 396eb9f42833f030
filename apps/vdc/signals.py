"""Signals the vdc app sends; apps that build on projects (tasks) connect to them in ``AppConfig.ready()``."""

from django.dispatch import Signal

# Sent, with secret=<ProjectSecret>, before a project secret is deleted. Each receiver answers a list of
# strings naming what still needs the secret (waiting or running tasks); any answer blocks the delete.
secret_in_use = Signal()
