"""Coordination primitives: locks, semaphores, rate limits, periods and ordered locks.

Importable without touching models. The backend is chosen by ``REACTOR["COORDINATION_BACKEND"]``
(Redis by default, or the database backend) and read when :func:`get_backend` is called::

    from django_reactor.coordination import get_backend

    backend = get_backend()
    grant = backend.acquire_lock("invoice:7", owner=str(execution_id), ttl=30)
    if grant is not None:
        write_invoice(fence=grant.fence)
        backend.release_lock("invoice:7", owner=str(execution_id))

Every operation is atomic on the backend server and uses that server's clock. A backend that
cannot be reached raises :class:`CoordinationUnavailable`: fail closed, retry later.
"""

from __future__ import annotations

from .backends import get_backend
from .backends.base import CoordinationBackend
from .exceptions import CoordinationError, CoordinationUnavailable, UnknownRateLimit
from .periods import bucket_for, period_seconds
from .rates import named_rate_limit, parse_windows
from .types import LockGrant, OrderedStatus, PeriodClaim, RateDecision, SemaphoreGrant, Window

__all__ = [
    "CoordinationBackend",
    "CoordinationError",
    "CoordinationUnavailable",
    "LockGrant",
    "OrderedStatus",
    "PeriodClaim",
    "RateDecision",
    "SemaphoreGrant",
    "UnknownRateLimit",
    "Window",
    "bucket_for",
    "get_backend",
    "named_rate_limit",
    "parse_windows",
    "period_seconds",
]
