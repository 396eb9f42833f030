"""Celery job functions: thin, they load by id and call a service."""
