"""Logging filters of the portal's log configuration (``LOGGING`` in the settings)."""

from __future__ import annotations

import logging


class QuietRetries(logging.Filter):
    """urllib3's "Retrying (Retry(total=2, ...)) after connection broken by ..." lines, one per retry of each call
    the Kubernetes client makes, go to debug: a backend that does not answer is logged by the portal itself, once a
    minute per cluster (apps/control/outages.py). Every other urllib3 line passes as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and str(record.msg).startswith("Retrying ("):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True
