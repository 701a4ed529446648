"""A run's priority (0 lowest to 9 highest, ``engine.routing``) as the broker's message priority.

Celery passes ``priority`` through to the transport, and transports read it differently:
RabbitMQ (``amqp``) delivers higher numbers first from a queue declared with ``x-max-priority``
(Celery's ``task_queue_max_priority``); Redis delivers *lower* numbers first, from one list per
step of ``broker_transport_options["priority_steps"]`` (four steps by default; django_reactor's
recommended settings ask for all ten). Other transports get the number as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..engine.routing import HIGHEST_PRIORITY

#: Transports that deliver the lowest number first.
LOWEST_FIRST = frozenset({"redis", "rediss", "sentinel", "redis+socket"})


def broker_priority_scale(app: object) -> Callable[[int], int]:
    """How a run's priority becomes the message priority on ``app``'s broker."""
    conf = getattr(app, "conf", None)
    url = getattr(conf, "broker_url", None) or ""
    return _scale_for(str(url))


@functools.lru_cache(maxsize=8)
def _scale_for(url: str) -> Callable[[int], int]:
    scheme = url.split("://", 1)[0].split(";", 1)[0].lower() if "://" in url else ""
    if scheme in LOWEST_FIRST:
        return _lowest_first
    return _as_is


def _lowest_first(priority: int) -> int:
    return HIGHEST_PRIORITY - priority


def _as_is(priority: int) -> int:
    return priority
