"""The journal: what the executor writes and reads back, and the protocol a store implements
to keep it durably.

The write half: the executor never touches a database. It hands the journal one
:class:`JournalBatch` per state change (one per step on the happy path); the store commits each
batch in one transaction, conditional on the run's fence, and raises
:class:`~django_reactor.exceptions.LeaseLost` when another owner has taken the run.

The read half: what a journal holds about a run comes back as :class:`RunRecords`, its step
records as :class:`RecordedStep` (values as stored), and
:meth:`~django_reactor.engine.state.RunState.restore` rebuilds the run's state from them. The
store only reads rows; what a record means is decided here, in the engine, by the record's
construct.
"""

from __future__ import annotations

import datetime as dt
import enum
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal, Protocol
from uuid import UUID

from ..exceptions import LeaseLost, ResultNotSerializable
from ..states import EventKind, ExecutionStatus, RollbackStatus
from .redaction import SecretPath
from .serialization import JSONMapping, JSONObject, JSONValue, encode, shown_items

if TYPE_CHECKING:
    from .continuation import SuccessorWrite
    from .spec import StepSpec


class Unset(enum.Enum):
    """The type of :data:`UNSET`: a batch leaves the run's result or failure as it is."""

    UNSET = "unset"


UNSET: Final = Unset.UNSET


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the execution trace."""

    seq: int
    kind: str
    at: dt.datetime
    step: str = ""
    attempt: int = 0
    duration_ms: float | None = None
    data: JSONMapping = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepWrite:
    """The forward record of one step (inserted, or replaced when it already exists)."""

    step: str
    status: str
    seq: int
    attempts: int
    arguments: JSONObject
    secret_arguments: list[SecretPath]
    started_at: dt.datetime | None
    finished_at: dt.datetime
    result: JSONValue = None
    error: JSONObject | None = None
    compensable: bool = False
    # Secret paths into ``result`` (the store seals what is there); into ``arguments``:
    # ``secret_arguments``.
    secret_result: Sequence[SecretPath] = ()

    @classmethod
    def of(
        cls,
        spec: StepSpec,
        status: str,
        event: Event,
        attempts: int,
        arguments: dict[str, object],
        started_at: dt.datetime | None,
        *,
        result: JSONValue = None,
        error: JSONObject | None = None,
        compensable: bool = False,
    ) -> StepWrite:
        """The record of ``spec`` written with ``event``: same sequence number, same time."""
        return cls(
            step=spec.name,
            status=status,
            seq=event.seq,
            attempts=attempts,
            arguments=_encode_arguments(arguments),
            secret_arguments=spec.argument_secret_paths(),
            started_at=started_at,
            finished_at=event.at,
            result=result,
            error=error,
            compensable=compensable,
            secret_result=spec.secret_result_paths,
        )


@dataclass(frozen=True, slots=True)
class RollbackWrite:
    """What rollback did to one step."""

    step: str
    status: str
    at: dt.datetime
    error: JSONObject | None = None


@dataclass(frozen=True, slots=True)
class InterruptWrite:
    """An interrupt the run reached: it waits for a payload from now on."""

    step: str
    correlation_id: str | None
    expires_at: dt.datetime | None
    max_attempts: int | None
    resume_mode: str
    token_hash: str | None = None
    # A ``wait_for_event``: what it matches, written with the interrupt's row.
    event: EventWaitWrite | None = None


@dataclass(frozen=True, slots=True)
class EventWaitWrite:
    """The event a ``wait_for_event`` reached waits for: its name, the key it matches (any,
    when None), and the moment from which events emitted earlier count (its look back)."""

    name: str
    key: str | None
    since: dt.datetime


@dataclass(frozen=True, slots=True)
class StopRequest:
    """What an operator asked of a running run, found when one of its batches committed:
    ``cancel`` it (it ends cancelled), or ``pause`` it (it is suspended, holding no worker,
    until it is unpaused). Either takes effect between steps; ``data`` goes into the trace
    entry that says so (who asked, whether its reactor was paused)."""

    kind: Literal["cancel", "pause"]
    reason: str
    data: JSONMapping = field(default_factory=dict)


# ---------------------------------------------------------------------------- the read half


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One step's record as a journal holds it: how the step ended and its values as stored
    (encoded: the construct that restores the record decodes them)."""

    step: str
    status: str
    arguments: JSONValue = None
    result: JSONValue = None
    error: JSONObject | None = None
    compensable: bool = False
    rollback: str = RollbackStatus.NONE
    attempts: int = 0
    seq: int = 0
    secret_arguments: Sequence[Sequence[str]] = ()
    rollback_error: JSONObject | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class RunRecords:
    """What a journal holds about one run, for :meth:`RunState.restore`: its step records in
    the order they were written, the last trace sequence number, and where the run stood.

    The last three fields are read only for a rollback (``for_rollback``): the steps ``launch``
    entries named (started side by side), the steps without a record whose composed child or
    map was started (the run's cursor is looked at), and whether the run's last cancellation
    abandoned it while it was running.
    """

    steps: Sequence[RecordedStep] = ()
    last_seq: int = 0
    status: str = ""
    current_step: str = ""
    current_attempt: int = 0
    failure: Mapping[str, JSONValue] | None = None
    # The attempts each step's retry entries recorded (read only while a retry waits).
    retry_attempts: Mapping[str, int] = field(default_factory=dict)
    launched: Sequence[str] = ()
    nested_work: frozenset[str] = frozenset()
    cancelled_while_running: bool = False
    # The read took the run over from a process that stopped mid-run (a worker's claim that
    # counted a recovery): the steps it had in flight may have started (``launched`` is read
    # then too).
    taken_over: bool = False


@dataclass(slots=True)
class JournalBatch:
    """Everything that must commit together for one state change."""

    events: list[Event] = field(default_factory=list)
    step: StepWrite | None = None
    rollback: RollbackWrite | None = None
    status: str | None = None
    current_step: str | None = None
    result: JSONValue | Unset = UNSET
    # Secret paths into ``result`` (the run's value): the store seals what is there.
    result_secrets: Sequence[SecretPath] = ()
    failure: JSONObject | Unset | None = UNSET  # None clears a stored failure
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
    # Values the step published (``context.publish``), by key: merged into the run's.
    published: Mapping[str, JSONValue] | None = None
    # The run's attributes the step set (``context.set_attribute``), as stored text by key;
    # None removes the key.
    attributes: Mapping[str, str | None] | None = None
    # The run completes by continuing as new: its successor is created with this batch.
    successor: SuccessorWrite | None = None

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
            or self.published
            or self.successor is not None
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
            or self.successor is not None
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

    def heartbeat(self, step: str, details: JSONValue) -> None:
        """Step ``step`` in flight said it is alive (``details``: how far it got). Kept where
        operators see it; never a commit of the run's."""
        ...

    def ensure_owned(self) -> None:
        """Raise ``LeaseLost`` when this process no longer owns the run (another took it over);
        asked before a body that lost its database connection runs again: the loss may have
        come with a stall past the lease, during which another process took the run."""
        ...

    @property
    def execution_id(self) -> UUID | None:
        """The run this journal writes for."""
        ...

    def cancel_requester(self) -> JSONMapping:
        """Who asked to cancel the run while it ran (``{"by": ..., "via": ...}``), for the
        ``cancel`` entry the run writes when it stops; empty when nobody is recorded."""
        ...

    def commit(self, batch: JournalBatch) -> StopRequest | None:
        """Write ``batch`` atomically. Return what an operator asked of the run (cancel it,
        pause it), if anything.

        Raises ``LeaseLost`` when this process no longer owns the run, and ``CorrelationIdTaken``
        when the batch's interrupt uses a correlation id another waiting run holds; nothing is
        written then.
        """
        ...

    def read(self, *, for_rollback: bool = False) -> RunRecords:
        """What this journal holds about the run (with what a rollback needs besides, when
        ``for_rollback``)."""
        ...

    def patch_decisions(self) -> Mapping[str, bool]:
        """The run's patch decisions, by name (``engine.patches``)."""
        ...

    def decide_patch(self, name: str, taken: bool, step: str) -> bool:
        """Record the run's decision for patch ``name`` unless it has one (another lane or
        process may decide at the same time); return the recorded one. Durable on return:
        not written with a checkpoint."""
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
    """A journal that keeps everything in lists: for engine tests and dry runs.

    It keeps what a database would (the run's status, cursor, failure and step records, with
    their rollback), so a run it recorded can be restored from it (:meth:`read`), as from the
    store.
    """

    def __init__(self, execution_id: UUID | None = None) -> None:
        self.execution_id = execution_id
        self.events: list[Event] = []
        self.steps: dict[str, StepWrite] = {}
        self.rollbacks: dict[str, RollbackWrite] = {}
        self.statuses: list[str] = []
        self.result: JSONValue | Unset = UNSET
        self.failure: JSONObject | None = None
        # What an operator asked: the run is cancelled (the reason), or paused, after a step.
        self.cancel_requested: str | None = None
        self.pause_requested: str | None = None
        # Who asked for it (``by``, ``via``), as the store's steering history would say.
        self.cancel_requested_by: JSONMapping = {}
        self.dispatches: list[tuple[str, float]] = []
        self.interrupts: list[InterruptWrite] = []
        # The runs it continued as (a step returned ContinueAsNew), as the store would create.
        self.successors: list[SuccessorWrite] = []
        self.batches = 0
        self.transactions: list[tuple[str, str, str]] = []
        self.heartbeats: list[tuple[str, JSONValue]] = []
        # What the run published (``context.publish``), by key: the latest value of each.
        self.published: dict[str, JSONValue] = {}
        # The attributes its steps set (``context.set_attribute``), by key.
        self.attributes: dict[str, str] = {}
        # Set when another process took the run over: commits and ownership checks refuse.
        self.taken_over = False
        # What the run's row would hold.
        self.current_step = ""
        self.current_attempt = 0
        # Each step's current rollback (a step recorded again has none).
        self._rolled_back: dict[str, RollbackWrite] = {}
        # The run's patch decisions: (taken, the step that decided), by name.
        self.patches: dict[str, tuple[bool, str]] = {}
        self._patch_lock = threading.Lock()

    def begin(self, step: str, action: str) -> MemoryTransaction:
        return MemoryTransaction(self, step, action)

    def thread_finished(self) -> None:
        return None

    def heartbeat(self, step: str, details: JSONValue) -> None:
        self.heartbeats.append((step, details))

    def ensure_owned(self) -> None:
        if self.taken_over:
            raise LeaseLost(f"execution {self.execution_id} was taken over by another process")

    def cancel_requester(self) -> JSONMapping:
        return self.cancel_requested_by

    def patch_decisions(self) -> dict[str, bool]:
        return {name: taken for name, (taken, _step) in self.patches.items()}

    def decide_patch(self, name: str, taken: bool, step: str) -> bool:
        with self._patch_lock:
            return self.patches.setdefault(name, (taken, step))[0]

    def commit(self, batch: JournalBatch) -> StopRequest | None:
        self.ensure_owned()
        self.batches += 1
        self.events.extend(batch.events)
        if batch.step is not None:
            self.steps[batch.step.step] = batch.step
            self._rolled_back.pop(batch.step.step, None)
        if batch.rollback is not None:
            self.rollbacks[batch.rollback.step] = batch.rollback
            self._rolled_back[batch.rollback.step] = batch.rollback
        if batch.status is not None:
            self.statuses.append(batch.status)
        if batch.result is not UNSET:
            self.result = batch.result
        if batch.failure is not UNSET:
            self.failure = batch.failure
        if batch.published:
            self.published.update(batch.published)
        for key, value in (batch.attributes or {}).items():
            if value is None:
                self.attributes.pop(key, None)
            else:
                self.attributes[key] = value
        if batch.dispatch is not None:
            self.dispatches.append((batch.dispatch, batch.dispatch_delay))
        if batch.interrupt is not None:
            self.interrupts.append(batch.interrupt)
        if batch.successor is not None:
            self.successors.append(batch.successor)
        if batch.current_step is not None:
            self.current_step = batch.current_step
        # As the store writes the cursor: a step's outcome ends a retry's wait.
        if batch.wake_after is None and batch.step is not None:
            self.current_attempt = 0
        elif batch.current_attempt is not None:
            self.current_attempt = batch.current_attempt
        if self.cancel_requested is not None:
            return StopRequest("cancel", str(self.cancel_requested))
        if self.pause_requested is not None:
            return StopRequest("pause", self.pause_requested)
        return None

    def read(self, *, for_rollback: bool = False) -> RunRecords:
        """What the journal holds, as the store would read it back."""
        steps = []
        for write in sorted(self.steps.values(), key=lambda w: w.seq):
            rolled_back = self._rolled_back.get(write.step)
            steps.append(
                RecordedStep(
                    step=write.step,
                    status=write.status,
                    arguments=write.arguments,
                    result=write.result,
                    error=write.error,
                    compensable=write.compensable,
                    rollback=rolled_back.status if rolled_back else RollbackStatus.NONE,
                    attempts=write.attempts,
                    seq=write.seq,
                    secret_arguments=write.secret_arguments,
                    rollback_error=rolled_back.error if rolled_back else None,
                    started_at=write.started_at,
                    finished_at=write.finished_at,
                )
            )
        retry_attempts: dict[str, int] = {}
        for event in self.events:
            if event.kind == EventKind.RETRY:
                retry_attempts[event.step] = max(retry_attempts.get(event.step, 0), event.attempt)
        status = self.statuses[-1] if self.statuses else ExecutionStatus.RUNNING
        launched: list[str] = []
        # As a worker's claim finds a run whose process stopped mid-run.
        taken_over = status in (ExecutionStatus.RUNNING, ExecutionStatus.ROLLING_BACK)
        # As the store reads them: also for a run rolling back, which finishes its rollback,
        # and for one taken over (its steps in flight).
        if for_rollback or taken_over:
            for event in self.events:
                named = event.data.get("steps") if event.kind == EventKind.LAUNCH else None
                if isinstance(named, list):  # the steps a launch entry started side by side
                    launched.extend(s for s in named if isinstance(s, str) and s not in launched)
        cancels = [e for e in self.events if e.kind == EventKind.CANCEL]
        return RunRecords(
            steps=tuple(steps),
            last_seq=max((e.seq for e in self.events), default=0),
            status=status,
            current_step=self.current_step,
            current_attempt=self.current_attempt,
            failure=self.failure,
            retry_attempts=retry_attempts if self.current_attempt else {},
            launched=tuple(launched),
            cancelled_while_running=bool(cancels)
            and cancels[-1].data.get("previous_status")
            in (ExecutionStatus.RUNNING, ExecutionStatus.ROLLING_BACK),
            taken_over=taken_over,
        )

    def trace(self) -> list[tuple[str, str]]:
        """``(kind, step)`` pairs in order: the shape tests assert on."""
        return [(e.kind, e.step) for e in self.events]


def _encode_arguments(arguments: dict[str, object]) -> JSONObject:
    try:
        return encode(arguments)
    except ResultNotSerializable:
        return shown_items(arguments)
