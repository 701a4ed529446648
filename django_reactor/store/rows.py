"""The typed views of stored rows the store hands out (one place for each)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..models import Execution, StepRecord


@dataclass(frozen=True, slots=True)
class Owned:
    """A run this process owns: its id and the fence its writes must carry."""

    execution_id: uuid.UUID
    fence: int


@dataclass(frozen=True, slots=True)
class StepRow:
    """One step record as stored (values still encoded): what a run's step did.

    The store reads step records into these (``reads.step_rows``, the worker's claim); the
    engine's state is rebuilt from them, and ``handle.StepView`` shows one.
    """

    step: str
    status: str
    arguments: Any
    result: Any
    error: dict[str, Any] | None
    compensable: bool
    rollback: str
    attempts: int = 0
    secret_arguments: list[list[str]] = field(default_factory=list)
    rollback_error: Any = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    seq: int = 0

    @classmethod
    def from_model(cls, row: StepRecord) -> StepRow:
        """The row of a ``StepRecord`` instance."""
        return cls(
            step=row.step,
            status=row.status,
            arguments=row.arguments,
            result=row.result,
            error=row.error,
            compensable=row.compensable,
            rollback=row.rollback,
            attempts=row.attempts,
            secret_arguments=row.secret_arguments,
            rollback_error=row.rollback_error,
            started_at=row.started_at,
            finished_at=row.finished_at,
            seq=row.seq,
        )


@dataclass(frozen=True, slots=True)
class WorkerClaim:
    """A run a worker took over: its fence, and the row as the claim left it."""

    owned: Owned
    row: Execution

    @property
    def recovery_attempts(self) -> int:
        return self.row.recovery_attempts
