"""What the executor writes, and the protocol a store implements to write it durably.

The executor never touches a database. It hands the journal one :class:`JournalBatch` per state
change (one per step on the happy path); the store commits each batch in one transaction,
conditional on the run's fence, and raises :class:`~django_reactor.exceptions.LeaseLost` when
another owner has taken the run.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

from .redaction import SecretPath

UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the execution trace."""

    seq: int
    kind: str
    at: dt.datetime
    step: str = ""
    attempt: int = 0
    duration_ms: float | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepWrite:
    """The forward record of one step (inserted, or replaced when it already exists)."""

    step: str
    status: str
    seq: int
    attempts: int
    arguments: dict[str, Any]
    secret_arguments: list[SecretPath]
    started_at: dt.datetime | None
    finished_at: dt.datetime
    result: Any = None
    error: dict[str, Any] | None = None
    compensable: bool = False


@dataclass(frozen=True, slots=True)
class RollbackWrite:
    """What rollback did to one step."""

    step: str
    status: str
    at: dt.datetime
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class InterruptWrite:
    """An interrupt the run reached: it waits for a payload from now on."""

    step: str
    correlation_id: str | None
    expires_at: dt.datetime | None
    max_attempts: int | None
    resume_mode: str
    token_hash: str | None = None


@dataclass(slots=True)
class JournalBatch:
    """Everything that must commit together for one state change."""

    events: list[Event] = field(default_factory=list)
    step: StepWrite | None = None
    rollback: RollbackWrite | None = None
    status: str | None = None
    current_step: str | None = None
    result: Any = UNSET
    failure: dict[str, Any] | None = UNSET  # None clears a stored failure
    finished: bool = False
    # Hand the run to a worker or park it for a retry: release the lease without finishing,
    # and queue a task (``dispatch`` names why) to publish after the commit.
    release: bool = False
    handed_off: bool = False
    dispatch: str | None = None
    dispatch_delay: float = 0.0
    wake_after: float | None = None
    current_attempt: int | None = None
    # An interrupt reached: its row is written with the step's ``waiting`` record.
    interrupt: InterruptWrite | None = None
    # The run ends (or rolls back) while interrupts wait: they stop taking payloads.
    close_interrupts: bool = False
    # The process is stopping mid-run (a worker interrupted): end the lease now, keeping its
    # owner, so another process takes the run over at once and counts a recovery.
    expire_lease: bool = False

    @property
    def parks_quietly(self) -> bool:
        """A park that queues no task (a sleep, a long backoff: the sweeper wakes the run):
        like a routine checkpoint, it only writes the run's row, its step and its trace."""
        return not (
            self.handed_off
            or self.dispatch
            or self.interrupt is not None
            or self.close_interrupts
            or self.expire_lease
        )

    @property
    def routine(self) -> bool:
        """A plain checkpoint: no hand-off, no parking, no task to queue."""
        return not (
            self.release
            or self.handed_off
            or self.dispatch
            or self.wake_after is not None
            or self.current_attempt is not None
            or self.interrupt is not None
            or self.close_interrupts
            or self.expire_lease
        )


class StepTransaction(Protocol):
    """The database transaction of one action of an atomic step (see :meth:`Journal.begin`).

    The action's body runs inside it; the checkpoint that records what the action did is the
    last write in it, and :meth:`commit` commits both, or neither.
    """

    def settle(self) -> None:
        """The body returned: make the database check now what it would check at commit
        (deferred constraints) and enforce the time bound. Raises to fail the attempt; the
        caller then rolls back."""
        ...

    def commit(self) -> None:
        """Commit the body's writes with the checkpoint written since :meth:`settle`."""
        ...

    def rollback(self) -> None:
        """Roll the body's writes back (the attempt failed, or the checkpoint did)."""
        ...


class Journal(Protocol):
    """Durable writes of one owned run (implemented by ``django_reactor.store``)."""

    def begin(self, step: str, action: str) -> StepTransaction:
        """Open the transaction an atomic step's ``action`` (run, undo, compensate) runs in, on
        the run's database; the next :meth:`commit` of this thread joins it."""
        ...

    def thread_finished(self) -> None:
        """A thread that ran steps side by side (``Meta.max_concurrency``), or a step's body
        under a timeout, ends: give back what it took there (the database connection it
        opened)."""
        ...

    def heartbeat(self, step: str, details: Any) -> None:
        """Step ``step`` in flight said it is alive (``details``: how far it got). Kept where
        operators see it; never a commit of the run's."""
        ...

    @property
    def execution_id(self) -> UUID | None:
        """The run this journal writes for."""
        ...

    def commit(self, batch: JournalBatch) -> str | None:
        """Write ``batch`` atomically. Return the reason when an operator asked to cancel the run.

        Raises ``LeaseLost`` when this process no longer owns the run, and ``CorrelationIdTaken``
        when the batch's interrupt uses a correlation id another waiting run holds; nothing is
        written then.
        """
        ...


class MemoryTransaction:
    """The transaction a :class:`MemoryJournal` gives an atomic step: it notes what happens to
    it in the journal's ``transactions`` (``(step, action, "commit" | "rollback")``)."""

    def __init__(self, journal: MemoryJournal, step: str, action: str) -> None:
        self.journal = journal
        self.step = step
        self.action = action
        self.batches_before = journal.batches

    def settle(self) -> None:
        return None

    def commit(self) -> None:
        self.journal.transactions.append((self.step, self.action, "commit"))

    def rollback(self) -> None:
        self.journal.transactions.append((self.step, self.action, "rollback"))


class MemoryJournal:
    """A journal that keeps everything in lists: for engine tests and dry runs."""

    def __init__(self, execution_id: UUID | None = None) -> None:
        self.execution_id = execution_id
        self.events: list[Event] = []
        self.steps: dict[str, StepWrite] = {}
        self.rollbacks: dict[str, RollbackWrite] = {}
        self.statuses: list[str] = []
        self.result: Any = UNSET
        self.failure: dict[str, Any] | None = None
        self.cancel_requested: str | None = None
        self.dispatches: list[tuple[str, float]] = []
        self.interrupts: list[InterruptWrite] = []
        self.batches = 0
        self.transactions: list[tuple[str, str, str]] = []
        self.heartbeats: list[tuple[str, Any]] = []

    def begin(self, step: str, action: str) -> MemoryTransaction:
        return MemoryTransaction(self, step, action)

    def thread_finished(self) -> None:
        return None

    def heartbeat(self, step: str, details: Any) -> None:
        self.heartbeats.append((step, details))

    def commit(self, batch: JournalBatch) -> str | None:
        self.batches += 1
        self.events.extend(batch.events)
        if batch.step is not None:
            self.steps[batch.step.step] = batch.step
        if batch.rollback is not None:
            self.rollbacks[batch.rollback.step] = batch.rollback
        if batch.status is not None:
            self.statuses.append(batch.status)
        if batch.result is not UNSET:
            self.result = batch.result
        if batch.failure is not UNSET:
            self.failure = batch.failure
        if batch.dispatch is not None:
            self.dispatches.append((batch.dispatch, batch.dispatch_delay))
        if batch.interrupt is not None:
            self.interrupts.append(batch.interrupt)
        return self.cancel_requested

    def trace(self) -> list[tuple[str, str]]:
        """``(kind, step)`` pairs in order: the shape tests assert on."""
        return [(e.kind, e.step) for e in self.events]
