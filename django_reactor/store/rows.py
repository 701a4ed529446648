"""The typed views of stored rows the store hands out (one place for each)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..models import Execution


@dataclass(frozen=True, slots=True)
class Owned:
    """A run this process owns: its id and the fence its writes must carry."""

    execution_id: uuid.UUID
    fence: int


@dataclass(frozen=True, slots=True)
class StepView:
    """The parts of a step record that say what a run has done."""

    step: str
    status: str
    arguments: Any
    result: Any
    error: dict[str, Any] | None
    compensable: bool
    rollback: str


@dataclass(frozen=True, slots=True)
class WorkerClaim:
    """A run a worker took over: its fence, and the row as the claim left it."""

    owned: Owned
    row: Execution

    @property
    def recovery_attempts(self) -> int:
        return self.row.recovery_attempts
