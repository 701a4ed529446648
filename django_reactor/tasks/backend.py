"""``ReactorBackend``: the tasks framework's backend that runs each task as a durable run.

``TASKS = {"default": {"BACKEND": "django_reactor.tasks.ReactorBackend"}}``. A task enqueued
through it is a background run of an internal one-step reactor (``runs``): stored in the
reactors' database with the caller's transaction, published to a Celery worker when it commits,
retried as its ``Retry`` says, recovered when its worker dies, and shown in the admin and the
``reactor_*`` commands like any run. ``get_result`` reads the run back (``results``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, ParamSpec, TypeVar

from django.core.exceptions import ImproperlyConfigured

from .. import services
from ..engine.retry import NO_RETRY, Retry
from ..exceptions import ExecutionNotFound, ReactorError
from . import results, runs
from .compat import (
    DEFAULT_TASK_PRIORITY,
    DEFAULT_TASK_QUEUE_NAME,
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTaskError,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    task_enqueued,
)
from .task import ReactorTask

T = TypeVar("T")
P = ParamSpec("P")

#: Our run priorities (``services.run_in_background(priority=...)``): 0..9, higher first.
LOWEST_PRIORITY, DEFAULT_PRIORITY, HIGHEST_PRIORITY = 0, 5, 9


class ReactorBackend(BaseTaskBackend):
    """Runs tasks as durable background runs on Celery workers (see the module's docstring).

    ``OPTIONS``: ``RETRY``, the retry policy of tasks that name none (a ``Retry`` or its keyword
    arguments as a dict; default: no retry).
    """

    task_class = ReactorTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    # A task's priority is its run's (route_for maps -100..100 onto 0..9).
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        retry = self.options.get("RETRY", NO_RETRY)
        if isinstance(retry, Mapping):
            retry = Retry(**retry)
        if not isinstance(retry, Retry):
            raise ImproperlyConfigured(
                f'TASKS["{alias}"]["OPTIONS"]["RETRY"] must be a Retry(...) or a dict of its '
                f"arguments, got {retry!r}"
            )
        self.retry = retry

    def validate_task(self, task: Task[Any, Any]) -> None:
        """The framework's checks (module-level function, queue in ``QUEUES``, priority range,
        aware ``run_after``), and a retry policy a task can have."""
        super().validate_task(task)
        retry = getattr(task, "retry", None)
        if retry is not None and not isinstance(retry, Retry):
            raise InvalidTaskError(f"retry= must be a Retry(...), got {retry!r}")
        try:
            runs.policy_name(retry or self.retry)
        except ReactorError as exc:
            raise InvalidTaskError(str(exc)) from None

    def enqueue(
        self,
        task: Task[P, T],
        args: P.args,  # type: ignore[valid-type]
        kwargs: P.kwargs,  # type: ignore[valid-type]
    ) -> TaskResult[T]:
        """Store the task as a background run of its reactor and return its ``READY`` result;
        inside ``transaction.atomic()`` the run commits (and is published) with the caller's
        work. Arguments that are not JSON are refused before anything is written."""
        self.validate_task(task)
        inputs = {
            "task": task.module_path,
            "args": _json(list(args), task, "args"),
            "kwargs": _json(dict(kwargs), task, "kwargs"),
        }
        reactor = runs.reactor_for(getattr(task, "retry", None) or self.retry)
        queue, priority = route_for(task)
        outcome = services.run(
            reactor,
            inputs,
            idempotency_key=getattr(task, "idempotency_key", None),
            at=task.run_after,
            queue=queue,
            priority=priority,
        )
        if outcome.idempotent_replay:  # the run holding the key, as it stands
            return self.get_result(str(outcome.execution_id))
        result = results.enqueued(task, str(outcome.execution_id), inputs, self.alias)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The task run ``result_id`` as it stands; ``TaskResultDoesNotExist`` for an id that
        names no task run."""
        try:
            handle = services.find(result_id)
        except (ExecutionNotFound, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        if not runs.is_task_reactor(handle.reactor):
            raise TaskResultDoesNotExist(result_id)
        return results.result_of(handle, self.alias)


def route_for(task: Task[Any, Any]) -> tuple[str | None, int]:
    """The Celery queue and run priority of ``task``: its ``queue_name`` (None for the
    framework's ``"default"``: the runs' own queue, ``REACTOR["CELERY_QUEUE"]``) and its
    priority, -100..100 mapped onto 0..9 (0 is 5, the default; -100 is 0, 100 is 9)."""
    queue = None if task.queue_name == DEFAULT_TASK_QUEUE_NAME else task.queue_name
    priority = task.priority - DEFAULT_TASK_PRIORITY
    if priority >= 0:
        span = (HIGHEST_PRIORITY - DEFAULT_PRIORITY) / (TASK_MAX_PRIORITY - DEFAULT_TASK_PRIORITY)
    else:
        span = (DEFAULT_PRIORITY - LOWEST_PRIORITY) / (DEFAULT_TASK_PRIORITY - TASK_MIN_PRIORITY)
    return queue, DEFAULT_PRIORITY + math.floor(priority * span + 0.5)


def _json(value: Any, task: Task[Any, Any], what: str) -> Any:
    """``value`` as JSON stores it, or a TypeError naming the task and the argument."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"the {what} of task {task.module_path} must be JSON (str, int, float, bool, None, "
            f"lists and dicts with string keys): {exc}; pass an id or a string instead"
        ) from None


__all__ = ["ReactorBackend", "ReactorTask", "route_for"]
