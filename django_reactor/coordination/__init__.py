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

import threading

from ..conf import reactor_settings
from ..engine.step import refuse_in_atomic_step
from ..exceptions import ReactorImproperlyConfigured
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

_backends: dict[tuple[str, str, str], CoordinationBackend] = {}
_lock = threading.Lock()


def get_backend() -> CoordinationBackend:
    """The configured backend (``COORDINATION_BACKEND``), one instance per configuration.

    Settings are read at call time, so ``override_settings(REACTOR={...})`` takes effect.
    Refused (:class:`~django_reactor.exceptions.AtomicStepError`) inside an atomic step.
    """
    from django.utils.module_loading import import_string

    refuse_in_atomic_step(
        "take a lock, a semaphore slot, a rate limit or a period",
        "a hold taken inside the transaction outlives its rollback, and one kept in the "
        "database would not be seen by others until the commit. Declare it with "
        "coordination=[...] on the step: it is taken before the transaction and given back "
        "after it commits",
    )
    path = reactor_settings.COORDINATION_BACKEND
    config = (path, reactor_settings.COORDINATION_REDIS, reactor_settings.COORDINATION_KEY_PREFIX)
    with _lock:
        backend = _backends.get(config)
        if backend is None:
            try:
                cls = import_string(path)
            except ImportError as exc:
                raise ReactorImproperlyConfigured(
                    f'REACTOR["COORDINATION_BACKEND"] = {path!r} cannot be imported: {exc}'
                ) from exc
            if not (isinstance(cls, type) and issubclass(cls, CoordinationBackend)):
                raise ReactorImproperlyConfigured(
                    f'REACTOR["COORDINATION_BACKEND"] = {path!r} is not a CoordinationBackend'
                )
            backend = _backends[config] = cls()
        return backend
