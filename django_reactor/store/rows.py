"""The typed views of stored rows the store hands out (one place for each)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..engine.journal import RunRecords, StopRequest
from ..engine.routing import Route
from ..models import Execution


@dataclass(frozen=True, slots=True)
class Owned:
    """A run this process owns: its id, the fence its writes must carry and, when the owner
    read it, its route (where its next tasks go; None: looked up when they are published)."""

    execution_id: uuid.UUID
    fence: int
    route: Route | None = None


def route_of_row(row: Execution) -> Route:
    """The route a stored run was created with (``Execution.queue`` and ``priority``)."""
    return Route(row.queue, row.priority)


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
