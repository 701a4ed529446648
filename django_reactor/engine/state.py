"""What a run has done so far: its results, its undo stack and what waits.

Empty for a new run; the store loads it for a run that resumes. The executor and its
constructs change it as steps complete, fail, wait and roll back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .outcomes import ErrorInfo


@dataclass(slots=True)
class UndoEntry:
    """A completed step waiting on the undo stack."""

    step: str
    arguments: dict[str, Any]
    result: Any


@dataclass(slots=True)
class PendingCompensation:
    """A failed (or interrupted) step whose compensate has not run yet."""

    step: str
    arguments: dict[str, Any]
    error: ErrorInfo


@dataclass(slots=True)
class RunState:
    """What a run has done so far (empty for a new run, loaded from the store otherwise)."""

    results: dict[str, Any] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    undo_stack: list[UndoEntry] = field(default_factory=list)
    pending_compensation: list[PendingCompensation] = field(default_factory=list)
    next_seq: int = 1
    # Attempts a step already made before this process took the run (a retry resumed later).
    attempts_done: dict[str, int] = field(default_factory=dict)
    # Async units dispatched whose outcome no reader has collected yet.
    units: set[str] = field(default_factory=set)
    # Every step with a record (done, failed, halted or dispatched), as loaded.
    recorded: set[str] = field(default_factory=set)
    # Interrupts reached whose payload has not come yet.
    waiting: set[str] = field(default_factory=set)
    # Interrupts whose payload was accepted while the run was paused: recorded as their steps'
    # results when the run continues.
    claimed: dict[str, Any] = field(default_factory=dict)
    # Sleeps reached, by step: the time (ISO 8601) each waits until.
    sleeping: dict[str, str] = field(default_factory=dict)
