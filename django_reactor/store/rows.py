"""The typed views of stored rows the store hands out (one place for each)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..engine.journal import RunRecords, StopRequest
from ..models import Execution


@dataclass(frozen=True, slots=True)
class Owned:
    """A run this process owns: its id and the fence its writes must carry."""

    execution_id: uuid.UUID
    fence: int


@dataclass(frozen=True, slots=True)
class WorkerClaim:
    """A run a worker took over: its fence, the row as the claim left it, what its journal
    holds (read by the same statement), the definition shape it started under, as stored
    (None: none was kept), and the pause that applies to it (the worker suspends it instead of
    running it)."""

    owned: Owned
    row: Execution
    records: RunRecords
    shape: Any = None
    pause: StopRequest | None = None

    @property
    def recovery_attempts(self) -> int:
        return self.row.recovery_attempts
