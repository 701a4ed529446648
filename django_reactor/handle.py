"""Read-only views of a stored execution, and the operations on it."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from .engine.outcomes import (
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
)
from .engine.redaction import redact
from .engine.serialization import readable
from .states import ExecutionStatus

if TYPE_CHECKING:
    from .models import Execution, ExecutionEvent, StepRecord


@dataclass(frozen=True, slots=True)
class StepView:
    """One step of a stored run, with secret arguments redacted."""

    name: str
    status: str
    attempts: int
    arguments: dict[str, Any]
    result: Any
    error: ErrorInfo | None
    rollback: str
    rollback_error: dict[str, Any] | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: StepRecord) -> StepView:
        return cls(
            name=row.step,
            status=row.status,
            attempts=row.attempts,
            arguments=redact(readable(row.arguments), row.secret_arguments),
            result=readable(row.result),
            error=ErrorInfo.from_dict(row.error) if row.error else None,
            rollback=row.rollback,
            rollback_error=row.rollback_error,
            started_at=row.started_at,
            finished_at=row.finished_at,
        )


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One entry of a run's trace."""

    seq: int
    kind: str
    step: str
    attempt: int
    at: dt.datetime
    duration_ms: float | None
    data: dict[str, Any]

    @classmethod
    def from_row(cls, row: ExecutionEvent) -> TraceEvent:
        return cls(row.seq, row.kind, row.step, row.attempt, row.at, row.duration_ms, row.data)


def outcome_of(row: Execution, *, replay: bool = False) -> Outcome:
    """The outcome a caller would have received for the run as stored."""
    status = row.status
    common: dict[str, Any] = {"execution_id": row.id, "idempotent_replay": replay}
    if status == ExecutionStatus.COMPLETED:
        return Completed(value=readable(row.result), **common)
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
        from .interrupt_store import waiting

        return Paused(
            interrupts=tuple(
                PendingInterrupt(i.step, i.correlation_id, i.expires_at) for i in waiting(row.id)
            ),
            **common,
        )
    if row.handed_off and status in (ExecutionStatus.PENDING, ExecutionStatus.RUNNING):
        return Dispatched(status=status, **common)
    return InProgress(status=status, **common)


class ExecutionHandle:
    """A stored execution: its status, redacted inputs, steps and trace, and what you can do.

    Obtained from ``MyReactor.find(execution_id)`` or ``django_reactor.services.find``. The
    handle is a snapshot; :meth:`refresh` reads the run again.
    """

    def __init__(self, row: Execution) -> None:
        self._row = row
        self._steps: list[StepView] | None = None
        self._trace: list[TraceEvent] | None = None

    def __repr__(self) -> str:
        return f"<ExecutionHandle {self.reactor} {self.id} {self.status}>"

    # -- identity and status
    @property
    def id(self) -> UUID:
        return self._row.id

    @property
    def reactor(self) -> str:
        return self._row.reactor

    @property
    def status(self) -> str:
        return self._row.status

    @property
    def current_step(self) -> str:
        return self._row.current_step

    @property
    def created_at(self) -> dt.datetime:
        return self._row.created_at

    @property
    def finished_at(self) -> dt.datetime | None:
        return self._row.finished_at

    @property
    def idempotency_key(self) -> str | None:
        return self._row.idempotency_key

    @property
    def retry_of(self) -> UUID | None:
        return self._row.retry_of_id

    @property
    def inputs(self) -> dict[str, Any]:
        """The run's inputs with secret values replaced by ``[REDACTED]``."""
        return redact(readable(self._row.inputs), self._row.secret_paths)

    @property
    def outcome(self) -> Outcome:
        return outcome_of(self._row)

    @property
    def error(self) -> ErrorInfo | None:
        return ErrorInfo.from_dict(self._row.failure) if self._row.failure else None

    # -- steps and trace
    @property
    def steps(self) -> list[StepView]:
        """Step records in completion order."""
        if self._steps is None:
            from . import store

            self._steps = [StepView.from_row(r) for r in store.step_rows(self.id)]
        return self._steps

    def step(self, name: str) -> StepView:
        for view in self.steps:
            if view.name == name:
                return view
        raise KeyError(f"execution {self.id} has no record of step {name!r}")

    def step_result(self, name: str) -> Any:
        return self.step(name).result

    @property
    def trace(self) -> list[TraceEvent]:
        """The append-only trace, oldest first."""
        if self._trace is None:
            from . import store

            self._trace = [TraceEvent.from_row(r) for r in store.event_rows(self.id)]
        return self._trace

    @property
    def parent_id(self) -> UUID | None:
        """For a composed child: the execution whose step runs it."""
        return self._row.parent_id

    def child(self, step: str) -> ExecutionHandle:
        """The composed child that ``step`` ran (raises KeyError when it has none)."""
        from . import store

        row = store.find_child(self.id, step)
        if row is None:
            raise KeyError(f"step {step!r} of execution {self.id} did not run a composed reactor")
        return ExecutionHandle(row)

    # -- operations (through services, which enforce the state machine and the lease)
    def refresh(self) -> ExecutionHandle:
        from . import services

        return services.find(self.id)

    def cancel(self, reason: str = "") -> ExecutionHandle:
        from . import services

        return services.cancel(self.id, reason=reason)

    def undo(self) -> ExecutionHandle:
        from . import services

        return services.undo(self.id)

    def retry(self) -> Outcome:
        from . import services

        return services.retry(self.id)

    @property
    def interrupts(self) -> tuple[PendingInterrupt, ...]:
        """The interrupts this run waits at (empty unless it is paused)."""
        from .interrupt_store import waiting

        return tuple(
            PendingInterrupt(i.step, i.correlation_id, i.expires_at) for i in waiting(self.id)
        )

    @property
    def maps(self) -> list[dict[str, Any]]:
        """A summary of each ``map_over`` step this run reached (totals, sampled failures)."""
        from . import map_store

        return [map_store.summary(run.pk, run) for run in map_store.maps_of(self.id)]

    def resume(
        self,
        step: str | None = None,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        background: bool | None = None,
    ) -> Outcome:
        """Deliver ``payload`` to the interrupt ``step`` (see ``services.resume_interrupt``)."""
        from . import services

        return services.resume_interrupt(
            self.id,
            step=step,
            payload=payload,
            idempotency_key=idempotency_key,
            background=background,
        )
