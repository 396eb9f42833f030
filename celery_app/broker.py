"""kombu's Redis transport with one fix, so a worker reconnects through any number of Redis restarts.

A worker waits for jobs in a ``BRPOP``. When Redis dies under it, Celery closes the broken connection twice:
first ``Connection.collect()``, which closes the channel and then tears the transport down (its ``client``
becomes None), then ``Connection.close()``. kombu's channel begins its close by reading the answer of the pending
``BRPOP``; on a dead connection that read raises, the first close stops there (the channel is not marked closed),
and the second close goes on to requeue the worker's unacknowledged messages through a connection pool it can no
longer build: ``AttributeError: 'NoneType' object has no attribute 'hostname'``. That is no connection error to
Celery, so the worker logged "Unrecoverable error" and exited, whenever a job was running or reserved at the
moment Redis went away (about one restart in six under the beat's load).

Here the read of the pending ``BRPOP`` at close treats a broken connection as the end of the wait it is, and the
first close finishes: the unacknowledged messages are requeued while the transport still knows the broker, or
left in Redis's unacked set for ``visibility_timeout`` to restore when Redis is unreachable.

kombu resolves ``redis://``, ``rediss://`` and ``redis+socket://`` broker URLs through its alias table;
:func:`install`, called where the Celery app is made, points those names here, so every process that loads the
app (web, worker, beat, management commands) connects through this transport.
"""

from __future__ import annotations

import contextlib

from kombu.transport import TRANSPORT_ALIASES, redis
from kombu.transport.virtual import Empty


class Channel(redis.Channel):
    """kombu's Redis channel, whose close completes when the connection broke during a ``BRPOP``."""

    def close(self) -> None:
        if self._in_poll:
            with contextlib.suppress(Empty, *self.connection_errors):
                self._brpop_read()
        super().close()


class Transport(redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel


def install() -> None:
    """Make ``redis://``, ``rediss://`` and ``redis+socket://`` broker URLs use :class:`Transport`."""
    for alias in ("redis", "rediss"):
        TRANSPORT_ALIASES[alias] = f"{__name__}:Transport"
