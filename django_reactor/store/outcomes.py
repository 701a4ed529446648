"""A stored run as the outcome its caller would have received (what ``find().outcome`` and an
idempotent replay return)."""

from __future__ import annotations

from typing import Any

from ..engine.outcomes import (
    Aborted,
    Cancelled,
    Completed,
    Dispatched,
    ErrorInfo,
    Failed,
    Halted,
    InProgress,
    Outcome,
    Paused,
    PendingInterrupt,
    Queued,
    Scheduled,
    Suspended,
)
from ..engine.sealing import payloads
from ..engine.serialization import JSONValue, decode, readable
from ..exceptions import StoredValueUnreadable
from ..models import Execution
from ..states import ExecutionStatus
from .continuation import successor_of
from .interrupts import path_of, waiting
from .pauses import pause_for
from .secrets import Marks


def outcome_of(row: Execution, *, replay: bool = False, opened: bool = False) -> Outcome:
    """The outcome a caller would have received for the run as stored.

    Secrets in a completed run's value show as ``[REDACTED]`` (``[ERASED]``); with
    ``opened``, for the run that reads a child's value (a composed child, an async unit), they
    are opened (SubjectErased when its subject was forgotten).
    """
    status = row.status
    common: dict[str, Any] = {"execution_id": row.id, "idempotent_replay": replay}
    if status == ExecutionStatus.COMPLETED:
        if opened:
            return Completed(value=_opened(row.result), **common)
        # Only a run of its own continues as new (a composed child or a unit never does).
        successor = successor_of(row.id) if row.parent_id is None else None
        return Completed(value=readable(row.result, Marks()), continued_as=successor, **common)
    if status in (ExecutionStatus.FAILED, ExecutionStatus.NEEDS_ATTENTION) and row.failure:
        return Failed(error=ErrorInfo.from_dict(row.failure), status=status, **common)
    if status == ExecutionStatus.HALTED:
        result = row.result or {}
        reason = readable(result.get("reason"))
        return Halted(reason=reason, step=result.get("halted_at"), **common)
    if status == ExecutionStatus.CANCELLED:
        return Cancelled(reason=row.cancel_reason, **common)
    if status == ExecutionStatus.ABORTED:
        error = ErrorInfo.from_dict(row.failure) if row.failure else None
        return Aborted(error=error, **common)
    if status == ExecutionStatus.PAUSED:
        return Paused(
            interrupts=tuple(
                PendingInterrupt(path_of(i), i.correlation_id, i.expires_at)
                for i in waiting(row.id)
            ),
            **common,
        )
    if status == ExecutionStatus.SUSPENDED:
        asked = pause_for(row.reactor, row.id, parent_id=row.parent_id)
        return Suspended(reason=asked.reason if asked is not None else "", **common)
    if status == ExecutionStatus.SCHEDULED:
        return Scheduled(start_at=row.wake_at, **common)
    if status == ExecutionStatus.QUEUED:
        return Queued(key=row.concurrency_key, **common)
    if row.handed_off and status in (ExecutionStatus.PENDING, ExecutionStatus.RUNNING):
        return Dispatched(status=status, **common)
    return InProgress(status=status, **common)


def _opened(value: JSONValue) -> Any:
    """``decode(value)`` for a run that uses it, its secrets opened: a secret that cannot be
    read raises (SubjectErased when its subject was forgotten); a value of this code cannot
    read without one stays as stored, as a display shows it."""
    try:
        return decode(value)
    except StoredValueUnreadable:
        if next(payloads(value), None) is not None:
            raise
        return value
