"""Independent steps that run at the same time: ``Meta.max_concurrency = N``.

When two or more steps are ready (their dependencies done), up to ``N`` of them run at once,
each in a thread of its own (a *lane*) with its own database connection, closed when the run
is done with its lanes. What does not change:

- **Order and the trace.** Ready steps start in declaration order. Each group that starts
  while others run writes a ``launch`` entry naming the steps it starts and the steps already
  in flight (``alongside``): the trace says which steps overlapped. A step records itself when
  it settles (completed, failed, halted), with one commit each. Lanes hand their commits to
  the run's own thread, which writes them one at a time on its connection (already open, its
  statements prepared); a lane opens a connection of its own only for what its step's body
  does, and an atomic step's record commits in its lane, inside its transaction.
- **Only plain steps run alongside others.** A composed child, a map, an async unit, an
  interrupt, a step under coordination (its own locks, slots, rate limits, periods) and a step
  reading an async unit's result start when nothing else is in flight, and run alone, as they
  would without ``max_concurrency``. A run's own coordination (``Meta.coordination``) holds for
  all its steps.
- **The rollback rule.** A failure (or a halt, a cancellation, a retry that must wait on a
  worker, a hand-off) stops new steps from starting; the steps in flight settle and are
  recorded; then the run fails and rolls back (every completed step undone in reverse order of
  completion, every failed step that started compensated), halts, is cancelled, parks for the
  retry or is handed to a worker. The first failure is the run's failure; a halt that came
  first stops the run without rollback.
- **Retries.** A step's attempts run in its lane; inline, its backoff waits there. On a worker
  a retry that must wait for its backoff is recorded, and once the other steps in flight have
  settled the run parks for the shortest backoff, releasing the worker; the attempts already
  made are read back from the trace when it resumes.

A process that dies while steps are in flight leaves each of them without a record: a worker
that resumes the run runs them again (as for any step in flight), and ``undo()`` compensates
every step a ``launch`` entry names that has no record.
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..exceptions import ResultNotSerializable
from ..states import EventKind, ExecutionStatus, StepStatus
from . import probes
from .constructs import construct_for
from .constructs.base import (
    INTERRUPTIONS,
    Postponed,
    StepDone,
    StepFailed,
    StepHalted,
    StepResult,
    Stop,
)
from .constructs.step import STEP
from .journal import Journal, JournalBatch, StepWrite
from .outcomes import ErrorInfo, ErrorKind, Halted, Outcome, Rescheduled
from .serialization import roundtrip, shown
from .state import PendingCompensation, UndoEntry

if TYPE_CHECKING:
    from .executor import Executor
    from .spec import StepSpec

# ---------------------------------------------------------------------------- what lanes say


@dataclass(frozen=True, slots=True)
class _Settled:
    """The step was recorded done (or skipped); ``cancel``: an operator asked to cancel."""

    cancel: str | None


@dataclass(frozen=True, slots=True)
class _Failed:
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class _Halted:
    reason: Any


@dataclass(frozen=True, slots=True)
class _Waits:
    """A retry that waits for its backoff on a worker (see :class:`Postponed`)."""

    postponed: Postponed
    arguments: dict[str, Any]


_Said = _Settled | _Failed | _Halted | _Waits


class _Write:
    """A lane asks the run's thread to commit ``batch`` for it, and waits for the answer."""

    def __init__(self, batch: JournalBatch) -> None:
        self.batch = batch
        self.done = threading.Event()
        self.cancel: str | None = None
        self.error: BaseException | None = None

    def answer(self, journal: Journal) -> None:
        try:
            self.cancel = journal.commit(self.batch)
        except BaseException as exc:  # raised in the lane that asked
            self.error = exc
        finally:
            self.done.set()

    def wait(self) -> str | None:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.cancel


@dataclass
class _Stop:
    """Why no new step starts, and what the run does once the steps in flight settle."""

    failure: tuple[str, ErrorInfo] | None = None
    halt: tuple[str, Any] | None = None
    cancel: tuple[str, str] | None = None
    hand_off: str | None = None  # the step the hand-off comes before (or after)
    waits: dict[str, _Waits] = field(default_factory=dict)
    crash: BaseException | None = None
    deadline: str | None = None  # the deadline passed before this step could start

    @property
    def any(self) -> bool:
        return bool(
            self.failure
            or self.halt
            or self.cancel
            or self.hand_off
            or self.waits
            or self.crash
            or self.deadline is not None
        )


# ---------------------------------------------------------------------------- lanes


class _Lanes:
    """Up to ``limit`` daemon threads that run steps; the journal cleans up after each as it
    ends (the database connection its steps opened is closed)."""

    def __init__(self, limit: int, journal: Journal) -> None:
        self.limit = limit
        self.journal = journal
        self.tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.idle = 0
        self.lock = threading.Lock()

    def submit(self, task: Callable[[], None]) -> None:
        with self.lock:
            if self.idle == 0 and len(self.threads) < self.limit:
                thread = threading.Thread(target=self._lane, name="reactor-step", daemon=True)
                self.threads.append(thread)
                thread.start()
            else:
                self.idle -= 1
        self.tasks.put(task)

    def _lane(self) -> None:
        try:
            while True:
                task = self.tasks.get()
                if task is None:
                    return
                task()
                with self.lock:
                    self.idle += 1
        finally:
            self.journal.thread_finished()

    def close(self, *, wait: bool) -> None:
        """End every lane once it is idle; with ``wait``, until they have ended."""
        for _ in self.threads:
            self.tasks.put(None)
        if wait:
            for thread in self.threads:
                thread.join()


# ---------------------------------------------------------------------------- the loop


class ParallelSteps:
    """Runs one execution's steps, independent ready ones at the same time."""

    def __init__(self, run: Executor, limit: int) -> None:
        self.execution = run
        self.limit = limit
        self.lanes = _Lanes(limit, run.journal)
        # What lanes tell the run's thread: how a step ended, or a batch to commit.
        self.said: queue.SimpleQueue[tuple[str, _Said | BaseException] | _Write] = (
            queue.SimpleQueue()
        )
        self.in_flight: list[str] = []
        # Steps whose lane has recorded how they ended (the main thread may not know yet).
        self.settled: set[str] = set()
        # What has been recorded for the whole run (under the run's lock): the first failure
        # starts its rollback, the first halt (before any failure) ends it.
        self.failure_recorded = False
        self.halt_recorded = False
        # The step the run hands off after (Meta.background = {"after": ...}) is done.
        self.handing_off = False

    def run(self) -> Outcome:
        """Run every remaining step; return how the run ended."""
        run = self.execution
        stop = _Stop()
        ended_cleanly = False
        try:
            while True:
                if not stop.any and not (run.holds is not None and run.holds.lost):
                    self._launch(stop)
                if self.in_flight:
                    try:
                        message = self.said.get()
                    except INTERRUPTIONS as exc:
                        run.abort(exc)  # the lanes' steps are left to the next owner
                        raise
                    if isinstance(message, _Write):
                        message.answer(run.journal)
                        continue
                    name, said = message
                    self.in_flight.remove(name)
                    self._absorb(name, said, stop)
                    if stop.crash is not None:
                        raise stop.crash
                    continue
                if stop.any:
                    ended_cleanly = True
                    return self._end(stop)
                # Nothing in flight and nothing started alongside: the next step runs alone.
                outcome = run.step_once()
                if outcome is not None:
                    ended_cleanly = True
                    return outcome
        finally:
            self.lanes.close(wait=ended_cleanly)

    # -- starting steps --------------------------------------------------------------------

    def _alongside(self, spec: StepSpec) -> bool:
        """Whether ``spec`` may run alongside others (a plain step, reading no async unit)."""
        return construct_for(spec) is STEP and not (spec.depends_on & self.execution.state.units)

    def _launch(self, stop: _Stop) -> None:
        """Start the ready steps that may run now, in declaration order, in lanes."""
        run = self.execution
        state = run.state
        point = run.hand_off_point
        chosen: list[tuple[StepSpec, dict[str, Any]]] = []
        with run.lock:
            if self.failure_recorded or self.halt_recorded or self.handing_off:
                return  # a lane recorded it; the main thread hears of it next
            running = [name for name in self.in_flight if name not in self.settled]
            ready = run.definition.ready(state.done, state.waiting | set(self.in_flight))
        room = self.limit - len(running)
        if ready and (running or len(ready) > 1) and run.past_deadline():
            stop.deadline = ready[0].name  # alone, the step_once path sees it too
            return
        for spec in ready:
            if len(chosen) >= room:
                break
            if point is not None and point.mode == "before" and point.step == spec.name:
                if running or chosen:
                    stop.hand_off = spec.name
                break  # alone, the step_once path hands off
            if not self._alongside(spec):
                break  # it runs alone once nothing is in flight
            with run.lock:
                arguments = run.arguments(spec)
            if isinstance(arguments, StepFailed):
                if running or chosen:
                    # It never started; nothing more starts, and the run fails once the
                    # steps in flight have settled.
                    self._record_failure(spec, arguments, arguments.arguments or {}, None)
                    stop.failure = stop.failure or (spec.name, arguments.error)
                    return
                break  # alone, the step_once path fails it
            chosen.append((spec, arguments))
        if not chosen or (len(chosen) == 1 and not running):
            return  # one step alone: the step_once path runs it, as without max_concurrency
        names = [spec.name for spec, _ in chosen]
        data: dict[str, Any] = {"steps": names}
        if running:
            data["alongside"] = running
        cancel = run.commit(
            JournalBatch(events=[run.event(EventKind.LAUNCH, data=data)], current_step=names[0])
        )
        if cancel is not None:
            stop.cancel = (self.in_flight[-1] if self.in_flight else "", cancel)
            return
        for spec, arguments in chosen:
            self.in_flight.append(spec.name)
            started_at = run.clock()
            self.lanes.submit(self._branch_task(spec, arguments, started_at))

    def _branch_task(
        self, spec: StepSpec, arguments: dict[str, Any], started_at: dt.datetime
    ) -> Callable[[], None]:
        def task() -> None:
            run = self.execution
            run.branch.active = True
            run.write_through(self._write)
            said: _Said | BaseException
            try:
                result = STEP.run(run, spec, arguments, started_at)
                said = self._record(spec, result, arguments, started_at)
            except BaseException as exc:  # handed to the main thread, which raises it
                said = exc
            finally:
                try:
                    STEP.finish(run, spec)
                finally:
                    run.write_through(None)
                    run.branch.active = False
            self.said.put((spec.name, said))

        return task

    def _write(self, batch: JournalBatch) -> Callable[[], str | None]:
        """Hand ``batch`` to the run's thread to commit (a lane's commits, in the order sent);
        the function returned waits for it."""
        request = _Write(batch)
        self.said.put(request)
        return request.wait

    # -- what a lane records ----------------------------------------------------------------

    def _record(
        self,
        spec: StepSpec,
        result: StepResult,
        arguments: dict[str, Any],
        started_at: dt.datetime,
    ) -> _Said:
        """Record how a step running alongside others ended (in its lane, one at a time)."""
        return self._said(spec, result, arguments, started_at)

    def _said(
        self,
        spec: StepSpec,
        result: StepResult,
        arguments: dict[str, Any],
        started_at: dt.datetime,
    ) -> _Said:
        run = self.execution
        if isinstance(result, StepDone):
            try:
                stored, value = roundtrip(result.value)
            except ResultNotSerializable as bad:
                run.drop_held()
                error = run.error_info(bad, ErrorKind.RESULT, spec, arguments, result.attempts)
                failed = StepFailed(error, started=not spec.atomic, attempts=result.attempts)
                return self._record_failure(spec, failed, arguments, started_at)
            return self._record_done(spec, result, arguments, stored, value, started_at)
        if isinstance(result, StepFailed):
            args = arguments if result.arguments is None else result.arguments
            return self._record_failure(spec, result, args, started_at)
        if isinstance(result, StepHalted):
            return self._record_halt(spec, result, arguments, started_at)
        if isinstance(result, Postponed):
            with run.lock:
                self.settled.add(spec.name)
            return _Waits(result, arguments)
        if isinstance(result, Stop):  # pragma: no cover - a plain step stops only to park
            raise AssertionError(f"step {spec.name!r} stopped the run from a lane")
        raise AssertionError(f"step {spec.name!r} ended with {result!r}")  # pragma: no cover

    def _record_done(
        self,
        spec: StepSpec,
        done: StepDone,
        arguments: dict[str, Any],
        stored: Any,
        value: Any,
        started_at: dt.datetime,
    ) -> _Said:
        run = self.execution
        status = StepStatus.SKIPPED if done.skipped else StepStatus.COMPLETED
        if probes.active is not None:
            probes.active("before_step_commit", spec.name)
        with run.lock:
            # The entry's number, the order of the commits and the undo stack agree: the
            # rollback rule undoes the newest first, in the order the trace shows.
            event = run.event(
                EventKind.SKIP if done.skipped else EventKind.RUN,
                step=spec.name,
                attempt=done.attempts,
                duration_ms=done.duration_ms,
            )
            written = run.send(
                JournalBatch(
                    events=[event],
                    step=StepWrite.of(
                        spec, status, event, done.attempts, arguments, started_at, result=stored
                    ),
                )
            )
            run.state.results[spec.name] = value
            run.state.done.add(spec.name)
            if not done.skipped:
                run.state.undo_stack.append(UndoEntry(spec.name, arguments, value))
            self.settled.add(spec.name)
            point = run.hand_off_point
            if point is not None and point.mode == "after" and point.step == spec.name:
                self.handing_off = True
        cancel = written()
        if probes.active is not None:
            probes.active("after_step_commit", spec.name)
        if run.observer is not None:
            run.observer.step_completed(
                run.step_event(spec.name, status, done.attempts, duration_ms=done.duration_ms)
            )
        return _Settled(cancel)

    def _record_failure(
        self,
        spec: StepSpec,
        failed: StepFailed,
        arguments: dict[str, Any],
        started_at: dt.datetime | None,
    ) -> _Said:
        """The step's failed record; the first failure also starts the run's rollback (the
        steps still in flight settle first)."""
        run = self.execution
        error = failed.error
        batch = run._failed_step(
            spec,
            error,
            arguments,
            attempts=failed.attempts,
            started_at=started_at,
            compensable=failed.started,
        )
        with run.lock:
            if not (self.failure_recorded or self.halt_recorded):
                batch.status = ExecutionStatus.ROLLING_BACK
                batch.failure = error.to_dict()
            self.failure_recorded = True
            written = run.send(batch)
            if failed.started:
                run.state.pending_compensation.append(
                    PendingCompensation(spec.name, arguments, error)
                )
            self.settled.add(spec.name)
        written()
        run.notify_step_failed(spec.name, error, failed.attempts)
        return _Failed(error)

    def _record_halt(
        self,
        spec: StepSpec,
        halted: StepHalted,
        arguments: dict[str, Any],
        started_at: dt.datetime,
    ) -> _Said:
        """The step's halted record; the first halt (before any failure) also ends the run
        halted, without rollback, while the steps still in flight settle and record."""
        run = self.execution
        reason = shown(halted.reason)
        with run.lock:
            batch = run.halted_step(spec, halted, arguments, started_at)
            if not (self.failure_recorded or self.halt_recorded):
                self.halt_recorded = True
                batch.status = ExecutionStatus.HALTED
                batch.result = {"halted_at": spec.name, "reason": reason}
                batch.finished = True
            written = run.send(batch)
            self.settled.add(spec.name)
        written()
        return _Halted(halted.reason)

    # -- the main thread ------------------------------------------------------------------

    def _absorb(self, name: str, said: _Said | BaseException, stop: _Stop) -> None:
        """Take in what a lane said about step ``name``."""
        if isinstance(said, BaseException):
            stop.crash = said
        elif isinstance(said, _Settled):
            if said.cancel is not None and stop.cancel is None:
                stop.cancel = (name, said.cancel)
            point = self.execution.hand_off_point
            if point is not None and point.mode == "after" and point.step == name:
                stop.hand_off = name  # the rest goes to a worker once the others settle
        elif isinstance(said, _Failed):
            if stop.failure is None and stop.halt is None:
                stop.failure = (name, said.error)
        elif isinstance(said, _Halted):
            if stop.halt is None and stop.failure is None:
                stop.halt = (name, said.reason)
        else:
            stop.waits[name] = said

    def _end(self, stop: _Stop) -> Outcome:
        """Every step in flight has settled: end the run as the first stop says."""
        run = self.execution
        if stop.halt is not None:
            step, reason = stop.halt
            if run.observer is not None:
                run.observer.execution_halted(
                    run.run_event(ExecutionStatus.HALTED, step=step, reason=str(shown(reason)))
                )
            return Halted(execution_id=run.execution_id, reason=reason, step=step)
        if stop.failure is not None:
            self._waits_failed(stop)
            step, error = stop.failure
            return run.roll_back_failed(step, error)
        if stop.cancel is not None:
            step, reason = stop.cancel
            return run._cancelled(reason, last_step=step)
        if stop.deadline is not None:
            self._waits_failed(stop)
            return run.deadline_passed(stop.deadline)
        if stop.waits:
            return self._park(stop.waits)
        state = run.state
        following = run.definition.ready(state.done, state.waiting)
        if not following:  # nothing left to hand off: the run ends here
            outcome = run.step_once()
            assert outcome is not None
            return outcome
        return run._hand_off(next_step=following[0].name)

    def _waits_failed(self, stop: _Stop) -> None:
        """The run fails (or its deadline passed) while retries wait: each waiting retry is a
        failed attempt whose work started, recorded failed and compensated."""
        run = self.execution
        for name, waits in stop.waits.items():
            spec = run.definition.step(name)
            run.commit(
                run._failed_step(
                    spec,
                    waits.postponed.error,
                    waits.arguments,
                    attempts=waits.postponed.attempt,
                    started_at=None,
                    compensable=not spec.atomic,
                )
            )
            if not spec.atomic:
                run.state.pending_compensation.append(
                    PendingCompensation(name, waits.arguments, waits.postponed.error)
                )
        stop.waits.clear()

    def _park(self, waits: dict[str, _Waits]) -> Rescheduled:
        """Park the run for the shortest backoff of the retries that wait; a task (or the
        sweeper) resumes it, and the attempts made are read back from the trace."""
        run = self.execution
        order = [s.name for s in run.definition.steps if s.name in waits]
        first = min(order, key=lambda name: waits[name].postponed.delay)
        delay = waits[first].postponed.delay
        run.commit(
            JournalBatch(
                events=[
                    run.event(
                        EventKind.PARK,
                        step=first,
                        data={"waiting_for": "retry", "steps": order, "delay": delay},
                    )
                ],
                status=ExecutionStatus.PENDING,
                current_step=first,
                current_attempt=waits[first].postponed.attempt,
                release=True,
                wake_after=delay,
                dispatch=None if run.attached else "retry",
                dispatch_delay=delay,
            )
        )
        run.notify_parked(first, "retry", delay)
        return Rescheduled(execution_id=run.execution_id, step=first, delay=delay)
