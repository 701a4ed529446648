"""Coordination backends: ``redis.RedisBackend`` and ``database.DatabaseBackend``.

Both implement :class:`~django_reactor.coordination.backends.base.CoordinationBackend`; pick one
with ``REACTOR["COORDINATION_BACKEND"]`` and get it with :func:`get_backend` (also importable
as ``django_reactor.coordination.get_backend``).
"""

from __future__ import annotations

import threading

from ...conf import reactor_settings
from ...engine.step import refuse_in_atomic_step
from ...exceptions import ReactorImproperlyConfigured
from .base import CoordinationBackend

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
