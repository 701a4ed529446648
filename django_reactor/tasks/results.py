"""A task's run read back as the framework's ``TaskResult``, and the ``TaskContext`` a task
that takes one receives."""

from __future__ import annotations

import dataclasses
import traceback
from typing import TYPE_CHECKING, Any

from django.utils import timezone
from django.utils.module_loading import import_string

from ..states import EventKind, ExecutionStatus
from .compat import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
from .task import ReactorTask

if TYPE_CHECKING:
    from ..engine.step import StepContext
    from ..handle import ExecutionHandle

#: The framework's status of a task by its run's status. A run waiting to start, or parked
#: until its next attempt (a retry's backoff), is ready to be executed (again).
STATUSES: dict[str, TaskResultStatus] = {
    ExecutionStatus.PENDING: TaskResultStatus.READY,
    ExecutionStatus.SCHEDULED: TaskResultStatus.READY,
    ExecutionStatus.SUSPENDED: TaskResultStatus.READY,
    ExecutionStatus.PAUSED: TaskResultStatus.READY,
    ExecutionStatus.RUNNING: TaskResultStatus.RUNNING,
    ExecutionStatus.ROLLING_BACK: TaskResultStatus.RUNNING,
    ExecutionStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    ExecutionStatus.FAILED: TaskResultStatus.FAILED,
    ExecutionStatus.HALTED: TaskResultStatus.FAILED,
    ExecutionStatus.CANCELLED: TaskResultStatus.FAILED,
    ExecutionStatus.ABORTED: TaskResultStatus.FAILED,
    ExecutionStatus.NEEDS_ATTENTION: TaskResultStatus.FAILED,
}

#: The step the internal reactors run the task in (``runs.call``).
STEP = "call"
_ATTEMPT_ENDS = (EventKind.RUN, EventKind.RETRY, EventKind.FAIL)


def status_of(run_status: str) -> TaskResultStatus:
    """The framework's status of a task whose run is ``run_status``."""
    return STATUSES[run_status]


def task_named(path: str, backend: str) -> Task[Any, Any]:
    """The task at dotted ``path`` (what ``@task`` left there), or one made around the function
    found there when it is not a task."""
    found = import_string(path)
    if isinstance(found, Task):
        return found
    return ReactorTask(func=found, backend=backend)


def result_of(handle: ExecutionHandle, backend: str) -> TaskResult[Any]:
    """The ``TaskResult`` of the task run ``handle`` reads."""
    inputs = handle.inputs
    status = status_of(handle.status)
    steps = [s for s in handle.steps if s.name == STEP]
    record = steps[0] if steps else None
    trace = [e for e in handle.trace if e.step == STEP and e.kind in _ATTEMPT_ENDS]
    errors = [
        TaskError(
            exception_class_path=_class_path(e.data.get("exception_class")),
            traceback=str(e.data.get("error", "")),
        )
        for e in trace
        if e.kind == EventKind.RETRY
    ]
    failure = handle.error
    if status == TaskResultStatus.FAILED and failure is not None:
        errors.append(
            TaskError(
                exception_class_path=_class_path(failure.exception_class),
                traceback=failure.traceback or failure.message,
            )
        )
    result: TaskResult[Any] = TaskResult(
        task=task_named(inputs["task"], backend),
        id=str(handle.id),
        status=status,
        enqueued_at=handle.created_at,
        started_at=record.started_at if record is not None else None,
        finished_at=handle.finished_at if status in _FINISHED else None,
        last_attempted_at=trace[-1].at if trace else None,
        args=inputs["args"],
        kwargs=inputs["kwargs"],
        backend=backend,
        errors=errors,
        worker_ids=[_attempt_label(e.attempt) for e in trace],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", handle.outcome.value)  # type: ignore[attr-defined]
    return result


def enqueued(
    task: Task[Any, Any], result_id: str, inputs: dict[str, Any], backend: str
) -> TaskResult[Any]:
    """The ``READY`` result of a task just enqueued (nothing read back)."""
    return TaskResult(
        task=task,
        id=result_id,
        status=TaskResultStatus.READY,
        enqueued_at=timezone.now(),
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=inputs["args"],
        kwargs=inputs["kwargs"],
        backend=backend,
        errors=[],
        worker_ids=[],
    )


_FINISHED = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)


def _class_path(stored: str | None) -> str:
    """An importable path of a stored exception class (builtins are stored by their name)."""
    if not stored:
        return "builtins.Exception"
    return stored if "." in stored else f"builtins.{stored}"


def _attempt_label(attempt: int) -> str:
    """What ``worker_ids`` holds for an attempt: the framework counts ``attempts`` as its
    length; the trace says which attempt ran, not which worker process ran it."""
    return f"attempt-{attempt}"


def running(
    task: Task[Any, Any], context: StepContext, args: list[Any], kwargs: dict[str, Any]
) -> TaskResult[Any]:
    """The ``RUNNING`` result of the attempt running now (``context.attempt`` is its number)."""
    now = timezone.now()
    return TaskResult(
        task=task,
        id=str(context.execution_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=args,
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=[_attempt_label(n) for n in range(1, context.attempt + 1)],
    )


def task_context(result: TaskResult[Any]) -> TaskContext:
    """The ``TaskContext`` a task that takes one receives (``context.attempt``)."""
    return TaskContext(task_result=result)


def succeeded(result: TaskResult[Any], value: Any) -> TaskResult[Any]:
    """``result`` finished with ``value`` (what ``task_finished`` receives)."""
    done = dataclasses.replace(
        result, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now()
    )
    object.__setattr__(done, "_return_value", value)
    return done


def failed(result: TaskResult[Any], exc: BaseException) -> TaskResult[Any]:
    """``result`` failed with ``exc`` (what ``task_finished`` receives)."""
    error = TaskError(
        exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )
    return dataclasses.replace(
        result, status=TaskResultStatus.FAILED, finished_at=timezone.now(), errors=[error]
    )
