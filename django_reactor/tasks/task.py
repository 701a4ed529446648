"""``ReactorTask``: the task ``@task`` makes for a ``ReactorBackend``."""

from __future__ import annotations

import dataclasses
from typing import ParamSpec, TypeVar

from ..engine.retry import Retry
from .compat import Task

T = TypeVar("T")
P = ParamSpec("P")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReactorTask(Task[P, T]):
    """The task ``@task`` makes for a ``ReactorBackend``: the framework's ``Task`` with the
    run's ``retry`` policy (``@task(retry=Retry(attempts=5, delay=2))``; the backend's
    ``OPTIONS["RETRY"]`` otherwise) and, for one enqueue, its ``idempotency_key``."""

    retry: Retry | None = None
    idempotency_key: str | None = None

    def with_idempotency_key(self, key: str) -> ReactorTask[P, T]:
        """This task, enqueued at most once per ``key``: a repeat returns the first run's
        result (the same id); the same key with other arguments raises
        ``IdempotencyKeyReused``."""
        return dataclasses.replace(self, idempotency_key=key)
