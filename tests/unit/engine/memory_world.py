"""An in-memory "database" for cutting runs at their checkpoints (``test_restore.py``).

A :class:`World` holds everything the store would for one scenario: the run's journal, its
composed children's and async units' journals, its maps' element slots, the payloads delivered
to its interrupts, and what step bodies did (a ledger of body calls and a transactional ledger
of atomic steps' writes). Every journal an executor writes goes through a :class:`FencedView`:
a commit through a view older than the world's fence raises ``LeaseLost``, as the store does
once another process took the run, so nothing a "dead" process still does (a lane of
``Meta.max_concurrency``) is ever written.

Commits are numbered across the whole world; the commit numbered ``cut_at`` raises
:class:`Crash` and writes nothing, as a process dying there would. The driver then takes the
run over (a new fence), restores it from its records and continues it as a worker would, until
it ends; a run that pauses gets its payloads, a run that parks gets its clock moved past the
park, and an async unit it waits for is run to its end first.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from django_reactor.engine import executor as executor_module
from django_reactor.engine.context import RunPolicy
from django_reactor.engine.coordination import Blocked
from django_reactor.engine.executor import Executor
from django_reactor.engine.journal import Event, JournalBatch, MemoryJournal, MemoryTransaction
from django_reactor.engine.lanes import SideBySide, _Write
from django_reactor.engine.outcomes import (
    Outcome,
    Paused,
    Rescheduled,
)
from django_reactor.engine.serialization import decode, encode
from django_reactor.engine.spec import ReactorDefinition
from django_reactor.engine.state import RunState
from django_reactor.exceptions import LeaseLost
from django_reactor.states import EventKind, ExecutionStatus, StepStatus
from tests.unit.engine.memory_runner import (
    FINISHED,
    MemoryMaps,
    MemoryRunner,
    no_waiting,
    outcome_of,
)
from tests.unit.engine.test_coordination import FakeCoordinator, Hold

WAIT = 10.0  # seconds any join or wait takes at most: far longer than anything here needs
T0 = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
TOP = "run"
# A step record with one of these statuses is how its body ended: the body never runs again.
OUTCOMES = frozenset(
    {StepStatus.COMPLETED, StepStatus.SKIPPED, StepStatus.FAILED, StepStatus.HALTED}
)
UNDO_KINDS = frozenset({EventKind.UNDO, EventKind.UNDO_FAILED, EventKind.UNDO_SKIPPED})
COMPENSATE_KINDS = frozenset(
    {EventKind.COMPENSATE, EventKind.COMPENSATE_FAILED, EventKind.COMPENSATE_SKIPPED}
)

#: A body call: ``(action, step, tag)``; the tag is a map element's item ("" elsewhere).
Key = tuple[str, str, str]


class Crash(BaseException):
    """The process died at a commit: not an interruption the executor records (those are
    KeyboardInterrupt, SystemExit and MemoryError), so it propagates unrecorded."""


@dataclass(frozen=True, slots=True)
class Call:
    key: Key
    fence: int


@dataclass(frozen=True, slots=True)
class Commit:
    number: int
    site: str
    fence: int
    # The body calls whose outcome (or failed attempt) it records, and those of them whose
    # body it ends for good (a step's outcome, a rollback's record, an element's slot).
    covers: frozenset[Key]
    final: frozenset[Key]


@dataclass(frozen=True, slots=True)
class CrashInfo:
    number: int
    site: str
    fence: int


@dataclass
class RunRow:
    """One execution the world holds: the run, a composed child or an async unit."""

    label: str
    kind: str  # "top", "child" or "unit"
    definition: ReactorDefinition
    inputs: dict[str, Any]
    journal: MemoryJournal

    @property
    def status(self) -> str:
        return self.journal.statuses[-1] if self.journal.statuses else ExecutionStatus.RUNNING


@dataclass
class Segment:
    """What one executor of the run did: its fence, its coordinator, whether it died."""

    fence: int
    coordinator: WorldCoordinator | None = None
    died: bool = False


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


class WorldCoordinator(FakeCoordinator):
    """The test suite's fake coordinator, whose step slot is contended as often as the world
    says (``contention``), whichever process asks."""

    world: World | None = None

    def enter_step(self, step: str, declarations: Any, arguments: Any) -> Hold | Blocked:
        world = self.world
        assert world is not None
        with world.lock:
            if world.contention > 0:
                world.contention -= 1
                return Blocked("contention", "the slot is taken", retry_after=1.0)
        return super().enter_step(step, declarations, arguments)


_current: World | None = None


def current() -> World:
    """The world the step bodies of the scenario playing now act in."""
    assert _current is not None, "no scenario is playing"
    return _current


class TrackedSideBySide(SideBySide):
    """The executor's side-by-side loop, known to the world so that the lanes a dead process
    left behind are ended before the run is taken over."""

    def __init__(self, run: Executor, limit: int) -> None:
        super().__init__(run, limit)
        current().sides.append(self)


class LedgerTransaction(MemoryTransaction):
    """An atomic action's transaction: the writes its body made reach the world's ledger only
    when it commits (with the action's checkpoint)."""

    def __init__(self, world: World, journal: MemoryJournal, step: str, action: str) -> None:
        super().__init__(journal, step, action)
        self.world = world
        self.pending: list[tuple[str, str]] = []
        world.local.transaction = self

    def commit(self) -> None:
        super().commit()
        with self.world.lock:
            self.world.writes.extend(self.pending)
        self._close()

    def rollback(self) -> None:
        super().rollback()
        self._close()

    def _close(self) -> None:
        self.pending = []
        if getattr(self.world.local, "transaction", None) is self:
            self.world.local.transaction = None


class FencedView:
    """A run's journal as one process sees it: its commits are refused once the world's fence
    has moved past this view's (another process took the run)."""

    def __init__(self, world: World, row: RunRow, fence: int) -> None:
        self.world = world
        self.row = row
        self.fence = fence

    @property
    def execution_id(self) -> uuid.UUID | None:
        return self.row.journal.execution_id

    def commit(self, batch: JournalBatch) -> str | None:
        covers, final = batch_keys(batch)
        with self.world.committing(
            self.fence, site_of(self.row.label, batch), covers=covers, final=final
        ):
            return self.row.journal.commit(batch)

    def read(self, *, for_rollback: bool = False) -> Any:
        return self.row.journal.read(for_rollback=for_rollback)

    def begin(self, step: str, action: str) -> LedgerTransaction:
        return LedgerTransaction(self.world, self.row.journal, step, action)

    def thread_finished(self) -> None:
        return None

    def heartbeat(self, step: str, details: Any) -> None:
        return None

    def ensure_owned(self) -> None:
        with self.world.changed:
            if self.fence != self.world.fence:
                raise LeaseLost(f"fence {self.fence} is older than {self.world.fence}")


def batch_keys(batch: JournalBatch) -> tuple[set[Key], set[Key]]:
    """The body calls a batch records (``covers``) and ends for good (``final``)."""
    final: set[Key] = set()
    covers: set[Key] = set()
    if batch.step is not None and batch.step.status in OUTCOMES:
        final.add(("run", batch.step.step, ""))
    if batch.rollback is not None:
        name = batch.rollback.step
        kinds = {e.kind for e in batch.events if e.step == name}
        if kinds & UNDO_KINDS:
            final.add(("undo", name, ""))
        if kinds & COMPENSATE_KINDS:
            final.add(("compensate", name, ""))
    for event in batch.events:
        if event.kind == EventKind.RETRY:
            covers.add(("run", event.step, ""))
    return covers | final, final


def site_of(label: str, batch: JournalBatch) -> str:
    """A short name for a batch: its trace entries, and the status it sets."""
    parts = [f"{e.kind}.{e.step}" if e.step else str(e.kind) for e in batch.events] or ["cursor"]
    status = f">{batch.status}" if batch.status else ""
    return f"{label}:{','.join(parts)}{status}"


class World:
    """One scenario's database, clock and ledgers, and the driver that plays it."""

    def __init__(
        self,
        *,
        cut_at: int | None = None,
        payloads: Mapping[str, Any] | None = None,
        contention: int = 0,
        abandon: Mapping[str, frozenset[int]] | None = None,
    ) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.local = threading.local()
        self.clock = Clock()
        self.cut_at = cut_at
        self.payloads = dict(payloads or {})
        self.contention = contention
        self.fence = 0
        self.commits = 0
        self.crash: CrashInfo | None = None
        self.dying = False
        self.sites: list[str] = []
        self.log: list[Call | Commit] = []
        self.writes: list[tuple[str, str]] = []
        self.runs: dict[str, RunRow] = {}
        self.maps = MemoryMaps(self, abandon or {})
        self.sides: list[TrackedSideBySide] = []
        self.segments: list[Segment] = []
        self.final_keys: set[Key] = set()
        # What the restores found: steps side by side in flight when the run, rolling back,
        # died (compensated for it; the maps note the elements a dead process held).
        self.adopted: dict[str, set[str]] = {}

    # -- the database -------------------------------------------------------------------

    @contextmanager
    def committing(
        self, fence: int, site: str, *, covers: Any = (), final: Any = ()
    ) -> Iterator[None]:
        """One commit of the process holding ``fence``: refused if it lost the run, the
        process dies here if this is the cut, else the write in the block is kept."""
        with self.changed:
            if fence != self.fence:
                raise LeaseLost(f"{site}: fence {fence} is older than {self.fence}")
            number = self.commits
            self.commits += 1
            if number == self.cut_at:
                self.crash = CrashInfo(number, site, fence)
                self.fence += 1  # whatever the dead process still does is refused
                self.dying = True
                self.changed.notify_all()
                raise Crash(site)
            yield
            self.sites.append(site)
            self.log.append(Commit(number, site, fence, frozenset(covers), frozenset(final)))
            self.final_keys |= set(final)
            self.changed.notify_all()

    def called(self, key: Key) -> None:
        """A step body ran (in the process holding the run, or in a dead one's lane)."""
        with self.lock:
            fence = self.crash.fence if self.dying and self.crash is not None else self.fence
            self.log.append(Call(key, fence))

    def write(self, what: tuple[str, str]) -> None:
        """An atomic step's body writes: kept only if its transaction commits."""
        transaction = getattr(self.local, "transaction", None)
        assert transaction is not None, f"{what} wrote outside an atomic action's transaction"
        transaction.pending.append(what)

    def await_final(self, key: Key) -> None:
        """Wait until the outcome of ``key`` is committed (or this process died)."""
        with self.changed:
            done = self.changed.wait_for(lambda: key in self.final_keys or self.dying, WAIT)
        assert done, f"{key} never recorded its outcome"

    def create(
        self, label: str, kind: str, definition: ReactorDefinition, inputs: Any, fence: int | None
    ) -> RunRow:
        """Write an execution with its start entry (a commit of the process holding
        ``fence``; the top run is created before any process runs it)."""
        stored = encode(dict(inputs))
        journal = MemoryJournal(uuid.uuid4())
        row = RunRow(label, kind, definition, decode(stored), journal)
        status = ExecutionStatus.PENDING if kind == "unit" else ExecutionStatus.RUNNING
        batch = JournalBatch(events=[Event(1, EventKind.START, self.clock())], status=status)
        if fence is None:
            journal.commit(batch)
        else:
            with self.committing(fence, f"{label}:create"):
                journal.commit(batch)
        self.runs[label] = row
        return row

    # -- the driver ---------------------------------------------------------------------

    def play(self, definition: ReactorDefinition, inputs: Mapping[str, Any]) -> None:
        """Create the run and drive it to its end."""
        global _current
        assert _current is None
        _current = self
        try:
            with mock.patch.object(executor_module, "SideBySide", TrackedSideBySide):
                self.create(TOP, "top", definition, inputs, None)
                self.drive(TOP)
        finally:
            _current = None
            self.bury()

    def drive(self, label: str) -> None:
        """Run the execution ``label`` as workers would, one segment after another (each a
        process that restores it from its records), until it ends."""
        row = self.runs[label]
        for _ in range(40):
            if row.status in FINISHED:
                return
            fence = self.take_over(row)
            segment = Segment(fence)
            self.segments.append(segment)
            try:
                outcome = self.segment(row, fence, segment)
            except (Crash, LeaseLost):
                crash = self.crash
                if crash is None or crash.fence != fence:
                    raise  # refused without a crash of this process: a bug of the driver
                segment.died = True
                self.bury()
                continue
            self.bury()
            if isinstance(outcome, Paused):
                self.deliver(row)
            elif isinstance(outcome, Rescheduled):
                if outcome.reason == "park":  # a reader waits for async units
                    for unit in [r for r in self.runs.values() if r.kind == "unit"]:
                        if unit.label.startswith(f"{label}.") and unit.status not in FINISHED:
                            self.drive(unit.label)
                self.clock.advance(outcome.delay + 1)
        raise AssertionError(f"{label} never ended")

    def take_over(self, row: RunRow) -> int:
        """A worker claims the run: a new fence, and the run is running (or still rolling
        back)."""
        with self.lock:
            assert not any(t.is_alive() for s in self.sides for t in s.lanes.threads)
            self.fence += 1
            self.dying = False
            if row.status != ExecutionStatus.ROLLING_BACK:
                row.journal.statuses.append(ExecutionStatus.RUNNING)
            return self.fence

    def segment(self, row: RunRow, fence: int, segment: Segment | None = None) -> Outcome:
        """Restore ``row`` from its records and continue it under ``fence``."""
        records = row.journal.read()
        self.note_adoption(row)
        state = RunState.restore(row.definition, records)
        executor = self.executor(row, state, fence, segment)
        if state.rolling_back:
            executor.finish_rollback("rollback resumed")
            return outcome_of(row)
        outcome = executor.run()
        if isinstance(outcome, Paused):  # the interrupts it reached in this call
            reached = executor.memo.get("interrupt", {})
            outcome = dataclasses.replace(
                outcome, interrupts=tuple(i for i in outcome.interrupts if i.step in reached)
            )
        return outcome

    def executor(
        self, row: RunRow, state: RunState, fence: int, segment: Segment | None = None
    ) -> Executor:
        definition = row.definition
        coordinator: WorldCoordinator | None = None
        if definition.coordination or any(s.coordination for s in definition.steps):
            coordinator = WorldCoordinator()
            coordinator.world = self
            if segment is not None:
                segment.coordinator = coordinator
        return Executor(
            definition,
            FencedView(self, row, fence),
            inputs=row.inputs,
            state=state,
            # A worker's, as every restored run is continued by one (a child's parks with
            # its parent).
            policy=RunPolicy(retry_later=True, attached=row.kind == "child", park_poll=2.0),
            children=MemoryRunner(self, row.label, fence),
            coordinator=coordinator,
            clock=self.clock,
            sleep=no_waiting,
        )

    def note_adoption(self, row: RunRow) -> None:
        """What a restore must compensate, read from the records (not from the engine): a
        run rolling back whose steps side by side were launched and never recorded."""
        if row.status != ExecutionStatus.ROLLING_BACK or row.definition.max_concurrency < 2:
            return
        journal = row.journal
        launched = {
            name for e in journal.events if e.kind == EventKind.LAUNCH for name in e.data["steps"]
        }
        missing = launched - set(journal.steps)
        if missing:
            self.adopted.setdefault(row.label, set()).update(missing)

    def deliver(self, row: RunRow) -> None:
        """Accept the payload of every interrupt the paused run (or a composed child under it)
        waits at, as the store's claim does: the interrupt's record says ``resumed`` with the
        payload, the run goes to a worker (a child stays paused: its parent continues it)."""
        for waiter in [r for r in self.runs.values() if r.label.startswith(row.label)]:
            journal = waiter.journal
            for name, write in list(journal.steps.items()):
                if write.status == StepStatus.WAITING and waiter.definition.step(name).interrupt:
                    payload = encode(self.payloads[name])
                    journal.steps[name] = dataclasses.replace(
                        write, status=StepStatus.RESUMED, result=payload
                    )
        row.journal.statuses.append(ExecutionStatus.PENDING)

    def bury(self) -> None:
        """End the lanes of the processes that ran: a dead one's lane waiting for its write
        is answered through its (refused) view, so it ends too."""
        for side in self.sides:
            remaining = set(side.in_flight)
            while remaining:
                message = side.said.get(timeout=WAIT)
                if isinstance(message, _Write):
                    message.answer(side.execution.journal)
                else:
                    remaining.discard(message[0])
            side.in_flight.clear()
            for thread in side.lanes.threads:
                thread.join(WAIT)
                assert not thread.is_alive(), "a lane never ended"
        self.sides.clear()

    def mark(self) -> int:
        """Where the log stands now (for :meth:`calls_since`)."""
        with self.lock:
            return len(self.log)

    def calls_since(self, mark: int) -> set[Key]:
        """The body calls made since ``mark``."""
        with self.lock:
            return {entry.key for entry in self.log[mark:] if isinstance(entry, Call)}


# ---------------------------------------------------------------------------- what a run left


@dataclass
class Summary:
    """What a played scenario left in its world, to compare a cut run with its reference."""

    status: str
    failure_kind: str | None
    result: Any
    records: dict[str, dict[str, tuple[str, str]]]
    slots: dict[str, tuple[str, ...]]
    calls: Counter[Key] = field(default_factory=Counter)
    writes: Counter[tuple[str, str]] = field(default_factory=Counter)


def summary(world: World) -> Summary:
    top = world.runs[TOP]
    failure = top.journal.failure
    return Summary(
        status=top.status,
        failure_kind=failure.get("kind") if failure else None,
        result=decode(top.journal.result) if top.status == ExecutionStatus.COMPLETED else None,
        records={
            label: {r.step: (r.status, r.rollback) for r in row.journal.read().steps}
            for label, row in world.runs.items()
        },
        slots={label: tuple(s.status for s in row.slots) for label, row in world.maps.rows.items()},
        calls=Counter(e.key for e in world.log if isinstance(e, Call)),
        writes=Counter(world.writes),
    )


def uncovered(world: World, fence: int) -> Counter[Key]:
    """The body calls the process holding ``fence`` made whose outcome it never committed:
    each may run once more after the restore."""
    pending: Counter[Key] = Counter()
    for entry in world.log:
        if entry.fence != fence:
            continue
        if isinstance(entry, Call):
            pending[entry.key] += 1
        else:
            for key in entry.covers:
                pending.pop(key, None)
    return pending


def repeated_after_outcome(world: World) -> list[tuple[Key, str]]:
    """Body calls made after a commit had recorded that body's outcome for good."""
    ended: dict[Key, str] = {}
    repeats = []
    for entry in world.log:
        if isinstance(entry, Commit):
            ended.update(dict.fromkeys(entry.final, entry.site))
        elif entry.key in ended:
            repeats.append((entry.key, ended[entry.key]))
    return repeats
