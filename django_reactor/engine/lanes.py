"""Independent steps that run at the same time: ``Meta.max_concurrency = N``.

The executor's one loop (:mod:`.executor`) asks :class:`SideBySide` for its turn: start the
ready steps that may run now, each in a lane, and take in what a lane says when its step
settles; when nothing is in flight the loop runs the next step alone, as without
``max_concurrency``. A lane records its step's outcome with the loop's own
:meth:`~.recording.RunRecorder.record_step`.

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

import contextvars
import datetime as dt
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..states import EventKind
from .constructs import construct_for
from .constructs.base import INTERRUPTIONS, Postponed, StepDone, StepFailed, StepHalted, StepResult
from .constructs.step import STEP
from .journal import Journal, JournalBatch, StopRequest
from .outcomes import ErrorInfo, Halted, Outcome, Rescheduled
from .serialization import shown

if TYPE_CHECKING:
    from .executor import Executor
    from .serialization import JSONData
    from .spec import StepSpec

# ---------------------------------------------------------------------------- what lanes say


@dataclass(frozen=True, slots=True)
class _Settled:
    """The step was recorded done (or skipped); ``asked``: what an operator asked of the run
    (cancel it, pause it), found with its checkpoint."""

    asked: StopRequest | None


@dataclass(frozen=True, slots=True)
class _Failed:
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class _Halted:
    reason: object


@dataclass(frozen=True, slots=True)
class _Waits:
    """A retry that waits for its backoff on a worker (see :class:`Postponed`)."""

    postponed: Postponed
    arguments: dict[str, object]


_Said = _Settled | _Failed | _Halted | _Waits


class _Write:
    """A lane asks the run's thread to commit ``batch`` for it, and waits for the answer."""

    def __init__(self, batch: JournalBatch) -> None:
        self.batch = batch
        self.done = threading.Event()
        self.asked: StopRequest | None = None
        self.error: BaseException | None = None

    def answer(self, journal: Journal) -> None:
        try:
            self.asked = journal.commit(self.batch)
        except BaseException as exc:  # raised in the lane that asked
            self.error = exc
        finally:
            self.done.set()

    def wait(self) -> StopRequest | None:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.asked


@dataclass
class _Stop:
    """Why no new step starts, and what the run does once the steps in flight settle."""

    failure: tuple[str, ErrorInfo] | None = None
    halt: tuple[str, object] | None = None
    # An operator's cancel or pause, and the step after which it was found.
    asked: tuple[str, StopRequest] | None = None
    hand_off: str | None = None  # the step the hand-off comes before (or after)
    waits: dict[str, _Waits] = field(default_factory=dict)
    crash: BaseException | None = None
    deadline: str | None = None  # the deadline passed before this step could start

    @property
    def any(self) -> bool:
        return bool(
            self.failure
            or self.halt
            or self.asked
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
                # A lane runs steps in the caller's context (the database its run is bound to).
                thread = threading.Thread(
                    target=contextvars.copy_context().run,
                    args=(self._lane,),
                    name="reactor-step",
                    daemon=True,
                )
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


# ---------------------------------------------------------------------------- side by side


class SideBySide:
    """The executor's loop's side-by-side part: which steps run alongside others, and how
    the run ends once they have settled."""

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
        # The step the run hands off after (Meta.background = {"after": ...}) is done.
        self.handing_off = False
        self.stop = _Stop()
        self.ended_cleanly = False

    def turn(self) -> Outcome | None:
        """Start what may run alongside others and take in what the lanes say, until nothing
        is in flight; then end the run if a step stopped it. None: nothing runs side by side
        now, and the loop runs the next step alone."""
        run = self.execution
        stop = self.stop
        while True:
            if not stop.any and not (run.holds is not None and run.holds.lost):
                self._launch(stop)
            if not self.in_flight:
                break
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
        if stop.any:
            self.ended_cleanly = True
            return self._end(stop)
        return None

    def close(self) -> None:
        """The loop ends: end the lanes (waiting for them when the run ended cleanly)."""
        self.lanes.close(wait=self.ended_cleanly)

    # -- starting steps --------------------------------------------------------------------

    def _alongside(self, spec: StepSpec) -> bool:
        """Whether ``spec`` may run alongside others (a plain step, reading no async unit)."""
        return construct_for(spec) is STEP and not (spec.depends_on & self.execution.state.units)

    def _launch(self, stop: _Stop) -> None:
        """Start the ready steps that may run now, in declaration order, in lanes."""
        run = self.execution
        state = run.state
        point = run.hand_off_point
        chosen: list[tuple[StepSpec, dict[str, object]]] = []
        with run.lock:
            if run.stopping is not None or self.handing_off:
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
                    run.record_step(spec, arguments, arguments.arguments or {}, None).wait()
                    stop.failure = stop.failure or (spec.name, arguments.error)
                    return
                break  # alone, the step_once path fails it
            chosen.append((spec, arguments))
        if not chosen or (len(chosen) == 1 and not running):
            return  # one step alone: the step_once path runs it, as without max_concurrency
        names = [spec.name for spec, _ in chosen]
        data: dict[str, JSONData] = {"steps": names}
        if running:
            data["alongside"] = running
        asked = run.commit(
            JournalBatch(events=[run.event(EventKind.LAUNCH, data=data)], current_step=names[0])
        )
        if asked is not None:
            stop.asked = (self.in_flight[-1] if self.in_flight else "", asked)
            return
        for spec, arguments in chosen:
            self.in_flight.append(spec.name)
            started_at = run.clock()
            self.lanes.submit(self._branch_task(spec, arguments, started_at))

    def _branch_task(
        self, spec: StepSpec, arguments: dict[str, object], started_at: dt.datetime
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

    def _write(self, batch: JournalBatch) -> Callable[[], StopRequest | None]:
        """Hand ``batch`` to the run's thread to commit (a lane's commits, in the order sent);
        the function returned waits for it."""
        request = _Write(batch)
        self.said.put(request)
        return request.wait

    def _record(
        self,
        spec: StepSpec,
        result: StepResult,
        arguments: dict[str, object],
        started_at: dt.datetime,
    ) -> _Said:
        """Record how a step running alongside others ended, in its lane: as the loop records
        a step, except that the run goes on until the steps in flight have settled."""
        run = self.execution
        if isinstance(result, Postponed):
            with run.lock:
                self.settled.add(spec.name)
            return _Waits(result, arguments)
        if not isinstance(result, StepDone | StepFailed | StepHalted):  # pragma: no cover
            raise AssertionError(f"step {spec.name!r} ended with {result!r} in a lane")
        with run.lock:
            recorded = run.record_step(spec, result, arguments, started_at)
            self.settled.add(spec.name)
            point = run.hand_off_point
            if (
                recorded.kind == "done"
                and point is not None
                and point.mode == "after"
                and point.step == spec.name
            ):
                self.handing_off = True
        asked = recorded.wait()
        if recorded.kind == "done":
            return _Settled(asked)
        if recorded.kind == "failed":
            assert recorded.error is not None
            return _Failed(recorded.error)
        return _Halted(recorded.reason)

    # -- the main thread ------------------------------------------------------------------

    def _absorb(self, name: str, said: _Said | BaseException, stop: _Stop) -> None:
        """Take in what a lane said about step ``name``."""
        if isinstance(said, BaseException):
            stop.crash = said
        elif isinstance(said, _Settled):
            if said.asked is not None and stop.asked is None:
                stop.asked = (name, said.asked)
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
            run.notices.halted(step=step, reason=str(shown(reason)))
            return Halted(execution_id=run.execution_id, reason=reason, step=step)
        if stop.failure is not None:
            self._waits_failed(stop)
            step, error = stop.failure
            return run.roll_back_failed(step, error)
        if stop.asked is not None:
            step, asked = stop.asked
            return run.stop_as_asked(asked, last_step=step)
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
        return run.hand_off(next_step=following[0].name)

    def _waits_failed(self, stop: _Stop) -> None:
        """The run fails (or its deadline passed) while retries wait: each waiting retry is a
        failed attempt whose work started, recorded failed and compensated."""
        run = self.execution
        for name, waits in stop.waits.items():
            spec = run.definition.step(name)
            run.commit(
                run.failed_step(
                    spec,
                    waits.postponed.error,
                    waits.arguments,
                    attempts=waits.postponed.attempt,
                    started_at=None,
                    compensable=not spec.atomic,
                )
            )
            if not spec.atomic:
                run.state.compensation_due(name, waits.arguments, waits.postponed.error)
        stop.waits.clear()

    def _park(self, waits: dict[str, _Waits]) -> Rescheduled:
        """Park the run for the shortest backoff of the retries that wait; a task (or the
        sweeper) resumes it, and the attempts made are read back from the trace."""
        run = self.execution
        order = [s.name for s in run.definition.steps if s.name in waits]
        first = min(order, key=lambda name: waits[name].postponed.delay)
        delay = waits[first].postponed.delay
        event = run.event(
            EventKind.PARK,
            step=first,
            data={"waiting_for": "retry", "steps": order, "delay": delay},
        )
        return run.park(
            first,
            reason="retry",
            delay=delay,
            event=event,
            by_task=True,
            attempt=waits[first].postponed.attempt,
        )
