"""Running a reactor's steps and applying the rollback rule.

The executor is pure: it calls step code and hands every state change to a :class:`Journal`.
Steps run one at a time; the next step is always the first one, in declaration order, whose
dependencies are done, so the order depends only on which steps are done (a resumed run takes
the same path). The rollback rule:

1. a step that completed is tracked for undo (skipped steps are not);
2. the failing step is compensated only if its body started (never for argument or contract
   errors);
3. then every tracked step is undone, newest first;
4. a compensate or undo that fails does not stop the rest: it is reported in
   ``rollback_failures`` and the run ends ``needs_attention``;
5. ``Halt`` stops without rollback;
6. an exception from step code is a failure; a process interruption (KeyboardInterrupt,
   SystemExit, MemoryError) leaves the run ``aborted`` with its undo stack, for ``undo()``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import (
    ArgumentResolutionError,
    CorrelationIdTaken,
    ReactorError,
    ResultNotSerializable,
    UnitWaitTimeout,
)
from ..states import EventKind, ExecutionStatus, RollbackStatus, StepStatus
from . import probes
from .composition import ChildRunner
from .coordination import NOT_STARTED, Blocked, Coordinator, DispatchRefused, StepHold
from .definition import ReactorDefinition, StepSpec
from .journal import Event, InterruptWrite, Journal, JournalBatch, RollbackWrite, StepWrite
from .mapping import MapDone, MapRollbackPending, MapRunner, MapSourceError, MapStopped
from .observers import (
    CoordinationEvent,
    ExecutionEvent,
    RunObserver,
    StepEvent,
    composite,
    summarise,
)
from .outcomes import (
    Cancelled,
    Completed,
    Dispatched,
    ErrorInfo,
    ErrorKind,
    Failed,
    Failure,
    Halt,
    Halted,
    Outcome,
    Paused,
    PendingInterrupt,
    Rescheduled,
    RollbackFailure,
    Skip,
    StepOutcome,
    Success,
    as_step_outcome,
    exception_message,
    qualified_class_name,
)
from .redaction import redact
from .serialization import encode, printable, roundtrip, shown, unstorable
from .step import StepContext, acting
from .templates import ResolutionScope
from .validation import summarise_errors, validate

INTERRUPTIONS = (KeyboardInterrupt, SystemExit, MemoryError)

logger = logging.getLogger("django_reactor.executor")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


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


class Executor:
    """Runs one execution of a reactor against a journal."""

    def __init__(
        self,
        definition: ReactorDefinition,
        journal: Journal,
        *,
        inputs: Mapping[str, Any],
        state: RunState | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
        max_retry_delay: float | None = None,
        hand_off: bool = False,
        retry_later: bool = False,
        children: ChildRunner | None = None,
        park_poll: float = 2.0,
        attached: bool = False,
        issue_tokens: bool = False,
        observer: RunObserver | None = None,
        coordinator: Coordinator | None = None,
        hand_back_on_interruption: bool = False,
    ) -> None:
        self.definition = definition
        self.journal = journal
        self.inputs = inputs
        self.state = state or RunState()
        self.clock = clock
        self.sleep = sleep
        self.max_retry_delay = max_retry_delay
        # In the caller: stop at the reactor's background hand-off point. In a worker: park the
        # run for a retry's backoff instead of sleeping.
        background = definition.background
        self.hand_off_point = background if hand_off and background is not None else None
        self.retry_later = retry_later
        self.children = children
        self.park_poll = park_poll
        # A composed child: it parks with its parent, which holds the dispatch that resumes both.
        self.attached = attached
        # Give every interrupt reached a resume token (returned in the Paused outcome).
        self.issue_tokens = issue_tokens
        # In a worker, a process-level interruption (SystemExit, KeyboardInterrupt, MemoryError)
        # gives the run back for the message's redelivery instead of aborting it.
        self.hand_back_on_interruption = hand_back_on_interruption
        self._notes: list[Event] = []
        self._reached: dict[str, PendingInterrupt] = {}
        self._display_inputs: dict[str, Any] | None = None
        self._scope = ResolutionScope(inputs=inputs, results=self.state.results)
        # Lifecycle notifications, after each commit; None (the default) costs one test each.
        self.observer = composite(observer)
        # Locks, semaphores, rate limits, periods, ordered locks (None: nothing declared).
        self.coordinator = coordinator
        self._fences: dict[str, int] = {}
        self._acquisitions: list[CoordinationEvent] = []
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------ public

    @property
    def execution_id(self) -> Any:
        return self.journal.execution_id

    def run(self) -> Outcome:
        """Run every remaining step; return how the run ended."""
        coordinator = self.coordinator
        new = self.state.next_seq <= 2  # nothing but the start event: a new run
        if coordinator is None:
            return self._run(new)
        blocked = coordinator.enter(new=new)
        self._acquired()
        if blocked is not None:
            return self._blocked(blocked)
        outcome: Outcome | None = None
        try:
            outcome = self._run(new)
        finally:
            # Finished, failed or halted: released; paused: released (taken again on resume);
            # parked or handed off: kept for the process that resumes the run.
            coordinator.exit(outcome.status if outcome is not None else None)
        return outcome

    def _run(self, new: bool) -> Outcome:
        definition = self.definition
        point = self.hand_off_point
        if self.observer is not None:
            if new:
                self.observer.execution_started(self._run_event(ExecutionStatus.RUNNING))
            else:
                self.observer.execution_resumed(self._run_event(ExecutionStatus.RUNNING))
            self._tell_acquisitions()
        self._record_payloads()
        while True:
            spec = definition.next_ready(self.state.done, self.state.waiting)
            if spec is None:
                if self.state.waiting:
                    return self._pause()
                return self._complete()
            if point is not None and point.mode == "before" and spec.name == point.step:
                return self._hand_off(next_step=spec.name)
            if self.coordinator is not None and self.coordinator.lost:
                # A lock or slot lapsed while the run held it: take it again, or wait.
                blocked = self.coordinator.enter(new=False)
                self._acquired()
                self._tell_acquisitions()
                if blocked is not None:
                    return self._blocked(blocked)
            outcome = self._run_step(spec)
            if outcome is not None:
                return outcome

    def note(self, kind: str, data: dict[str, Any] | None = None) -> None:
        """Add a run-level entry to the trace (for example, a worker resuming the run).

        It is written with the next state change, in the same transaction: no commit of its own.
        """
        self._notes.append(self._event(kind, data=data))

    def arguments_for(self, step: str) -> dict[str, Any]:
        """Resolve a step's arguments from the inputs and stored results; ``{}`` if impossible."""
        spec = self.definition.step(step)
        try:
            arguments = self._resolve(spec)
        except ArgumentResolutionError:
            return {}
        if spec.contract is not None:
            validated, _errors = validate(spec.contract, arguments)
            return validated if validated is not None else arguments
        return arguments

    def adopt_in_flight(self, step: str, reason: str) -> None:
        """Record that ``step`` was running when its process died, so rollback compensates it.

        Its body may have done part of its work before the process stopped; the step never
        recorded an outcome, so it is marked failed (interrupted) and compensable.
        """
        spec = self.definition.step(step)
        arguments = self.arguments_for(step)
        error = ErrorInfo(
            kind=ErrorKind.INTERRUPTED,
            message=reason,
            step=step,
            reactor=self.definition.name,
            inputs=self._redacted_inputs(),
            arguments=redact(_displayable(arguments), spec.argument_secret_paths()),
        )
        self._commit(
            self._failed_step(spec, error, arguments, attempts=0, started_at=None, compensable=True)
        )
        self.state.pending_compensation.insert(0, PendingCompensation(step, arguments, error))

    def rollback(
        self, *, final_status: str, reason: str = "", failure: ErrorInfo | None = None
    ) -> list[RollbackFailure]:
        """Compensate pending failed steps, undo every completed step newest first, finish.

        Used by ``undo()``. The run ends ``final_status`` when everything rolled back,
        ``needs_attention`` otherwise. ``failure`` is the run's failure, if it failed: its
        ``rollback_failures`` are replaced by what this rollback could not do.

        Raises MapRollbackPending (after parking the run, ``rolling_back``) while workers undo a
        fanned-out map's elements; the run is woken to finish when they are done.
        """
        self._commit(
            JournalBatch(
                events=[self._event(EventKind.ROLLBACK, data={"reason": reason} if reason else {})],
                status=ExecutionStatus.ROLLING_BACK,
            )
        )
        if self.coordinator is not None:
            self.coordinator.enter_rollback()
        try:
            failures = self._rollback_all()
        except MapRollbackPending as pending:
            self._park_rollback(pending)
            if self.coordinator is not None:
                self.coordinator.exit(ExecutionStatus.ROLLING_BACK)
            raise
        except INTERRUPTIONS as exc:
            self._abort(exc)
            raise
        status = final_status if not failures else ExecutionStatus.NEEDS_ATTENTION
        kind = EventKind.CANCEL if status == ExecutionStatus.CANCELLED else EventKind.FAIL
        stored: dict[str, Any] | None
        if failures:
            if failure is None or failure.kind == ErrorKind.ROLLBACK:
                failure = ErrorInfo(
                    kind=ErrorKind.ROLLBACK,
                    message=f"{len(failures)} rollback action(s) failed during undo; "
                    "fix the cause and undo again",
                    reactor=self.definition.name,
                    inputs=self._redacted_inputs(),
                )
            stored = failure.with_rollback_failures(failures).to_dict()
        elif failure is None or failure.kind == ErrorKind.ROLLBACK:
            stored = None  # nothing failed, or only an earlier rollback that now succeeded
        else:
            stored = failure.with_rollback_failures([]).to_dict()
        data: dict[str, Any] = {"reason": reason} if reason else {}
        if kind == EventKind.FAIL:
            data["status"] = status
        self._commit(
            JournalBatch(
                events=[self._event(kind, data=data)],
                status=status,
                failure=stored,
                finished=True,
            )
        )
        if self.coordinator is not None:
            self.coordinator.exit(status)
        if self.observer is not None:
            run_event = self._run_event(status, reason=reason or None, failure=stored)
            if status == ExecutionStatus.CANCELLED:
                self.observer.execution_cancelled(run_event)
            else:
                self.observer.execution_failed(run_event)
        return failures

    # ------------------------------------------------------------------ steps

    def _run_step(self, spec: StepSpec) -> Outcome | None:
        started_at = self.clock()
        for unit in sorted(spec.depends_on & self.state.units):
            waiting = self._collect(unit, spec, started_at)
            if waiting is not None:
                return waiting
        try:
            arguments = self._resolve(spec)
        except ArgumentResolutionError as unresolved:
            error = self._error_info(unresolved, ErrorKind.ARGUMENT, spec, {}, attempts=0)
            return self._fail(spec, error, {}, started=False, started_at=started_at, attempts=0)
        if spec.contract is not None:
            validated = self._validate_contract(spec, arguments, started_at)
            if not isinstance(validated, dict):
                return validated
            # From here on the step's arguments are the contract's validated data: run, the
            # stored record, undo and compensate all see the same values.
            arguments = validated
        if spec.interrupt is not None:
            return self._reach_interrupt(spec, started_at)
        if spec.child is not None or spec.unit is not None:
            # A child's arguments are its stored inputs: refused before it is created.
            problem = unstorable(arguments)
            if problem is not None:
                unfit = ArgumentResolutionError(f"the arguments cannot be stored: {problem}")
                error = self._error_info(unfit, ErrorKind.ARGUMENT, spec, arguments, attempts=0)
                return self._fail(
                    spec, error, arguments, started=False, started_at=started_at, attempts=0
                )
            if spec.child is not None:
                return self._run_child(spec, arguments, started_at)
            return self._dispatch_unit(spec, arguments, started_at)
        if spec.map is not None:
            return self._run_map(spec, arguments, started_at)
        if spec.coordination and self.coordinator is not None:
            hold = self.coordinator.enter_step(spec.name, spec.coordination, arguments)
            self._acquired(spec.name)
            if isinstance(hold, Blocked):
                return self._step_blocked(spec, hold, arguments, started_at)
            self._fences = dict(hold.fences)
            try:
                return self._attempts(spec, arguments, started_at)
            finally:
                self._fences = {}
                hold.release(spec.name in self.state.done)
        return self._attempts(spec, arguments, started_at)

    def _attempts(
        self, spec: StepSpec, arguments: dict[str, Any], started_at: dt.datetime
    ) -> Outcome | None:
        """Run the step's body, retrying as its policy says; record how it ended."""
        attempt = self.state.attempts_done.pop(spec.name, 0)

        def abort(interruption: BaseException) -> None:
            self._abort(
                interruption,
                spec=spec,
                arguments=arguments,
                attempt=attempt,
                started_at=started_at,
            )

        while True:
            attempt += 1
            context = self._context(spec, "run", attempt)
            if self.observer is not None:
                self.observer.step_started(self._step_event(spec.name, "running", attempt))
            t0 = time.perf_counter()
            exc: BaseException | None = None
            try:
                if probes.active is not None:
                    probes.active("before_step", spec.name)
                with acting(context):
                    outcome: StepOutcome = as_step_outcome(spec.impl(context).run(**arguments))
            except INTERRUPTIONS as interruption:
                abort(interruption)
                raise
            except BaseException as raised:  # every other exception from step code is a failure
                exc = raised
                outcome = Failure(raised)
            duration = (time.perf_counter() - t0) * 1000

            if isinstance(outcome, Success | Skip):
                try:
                    stored, value = roundtrip(outcome.value)
                except ResultNotSerializable as bad:
                    error = self._error_info(bad, ErrorKind.RESULT, spec, arguments, attempt)
                    return self._fail(
                        spec,
                        error,
                        arguments,
                        started=True,
                        started_at=started_at,
                        attempts=attempt,
                    )
                return self._record_done(
                    spec, outcome, arguments, stored, value, attempt, started_at, duration
                )
            if isinstance(outcome, Halt):
                return self._halt(spec, outcome, arguments, attempt, started_at, duration)

            assert isinstance(outcome, Failure)
            if self._should_retry(spec, outcome, exc, attempt):
                delay = spec.retry.delay_after(attempt)
                if self.max_retry_delay is not None:
                    delay = min(delay, self.max_retry_delay)
                if self.retry_later and delay > 0:
                    return self._retry_later(spec, outcome, exc, attempt, delay, duration)
                self._commit(
                    JournalBatch(
                        events=[self._retry_event(spec, outcome, exc, attempt, duration, delay)],
                        current_step=spec.name,
                    )
                )
                self._notify_retry(spec, outcome, exc, attempt, duration, delay)
                if delay:
                    try:
                        self.sleep(delay)
                    except INTERRUPTIONS as interruption:
                        abort(interruption)
                        raise
                continue
            error = self._failure_info(outcome, exc, spec, arguments, attempt)
            return self._fail(
                spec, error, arguments, started=True, started_at=started_at, attempts=attempt
            )

    # ------------------------------------------------------------------ interrupts

    def _reach_interrupt(self, spec: StepSpec, started_at: dt.datetime) -> Outcome | None:
        """Record that the run waits at ``spec`` for a payload; other ready steps go on."""
        interrupt = spec.interrupt
        assert interrupt is not None
        try:
            correlation = interrupt.correlation_for(self._scope)
        except ValueError as exc:
            return self._correlation_failure(spec, started_at, f"interrupt {spec.name!r}: {exc}")
        expires_at = (
            self.clock() + dt.timedelta(seconds=interrupt.timeout)
            if interrupt.timeout is not None
            else None
        )
        token = secrets.token_urlsafe(32) if self.issue_tokens else None
        event = self._event(
            EventKind.INTERRUPT,
            step=spec.name,
            data={
                "correlation_id": correlation,
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
        )
        batch = JournalBatch(
            events=[event],
            step=_step_write(spec, StepStatus.WAITING, event, 0, {}, started_at),
            current_step=spec.name,
            interrupt=InterruptWrite(
                spec.name,
                correlation,
                expires_at,
                interrupt.max_attempts,
                interrupt.resume,
                hashlib.sha256(token.encode()).hexdigest() if token else None,
            ),
        )
        try:
            self._commit(batch)
        except CorrelationIdTaken as taken:
            return self._correlation_failure(
                spec,
                started_at,
                f"interrupt {spec.name!r}: correlation id {correlation!r} is already used by "
                f"execution {taken.execution_id} of {self.definition.name}, which waits for it; "
                "correlation ids must be unique among a reactor's waiting runs",
            )
        self.state.waiting.add(spec.name)
        self._reached[spec.name] = PendingInterrupt(spec.name, correlation, expires_at, token)
        return None

    def _correlation_failure(
        self, spec: StepSpec, started_at: dt.datetime, message: str
    ) -> Failed | Rescheduled:
        error = ErrorInfo(
            kind=ErrorKind.CORRELATION,
            message=message,
            step=spec.name,
            reactor=self.definition.name,
            retryable=False,
            inputs=self._redacted_inputs(),
        )
        return self._fail(spec, error, {}, started=False, started_at=started_at, attempts=0)

    def _pause(self) -> Paused:
        """Nothing else can run until a payload comes: release the run, waiting."""
        waiting = [s.name for s in self.definition.steps if s.name in self.state.waiting]
        self._commit(
            JournalBatch(
                events=[self._event(EventKind.PAUSE, data={"waiting_for": waiting})],
                status=ExecutionStatus.PAUSED,
                current_step=waiting[0],
                release=True,
            )
        )
        if self.observer is not None:
            self.observer.execution_paused(
                self._run_event(ExecutionStatus.PAUSED, step=waiting[0], waiting_for=tuple(waiting))
            )
        return Paused(
            execution_id=self.execution_id,
            interrupts=tuple(self._reached.get(name, PendingInterrupt(name)) for name in waiting),
            results=dict(self.state.results),
        )

    def _record_payloads(self) -> None:
        """Record the payloads accepted while the run was paused as their steps' results."""
        state = self.state
        for spec in self.definition.steps:
            if spec.name not in state.claimed:
                continue
            payload = state.claimed.pop(spec.name)
            event = self._event(EventKind.PAYLOAD, step=spec.name)
            self._commit(
                JournalBatch(
                    events=[event],
                    step=_step_write(
                        spec, StepStatus.COMPLETED, event, 1, {}, None, result=payload
                    ),
                    current_step=spec.name,
                )
            )
            state.waiting.discard(spec.name)
            state.results[spec.name] = payload
            state.done.add(spec.name)
            state.undo_stack.append(UndoEntry(spec.name, {}, payload))

    # ------------------------------------------------------------------ children

    def _run_child(
        self, spec: StepSpec, arguments: dict[str, Any], started_at: dt.datetime
    ) -> Outcome | None:
        """Run a composed reactor as this step; map its outcome onto the step."""
        runner = self._child_runner(spec)
        if self.observer is not None:
            self.observer.step_started(self._step_event(spec.name, "running", 1))
        t0 = time.perf_counter()
        try:
            outcome = runner.run(spec.name, spec.child.definition, arguments)
        except INTERRUPTIONS as interruption:
            self._abort(
                interruption, spec=spec, arguments=arguments, attempt=1, started_at=started_at
            )
            raise
        duration = (time.perf_counter() - t0) * 1000
        if isinstance(outcome, Completed):
            stored, value = roundtrip(outcome.value)
            return self._record_done(
                spec, Success(outcome.value), arguments, stored, value, 1, started_at, duration
            )
        if isinstance(outcome, Halted):
            return self._halt(spec, Halt(outcome.reason), arguments, 1, started_at, duration)
        if isinstance(outcome, Rescheduled):
            return self._park_with_child(spec, outcome)
        child_error = getattr(outcome, "error", None)
        name = spec.child.__qualname__
        if child_error is not None:
            error = ErrorInfo(
                **{
                    **child_error._fields(),
                    "message": f"composed {name} failed: {child_error}",
                    "step": spec.name,
                    "reactor": self.definition.name,
                    "inputs": self._redacted_inputs(),
                    "arguments": redact(_displayable(arguments), spec.argument_secret_paths()),
                    # What the child could not roll back is tried again by this step's
                    # compensation (the child's own rollback) and reported from there.
                    "rollback_failures": (),
                }
            )
        else:
            error = ErrorInfo(
                kind=ErrorKind.STEP,
                message=f"composed {name} ended {outcome.status}",
                step=spec.name,
                reactor=self.definition.name,
                inputs=self._redacted_inputs(),
            )
        # The child rolled itself back already. Compensating this step re-runs the child's
        # rollback, which does nothing unless part of it failed: then it is tried again here,
        # and once more by an operator's undo().
        return self._fail(spec, error, arguments, started=True, started_at=started_at, attempts=1)

    def _dispatch_unit(
        self, spec: StepSpec, arguments: dict[str, Any], started_at: dt.datetime
    ) -> Outcome | None:
        """Hand an async unit to workers; the run goes on with the steps that do not need it."""
        assert spec.unit_definition is not None
        try:
            unit_id = self._child_runner(spec).dispatch(spec.name, spec.unit_definition, arguments)
        except DispatchRefused as refused:
            error = ErrorInfo(
                kind="coordination",
                message=f"async unit {spec.name!r} was not dispatched: {refused}",
                step=spec.name,
                reactor=self.definition.name,
                inputs=self._redacted_inputs(),
            )
            return self._fail(
                spec, error, arguments, started=False, started_at=started_at, attempts=0
            )
        following = self.definition.next_ready(self.state.done | {spec.name}, self.state.waiting)
        event = self._event(EventKind.DISPATCH, step=spec.name, data={"execution_id": str(unit_id)})
        self._commit(
            JournalBatch(
                events=[event],
                step=_step_write(
                    spec,
                    StepStatus.DISPATCHED,
                    event,
                    0,
                    arguments,
                    started_at,
                    result={"execution_id": str(unit_id)},
                ),
                current_step=following.name if following is not None else spec.name,
            )
        )
        self.state.done.add(spec.name)
        self.state.units.add(spec.name)
        return None

    def _collect(self, unit: str, reader: StepSpec, started_at: dt.datetime) -> Outcome | None:
        """Get an async unit's outcome for ``reader``: wait inline, or park the run in a worker.

        Returns None once the outcome is in the results (its value, or its Failed/Halted
        outcome for the reader to decide on); otherwise how the run stopped.
        """
        runner = self._child_runner(reader)
        try:
            outcome = runner.settle(unit, wait=not self.retry_later)
        except UnitWaitTimeout as timeout:
            error = self._error_info(timeout, ErrorKind.ARGUMENT, reader, {}, attempts=0)
            return self._fail(reader, error, {}, started=False, started_at=started_at, attempts=0)
        if outcome is None:
            if self.retry_later:
                return self._park(reader, unit)
            error = ErrorInfo(
                kind=ErrorKind.ARGUMENT,
                message=f"async unit {unit!r} has not finished",
                step=reader.name,
                reactor=self.definition.name,
            )
            return self._fail(reader, error, {}, started=False, started_at=started_at, attempts=0)
        self.state.results[unit] = outcome.value if isinstance(outcome, Completed) else outcome
        self.state.units.discard(unit)
        return None

    def _park(self, reader: StepSpec, unit: str) -> Rescheduled:
        """Release the worker while ``reader`` waits for ``unit``; its completion wakes the run."""
        self._commit(
            JournalBatch(
                events=[self._event(EventKind.PARK, step=reader.name, data={"waiting_for": unit})],
                status=ExecutionStatus.PENDING,
                current_step=reader.name,
                release=True,
                # A safety net: if the wake-up message is lost, the sweeper wakes the run.
                wake_after=self.park_poll,
            )
        )
        self._notify_parked(reader.name, "park", self.park_poll)
        return Rescheduled(
            execution_id=self.execution_id, step=reader.name, delay=self.park_poll, reason="park"
        )

    def _park_with_child(self, spec: StepSpec, child: Rescheduled) -> Rescheduled:
        """A composed child waits (a retry's backoff, an async unit): the run waits with it.

        The worker is released; the retry's dispatch (or the unit's completion) resumes this run,
        which re-enters the compose step and continues the child where it stopped.
        """
        retry = child.reason == "retry"
        self._commit(
            JournalBatch(
                events=[
                    self._event(
                        EventKind.PARK,
                        step=spec.name,
                        data={"child_step": child.step, "reason": child.reason},
                    )
                ],
                status=ExecutionStatus.PENDING,
                current_step=spec.name,
                release=True,
                wake_after=child.delay,
                dispatch="retry" if retry and not self.attached else None,
                dispatch_delay=child.delay,
            )
        )
        self._notify_parked(spec.name, child.reason, child.delay)
        return Rescheduled(
            execution_id=self.execution_id, step=spec.name, delay=child.delay, reason=child.reason
        )

    # ------------------------------------------------------------------ maps

    def _run_map(
        self, spec: StepSpec, arguments: dict[str, Any], started_at: dt.datetime
    ) -> Outcome | None:
        """Run a ``map_over`` step: its elements inline, or on workers while the run waits."""
        map_spec = spec.map
        assert map_spec is not None
        runner = self._map_runner(spec)
        try:
            source = map_spec.resolve_source(self._scope, arguments)
        except ArgumentResolutionError as unresolved:
            error = self._error_info(unresolved, ErrorKind.ARGUMENT, spec, arguments, attempts=0)
            return self._fail(
                spec, error, arguments, started=False, started_at=started_at, attempts=0
            )
        if self.observer is not None:
            self.observer.step_started(self._step_event(spec.name, "running", 1))
        t0 = time.perf_counter()
        try:
            outcome = runner.run_map(spec.name, map_spec, source, arguments)
        except MapSourceError as bad:
            error = self._error_info(bad, ErrorKind.ARGUMENT, spec, arguments, attempts=0)
            return self._fail(
                spec, error, arguments, started=False, started_at=started_at, attempts=0
            )
        except INTERRUPTIONS as interruption:
            self._abort(
                interruption, spec=spec, arguments=arguments, attempt=1, started_at=started_at
            )
            raise
        duration = (time.perf_counter() - t0) * 1000
        if isinstance(outcome, MapDone):
            try:
                stored, value = roundtrip(outcome.value)
            except ResultNotSerializable as unstorable:
                error = self._error_info(unstorable, ErrorKind.RESULT, spec, arguments, 1)
                return self._fail(
                    spec, error, arguments, started=True, started_at=started_at, attempts=1
                )
            return self._record_done(
                spec, Success(outcome.value), arguments, stored, value, 1, started_at, duration
            )
        if isinstance(outcome, MapStopped):
            if outcome.error is None:
                return self._halt(
                    spec, Halt(outcome.halt_reason or ""), arguments, 1, started_at, duration
                )
            error = ErrorInfo(
                **{
                    **outcome.error._fields(),
                    "step": spec.name,
                    "reactor": self.definition.name,
                    "inputs": self._redacted_inputs(),
                    "arguments": redact(_displayable(arguments), spec.argument_secret_paths()),
                }
            )
            # Elements that completed are undone by this step's compensation (the map's
            # rollback); the failed ones rolled themselves back.
            return self._fail(
                spec, error, arguments, started=True, started_at=started_at, attempts=1
            )
        return self._park_map(spec, runner)

    def _park_map(self, spec: StepSpec, runner: MapRunner) -> Outcome:
        """The elements run on workers: release the run; the last element to settle wakes it."""
        self._commit(
            JournalBatch(
                events=[
                    self._event(
                        EventKind.PARK,
                        step=spec.name,
                        data={"waiting_for": "map", "map": spec.name},
                    )
                ],
                status=ExecutionStatus.PENDING,
                current_step=spec.name,
                release=True,
                wake_after=self.park_poll,
            )
        )
        self._notify_parked(spec.name, "map", self.park_poll)
        runner.map_parked(spec.name)
        if self.retry_later or self.attached:
            return Rescheduled(
                execution_id=self.execution_id, step=spec.name, delay=self.park_poll, reason="map"
            )
        return Dispatched(execution_id=self.execution_id, results=dict(self.state.results))

    def _park_rollback(self, pending: MapRollbackPending) -> Rescheduled:
        """A map's elements are being undone on workers: release the run, rolling back.

        The map may be a composed child's: the child parked first, and its map wakes this run.
        """
        own = pending.step in self.definition.by_name
        step = pending.step if own else ""
        self._commit(
            JournalBatch(
                events=[
                    self._event(
                        EventKind.PARK,
                        step=step,
                        data={"waiting_for": "map rollback", "map": pending.step},
                    )
                ],
                status=ExecutionStatus.ROLLING_BACK,
                release=True,
                wake_after=self.park_poll,
            )
        )
        self._notify_parked(step, "map_rollback", self.park_poll)
        if own:
            self._map_runner(self.definition.step(step)).map_parked(step)
        return Rescheduled(
            execution_id=self.execution_id,
            step=step,
            delay=self.park_poll,
            reason="map_rollback",
            status=ExecutionStatus.ROLLING_BACK,
        )

    def _rollback_map(
        self, spec: StepSpec, ok_kind: str, failed_kind: str, ok_status: str
    ) -> list[RollbackFailure]:
        """Undo a map's completed elements (its own rollback; failed elements undid theirs)."""
        assert spec.map is not None
        t0 = time.perf_counter()
        failures = self._map_runner(spec).rollback_map(spec.name, spec.map)
        return self._record_nested_rollback(
            spec,
            failures,
            f"{len(failures)} map element rollback(s) failed",
            (time.perf_counter() - t0) * 1000,
            ok_kind,
            failed_kind,
            ok_status,
        )

    def _map_runner(self, spec: StepSpec) -> MapRunner:
        runner = self.children
        if runner is None or not hasattr(runner, "run_map"):
            raise ReactorError(
                f"step {spec.name!r} is a map and needs a map runner, but this executor has none"
            )
        return runner  # type: ignore[return-value]

    def _child_runner(self, spec: StepSpec) -> ChildRunner:
        if self.children is None:
            raise ReactorError(
                f"step {spec.name!r} needs a child runner (compose, async_step, async_reactor), "
                "but this executor has none"
            )
        return self.children

    def _resolve(self, spec: StepSpec) -> dict[str, Any]:
        scope = self._scope
        return {name: template.resolve(scope) for name, template in spec.arguments.items()}

    def _validate_contract(
        self, spec: StepSpec, arguments: dict[str, Any], started_at: dt.datetime
    ) -> dict[str, Any] | Failed | Rescheduled:
        assert spec.contract is not None
        validated, errors = validate(spec.contract, arguments)
        if validated is not None:
            return validated
        error = ErrorInfo(
            kind=ErrorKind.CONTRACT,
            message=(
                f"the arguments of step {spec.name!r} do not satisfy "
                f"{_contract_owner(spec)}.Inputs: {summarise_errors(errors)}"
            ),
            step=spec.name,
            reactor=self.definition.name,
            exception_class=None,
            field_errors=errors,
            retryable=False,
            inputs=self._redacted_inputs(),
            arguments=redact(_displayable(arguments), spec.argument_secret_paths()),
        )
        return self._fail(spec, error, arguments, started=False, started_at=started_at, attempts=0)

    def _should_retry(
        self, spec: StepSpec, outcome: Failure, exc: BaseException | None, attempt: int
    ) -> bool:
        if attempt >= spec.retry.attempts or not outcome.retryable:
            return False
        error = exc if exc is not None else outcome.error
        if isinstance(error, BaseException):
            return spec.retry.retries_exception(error)
        return True

    def _record_done(
        self,
        spec: StepSpec,
        outcome: Success | Skip,
        arguments: dict[str, Any],
        stored: Any,
        value: Any,
        attempt: int,
        started_at: dt.datetime,
        duration: float,
    ) -> Outcome | None:
        skipped = isinstance(outcome, Skip)
        # The cursor names the step that runs next, so that if this process dies during it,
        # whoever takes the run over knows which step was in flight.
        following = self.definition.next_ready(self.state.done | {spec.name}, self.state.waiting)
        if probes.active is not None:
            probes.active("before_step_commit", spec.name)
        event = self._event(
            EventKind.SKIP if skipped else EventKind.RUN,
            step=spec.name,
            attempt=attempt,
            duration_ms=duration,
        )
        batch = JournalBatch(
            events=[event],
            step=_step_write(
                spec,
                StepStatus.SKIPPED if skipped else StepStatus.COMPLETED,
                event,
                attempt,
                arguments,
                started_at,
                result=stored,
            ),
            current_step=following.name if following is not None else spec.name,
        )
        state = self.state
        state.results[spec.name] = value
        state.done.add(spec.name)
        if not skipped:
            state.undo_stack.append(UndoEntry(spec.name, arguments, value))
        done = (
            self._step_event(
                spec.name,
                StepStatus.SKIPPED if skipped else StepStatus.COMPLETED,
                attempt,
                duration_ms=duration,
            )
            if self.observer is not None
            else None
        )
        if following is None and not state.waiting:
            # The last step: its checkpoint and the run's completion commit together.
            completed = self._complete(batch, step_done=done)
            if probes.active is not None:
                probes.active("after_step_commit", spec.name)
            return completed
        cancel = self._commit(batch)
        if done is not None and self.observer is not None:
            self.observer.step_completed(done)
        if probes.active is not None:
            probes.active("after_step_commit", spec.name)
        if cancel is not None:
            # Cancellation takes effect between steps; after the last one the run is complete.
            return self._cancelled(cancel, last_step=spec.name)
        point = self.hand_off_point
        if (
            point is not None
            and point.mode == "after"
            and point.step == spec.name
            and following is not None
        ):
            return self._hand_off(next_step=following.name)
        return None

    def _hand_off(self, *, next_step: str) -> Dispatched:
        """Move the rest of the run to a Celery worker (once: workers never hand off)."""
        self._commit(
            JournalBatch(
                events=[self._event(EventKind.HANDOFF, data={"next_step": next_step})],
                status=ExecutionStatus.PENDING,
                current_step=next_step,
                release=True,
                handed_off=True,
                dispatch="handoff",
            )
        )
        if self.observer is not None:
            self.observer.execution_handed_off(
                self._run_event(ExecutionStatus.PENDING, step=next_step)
            )
        self.hand_off_point = None
        return Dispatched(execution_id=self.execution_id, results=dict(self.state.results))

    def _retry_event(
        self,
        spec: StepSpec,
        outcome: Failure,
        exc: BaseException | None,
        attempt: int,
        duration: float,
        delay: float,
    ) -> Event:
        return self._event(
            EventKind.RETRY,
            step=spec.name,
            attempt=attempt,
            duration_ms=duration,
            data={**_error_summary(outcome, exc), "delay": delay},
        )

    def _retry_later(
        self,
        spec: StepSpec,
        outcome: Failure,
        exc: BaseException | None,
        attempt: int,
        delay: float,
        duration: float,
    ) -> Rescheduled:
        """Park the run for the retry's backoff; a task (or the sweeper) resumes it."""
        self._commit(
            JournalBatch(
                events=[self._retry_event(spec, outcome, exc, attempt, duration, delay)],
                status=ExecutionStatus.PENDING,
                current_step=spec.name,
                current_attempt=attempt,
                release=True,
                wake_after=delay,
                dispatch=None if self.attached else "retry",
                dispatch_delay=delay,
            )
        )
        self._notify_retry(spec, outcome, exc, attempt, duration, delay)
        self._notify_parked(spec.name, "retry", delay)
        return Rescheduled(execution_id=self.execution_id, step=spec.name, delay=delay)

    def _halt(
        self,
        spec: StepSpec,
        outcome: Halt,
        arguments: dict[str, Any],
        attempt: int,
        started_at: dt.datetime,
        duration: float,
    ) -> Outcome:
        reason = shown(outcome.reason)
        event = self._event(
            EventKind.HALT,
            step=spec.name,
            attempt=attempt,
            duration_ms=duration,
            data={"reason": reason},
        )
        self._commit(
            JournalBatch(
                events=[event],
                step=_step_write(
                    spec, StepStatus.HALTED, event, attempt, arguments, started_at, result=reason
                ),
                status=ExecutionStatus.HALTED,
                current_step=spec.name,
                result={"halted_at": spec.name, "reason": reason},
                finished=True,
            )
        )
        if self.observer is not None:
            self.observer.execution_halted(
                self._run_event(ExecutionStatus.HALTED, step=spec.name, reason=str(reason))
            )
        return Halted(execution_id=self.execution_id, reason=outcome.reason, step=spec.name)

    # ------------------------------------------------------------------ failure and rollback

    def _fail(
        self,
        spec: StepSpec,
        error: ErrorInfo,
        arguments: dict[str, Any],
        *,
        started: bool,
        started_at: dt.datetime,
        attempts: int,
    ) -> Failed | Rescheduled:
        batch = self._failed_step(
            spec, error, arguments, attempts=attempts, started_at=started_at, compensable=started
        )
        batch.status = ExecutionStatus.ROLLING_BACK
        batch.failure = error.to_dict()  # known now, even if rollback is cut short
        self._commit(batch)
        if self.observer is not None:
            self.observer.step_failed(
                self._step_event(
                    spec.name,
                    error.kind,
                    attempts,
                    error=error.message,
                    error_class=error.exception_class,
                )
            )
        if started:
            self.state.pending_compensation.append(PendingCompensation(spec.name, arguments, error))
        try:
            failures = self._rollback_all()
        except MapRollbackPending as pending:
            return self._park_rollback(pending)
        except INTERRUPTIONS as exc:
            self._abort(exc)
            raise
        final = error.with_rollback_failures([*error.rollback_failures, *failures])
        status = (
            ExecutionStatus.FAILED
            if not final.rollback_failures
            else ExecutionStatus.NEEDS_ATTENTION
        )
        self._commit(
            JournalBatch(
                events=[self._event(EventKind.FAIL, data={"status": status})],
                status=status,
                failure=final.to_dict(),
                finished=True,
            )
        )
        if self.observer is not None:
            self.observer.execution_failed(
                self._run_event(status, step=spec.name, failure=final.to_dict())
            )
        return Failed(execution_id=self.execution_id, error=final, status=status)

    def _failed_step(
        self,
        spec: StepSpec,
        error: ErrorInfo,
        arguments: dict[str, Any],
        *,
        attempts: int,
        started_at: dt.datetime | None,
        compensable: bool,
    ) -> JournalBatch:
        """The ``fail`` trace entry and the failed step record, as one batch to commit."""
        event = self._event(
            EventKind.FAIL,
            step=spec.name,
            attempt=attempts,
            data={
                "kind": error.kind,
                "error": error.message,
                "exception_class": error.exception_class,
            },
        )
        return JournalBatch(
            events=[event],
            step=_step_write(
                spec,
                StepStatus.FAILED,
                event,
                attempts,
                arguments,
                started_at,
                error=error.to_dict(),
                compensable=compensable,
            ),
            current_step=spec.name,
        )

    def _rollback_all(self) -> list[RollbackFailure]:
        failures: list[RollbackFailure] = []
        state = self.state
        while state.pending_compensation:
            pending = state.pending_compensation[0]
            failures.extend(
                self._rollback_one(
                    self.definition.step(pending.step),
                    "compensate",
                    pending.error,
                    pending.arguments,
                )
            )
            state.pending_compensation.pop(0)
        while state.undo_stack:
            entry = state.undo_stack[-1]
            failures.extend(
                self._rollback_one(
                    self.definition.step(entry.step), "undo", entry.result, entry.arguments
                )
            )
            state.undo_stack.pop()
        return failures

    def _rollback_one(
        self, spec: StepSpec, action: str, first: Any, arguments: dict[str, Any]
    ) -> list[RollbackFailure]:
        """Undo or compensate one step; return what could not be rolled back."""
        kinds = {
            "undo": (
                EventKind.UNDO,
                EventKind.UNDO_FAILED,
                EventKind.UNDO_SKIPPED,
                RollbackStatus.UNDONE,
            ),
            "compensate": (
                EventKind.COMPENSATE,
                EventKind.COMPENSATE_FAILED,
                EventKind.COMPENSATE_SKIPPED,
                RollbackStatus.COMPENSATED,
            ),
        }
        ok_kind, failed_kind, skipped_kind, ok_status = kinds[action]
        if spec.child is not None:
            return self._rollback_child(spec, ok_kind, failed_kind, ok_status)
        if spec.map is not None:
            return self._rollback_map(spec, ok_kind, failed_kind, ok_status)
        if spec.unit is not None:
            return []  # async units own their rollback; the parent never undoes them
        has_handler = spec.has_undo if action == "undo" else spec.has_compensate
        if not has_handler:
            event = self._event(skipped_kind, step=spec.name)
            self._commit(
                JournalBatch(
                    events=[event],
                    rollback=RollbackWrite(spec.name, RollbackStatus.NO_HANDLER, event.at),
                )
            )
            self._notify_rollback(action, spec.name, RollbackStatus.NO_HANDLER, None, None)
            return []

        signature = spec.undo_signature if action == "undo" else spec.compensate_signature
        hold: StepHold | None = None
        if spec.coordination and self.coordinator is not None:
            taken = self.coordinator.enter_step_rollback(spec.name, spec.coordination, arguments)
            self._acquired(spec.name)
            if isinstance(taken, Blocked):
                return self._rollback_blocked(spec, action, failed_kind, taken)
            hold = taken
        context = self._context(spec, action, 1)
        if probes.active is not None:
            probes.active(f"before_{action}", spec.name)
        t0 = time.perf_counter()
        failure: RollbackFailure | None = None
        try:
            with acting(context):
                returned = getattr(spec.impl(context), action)(first, **signature.filter(arguments))
            if isinstance(returned, Failure):
                error = returned.error
                failure = RollbackFailure(
                    step=spec.name,
                    action=action,
                    exception_class=(
                        qualified_class_name(error) if isinstance(error, BaseException) else None
                    ),
                    message=str(error),
                )
        except INTERRUPTIONS:
            raise
        except BaseException as exc:
            failure = RollbackFailure(
                step=spec.name,
                action=action,
                exception_class=qualified_class_name(exc),
                message=exception_message(exc),
            )
        finally:
            if hold is not None:
                hold.release(True)
        duration = (time.perf_counter() - t0) * 1000
        if failure is None:
            event = self._event(ok_kind, step=spec.name, duration_ms=duration)
            rollback = RollbackWrite(spec.name, ok_status, event.at)
        else:
            event = self._event(
                failed_kind,
                step=spec.name,
                duration_ms=duration,
                data={"error": failure.message, "exception_class": failure.exception_class},
            )
            rollback = RollbackWrite(
                spec.name, RollbackStatus.FAILED, event.at, error=failure.to_dict()
            )
        self._commit(JournalBatch(events=[event], rollback=rollback))
        self._notify_rollback(action, spec.name, rollback.status, duration, failure)
        return [failure] if failure is not None else []

    def _rollback_blocked(
        self, spec: StepSpec, action: str, failed_kind: str, blocked: Blocked
    ) -> list[RollbackFailure]:
        """The step's lock could not be held for its rollback: the handler does not run
        unlocked; the failure is recorded for ``undo()`` to try again."""
        failure = RollbackFailure(
            step=spec.name,
            action=action,
            exception_class=None,
            message=f"the {action} did not run: {blocked.message}; {action} again once it is free",
            kind=ErrorKind.COORDINATION_UNAVAILABLE,
        )
        event = self._event(
            failed_kind, step=spec.name, data={"error": failure.message, "kind": failure.kind}
        )
        rollback = RollbackWrite(
            spec.name, RollbackStatus.FAILED, event.at, error=failure.to_dict()
        )
        self._commit(JournalBatch(events=[event], rollback=rollback))
        self._notify_rollback(action, spec.name, rollback.status, None, failure)
        return [failure]

    def _rollback_child(
        self, spec: StepSpec, ok_kind: str, failed_kind: str, ok_status: str
    ) -> list[RollbackFailure]:
        """Undo (or, cut off mid-run, compensate) a composed child: its own rollback."""
        t0 = time.perf_counter()
        failures = [_nested(spec.name, f) for f in self._child_runner(spec).rollback(spec.name)]
        return self._record_nested_rollback(
            spec,
            failures,
            f"{len(failures)} step(s) of the composed reactor could not be rolled back",
            (time.perf_counter() - t0) * 1000,
            ok_kind,
            failed_kind,
            ok_status,
        )

    def _record_nested_rollback(
        self,
        spec: StepSpec,
        failures: list[RollbackFailure],
        summary: str,
        duration: float,
        ok_kind: str,
        failed_kind: str,
        ok_status: str,
    ) -> list[RollbackFailure]:
        """Record the rollback of a step that rolls back steps of its own (a composed child,
        a map's elements): undone, or failed with what could not be rolled back."""
        if failures:
            event = self._event(
                failed_kind, step=spec.name, duration_ms=duration, data={"error": summary}
            )
            rollback = RollbackWrite(
                spec.name,
                RollbackStatus.FAILED,
                event.at,
                error={"failures": [f.to_dict() for f in failures]},
            )
        else:
            event = self._event(ok_kind, step=spec.name, duration_ms=duration)
            rollback = RollbackWrite(spec.name, ok_status, event.at)
        self._commit(JournalBatch(events=[event], rollback=rollback))
        self._notify_rollback(
            "undo" if ok_kind == EventKind.UNDO else "compensate",
            spec.name,
            rollback.status,
            duration,
            failures[0] if failures else None,
        )
        return failures

    def _abort(
        self,
        exc: BaseException,
        *,
        spec: StepSpec | None = None,
        arguments: dict[str, Any] | None = None,
        attempt: int = 0,
        started_at: dt.datetime | None = None,
    ) -> None:
        """Record that the process was interrupted; the undo stack stays for ``undo()``.

        In a worker (``hand_back_on_interruption``) the run is not aborted: it keeps its status
        and its lease ends now, so the redelivered message (or the sweeper) resumes it at once,
        counting one recovery; the step that was in flight runs again.
        """
        if self.hand_back_on_interruption:
            self._hand_back(exc, spec=spec, attempt=attempt)
            return
        if spec is not None:
            error = self._error_info(exc, ErrorKind.INTERRUPTED, spec, arguments or {}, attempt)
            batch = self._failed_step(
                spec,
                error,
                arguments or {},
                attempts=attempt,
                started_at=started_at,
                compensable=True,
            )
            batch.failure = error.to_dict()
        else:
            batch = JournalBatch()
        batch.status = ExecutionStatus.ABORTED
        batch.finished = True
        batch.events.append(
            self._event(EventKind.ABORT, data={"exception_class": qualified_class_name(exc)})
        )
        try:
            self._commit(batch)
        except Exception:  # the interruption must still propagate; say what was lost
            logger.exception(
                "could not record that execution %s was aborted; it stays in its last "
                "checkpointed state",
                self.execution_id,
            )

    def _hand_back(self, exc: BaseException, *, spec: StepSpec | None, attempt: int) -> None:
        data: dict[str, Any] = {"exception_class": qualified_class_name(exc), "resumable": True}
        if attempt:
            data["attempt"] = attempt
        batch = JournalBatch(
            events=[self._event(EventKind.HAND_BACK, step=spec.name if spec else "", data=data)],
            expire_lease=True,
        )
        try:
            self._commit(batch)
        except Exception:  # the interruption must still propagate; the lease lapses by itself
            logger.exception(
                "could not hand execution %s back after the process was interrupted; it is "
                "resumed when its lease expires",
                self.execution_id,
            )

    # ------------------------------------------------------------------ endings

    def _complete(
        self, batch: JournalBatch | None = None, *, step_done: StepEvent | None = None
    ) -> Completed:
        """Finish the run, in ``batch`` (the last step's checkpoint) when there is one."""
        definition = self.definition
        if definition.returns is not None:
            value = self.state.results.get(definition.returns)
            stored = encode(value)
        else:
            # Async units' outcomes belong to the steps that read them, not to the run's value.
            value = {
                name: result
                for name, result in self.state.results.items()
                if definition.by_name[name].unit is None
            }
            # Each result as its step stored it: nested one level deeper, still storable.
            stored = {name: encode(result) for name, result in value.items()}
        batch = batch or JournalBatch()
        batch.events.append(self._event(EventKind.COMPLETE))
        batch.status = ExecutionStatus.COMPLETED
        batch.result = stored
        batch.finished = True
        self._commit(batch)
        if self.observer is not None:
            if step_done is not None:
                self.observer.step_completed(step_done)
            self.observer.execution_completed(self._run_event(ExecutionStatus.COMPLETED))
        return Completed(execution_id=self.execution_id, value=value)

    def _cancelled(self, reason: str, *, last_step: str) -> Cancelled:
        self._commit(
            JournalBatch(
                events=[self._event(EventKind.CANCEL, data={"reason": reason})],
                status=ExecutionStatus.CANCELLED,
                current_step=last_step,  # nothing is in flight: the next step never started
                finished=True,
            )
        )
        if self.observer is not None:
            self.observer.execution_cancelled(
                self._run_event(ExecutionStatus.CANCELLED, step=last_step, reason=reason)
            )
        return Cancelled(execution_id=self.execution_id, reason=reason)

    # ------------------------------------------------------------------ notifications

    def _run_event(
        self,
        status: str,
        *,
        failure: dict[str, Any] | None = None,
        **fields: Any,
    ) -> ExecutionEvent:
        if failure is not None:
            fields.setdefault("step", failure.get("step"))
            fields["error"] = summarise(failure.get("message"))
            fields["error_class"] = failure.get("exception_class")
        return ExecutionEvent(
            execution_id=self.execution_id,
            reactor=self.definition.name,
            status=str(status),
            duration_ms=(time.perf_counter() - self._t0) * 1000,
            **fields,
        )

    def _step_event(self, step: str, status: str, attempt: int, **fields: Any) -> StepEvent:
        if "error" in fields:
            fields["error"] = summarise(fields["error"])
        return StepEvent(
            execution_id=self.execution_id,
            reactor=self.definition.name,
            step=step,
            status=str(status),
            attempt=attempt,
            **fields,
        )

    def _notify_retry(
        self,
        spec: StepSpec,
        outcome: Failure,
        exc: BaseException | None,
        attempt: int,
        duration: float,
        delay: float,
    ) -> None:
        if self.observer is None:
            return
        summary = _error_summary(outcome, exc)
        self.observer.step_retried(
            self._step_event(
                spec.name,
                "retry",
                attempt,
                duration_ms=duration,
                error=summary["error"],
                error_class=summary["exception_class"],
                delay=delay,
            )
        )

    def _notify_parked(self, step: str, reason: str, delay: float) -> None:
        if self.observer is not None:
            self.observer.execution_parked(
                self._run_event(ExecutionStatus.PENDING, step=step, reason=reason, delay=delay)
            )

    def _notify_rollback(
        self,
        action: str,
        step: str,
        status: str,
        duration: float | None,
        failure: RollbackFailure | None,
    ) -> None:
        if self.observer is None:
            return
        event = self._step_event(
            step,
            status,
            1,
            duration_ms=duration,
            error=failure.message if failure is not None else None,
            error_class=failure.exception_class if failure is not None else None,
        )
        if action == "undo":
            self.observer.step_undone(event)
        else:
            self.observer.step_compensated(event)

    # ------------------------------------------------------------------ helpers

    def _commit(self, batch: JournalBatch) -> str | None:
        if self.state.waiting and (batch.finished or batch.status == ExecutionStatus.ROLLING_BACK):
            batch.close_interrupts = True
            self.state.waiting.clear()
        if self._notes:
            batch.events[:0] = self._notes
            self._notes = []
        return self.journal.commit(batch)

    def _event(
        self,
        kind: str,
        *,
        step: str = "",
        attempt: int = 0,
        duration_ms: float | None = None,
        data: dict[str, Any] | None = None,
    ) -> Event:
        seq = self.state.next_seq
        self.state.next_seq = seq + 1
        return Event(seq, kind, self.clock(), step, attempt, duration_ms, data or {})

    def _context(self, spec: StepSpec, action: str, attempt: int) -> StepContext:
        return StepContext(
            execution_id=self.execution_id,
            reactor=self.definition.name,
            step=spec.name,
            action=action,
            attempt=attempt,
            inputs=self.inputs,
            fences=self._fences
            or (dict(self.coordinator.fences) if self.coordinator is not None else {}),
        )

    # ------------------------------------------------------------------ coordination

    def _acquired(self, step: str = "") -> None:
        """Put what the coordinator just acquired in the trace (with the next state change),
        and tell the observers (a run's own acquisitions once it has started)."""
        coordinator = self.coordinator
        if coordinator is not None and coordinator.notes:
            for data in coordinator.notes:
                self._notes.append(self._event(EventKind.ACQUIRE, step=step, data=data))
                if self.observer is not None:
                    self._acquisitions.append(self._coordination_event(data, step))
            coordinator.notes.clear()
        if step:
            self._tell_acquisitions()

    def _coordination_event(self, data: dict[str, Any], step: str) -> CoordinationEvent:
        kind = next((k for k in ("lock", "semaphore", "rate_limit", "period") if k in data), "lock")
        return CoordinationEvent(
            execution_id=self.execution_id,
            reactor=self.definition.name,
            kind=kind,
            key=str(data.get(kind, "")),
            step=step or None,
            fence=data.get("fence"),
        )

    def _tell_acquisitions(self) -> None:
        if self.observer is not None:
            for event in self._acquisitions:
                self.observer.coordination_acquired(event)
        self._acquisitions.clear()

    def _blocked(self, blocked: Blocked) -> Outcome:
        """The run's coordination cannot be held now: halt, fail, wait on a worker, or hand
        the run to a worker (an inline caller never sleeps for it once steps have run)."""
        state = self.state
        if blocked.kind == "halt":
            reason = blocked.message
            self._commit(
                JournalBatch(
                    events=[self._event(EventKind.HALT, data={"reason": reason})],
                    status=ExecutionStatus.HALTED,
                    result={"halted_at": "", "reason": reason},
                    finished=True,
                    close_interrupts=True,
                )
            )
            if self.coordinator is not None:
                self.coordinator.exit(ExecutionStatus.HALTED)
            if self.observer is not None:
                self.observer.execution_halted(
                    self._run_event(ExecutionStatus.HALTED, reason=reason)
                )
            return Halted(execution_id=self.execution_id, reason=reason, step=None)
        waiting = blocked.kind in ("contention", "unavailable")
        if waiting and self.retry_later:
            if self.coordinator is not None and not self.coordinator.snoozes_left():
                blocked = Blocked(
                    "fail",
                    f"{blocked.message}; gave up after REACTOR['MAX_CONTENTION_SNOOZES'] "
                    "reschedules",
                    error_kind=blocked.error_kind,
                )
            else:
                return self._snooze(blocked, step="")
        elif waiting and (state.done or state.undo_stack):
            # Steps ran already (a resumed run): a worker goes on once it can hold them.
            self._commit(
                JournalBatch(
                    events=[
                        self._event(
                            EventKind.HANDOFF,
                            data={"waiting_for": blocked.message, "delay": blocked.retry_after},
                        )
                    ],
                    status=ExecutionStatus.PENDING,
                    release=True,
                    handed_off=True,
                    dispatch="retry",
                    dispatch_delay=blocked.retry_after,
                    wake_after=blocked.retry_after,
                )
            )
            return Dispatched(execution_id=self.execution_id, results=dict(state.results))
        error = ErrorInfo(
            kind=blocked.error_kind,
            message=blocked.message,
            reactor=self.definition.name,
            retryable=blocked.retryable,
            inputs=self._redacted_inputs(),
        )
        if state.undo_stack or state.pending_compensation:
            self.rollback(final_status=ExecutionStatus.FAILED, failure=error)
            return Failed(execution_id=self.execution_id, error=error)
        self._commit(
            JournalBatch(
                events=[
                    self._event(EventKind.FAIL, data={"kind": error.kind, "error": error.message})
                ],
                status=ExecutionStatus.FAILED,
                failure=error.to_dict(),
                finished=True,
                close_interrupts=True,
            )
        )
        if self.coordinator is not None:
            # Nothing ran: it leaves its ordered-lock queue without halting the chain.
            self.coordinator.exit(NOT_STARTED if not state.done else ExecutionStatus.FAILED)
        if self.observer is not None:
            self.observer.execution_failed(
                self._run_event(ExecutionStatus.FAILED, failure=error.to_dict())
            )
        return Failed(execution_id=self.execution_id, error=error)

    def _snooze(self, blocked: Blocked, *, step: str) -> Rescheduled:
        """Reschedule the run (not retry it): it holds nothing and no worker meanwhile."""
        delay = max(blocked.retry_after, 0.05)
        self._commit(
            JournalBatch(
                events=[
                    self._event(
                        EventKind.PARK,
                        step=step,
                        data={
                            "waiting_for": blocked.message,
                            "reason": blocked.kind,
                            "delay": delay,
                        },
                    )
                ],
                status=ExecutionStatus.PENDING,
                current_step=step or None,
                release=True,
                wake_after=delay,
                dispatch="retry" if not self.attached else None,
                dispatch_delay=delay,
            )
        )
        self._notify_parked(step, "contention", delay)
        return Rescheduled(
            execution_id=self.execution_id, step=step, delay=delay, reason="contention"
        )

    def _step_blocked(
        self, spec: StepSpec, blocked: Blocked, arguments: dict[str, Any], started_at: dt.datetime
    ) -> Outcome | None:
        """A step's coordination cannot be held: skip it (its period is claimed), wait on a
        worker, or fail it without compensation (it never started)."""
        if blocked.kind == "halt":
            stored, value = roundtrip(None)
            return self._record_done(spec, Skip(None), arguments, stored, value, 0, started_at, 0.0)
        if (
            blocked.kind in ("contention", "unavailable")
            and self.retry_later
            and (self.coordinator is None or self.coordinator.snoozes_left())
        ):
            return self._snooze(blocked, step=spec.name)
        error = ErrorInfo(
            kind=blocked.error_kind,
            message=f"step {spec.name!r}: {blocked.message}",
            step=spec.name,
            reactor=self.definition.name,
            retryable=blocked.retryable,
            inputs=self._redacted_inputs(),
            arguments=redact(_displayable(arguments), spec.argument_secret_paths()),
        )
        return self._fail(spec, error, arguments, started=False, started_at=started_at, attempts=0)

    def _redacted_inputs(self) -> dict[str, Any]:
        if self._display_inputs is None:
            self._display_inputs = redact(
                _displayable(dict(self.inputs)), self.definition.input_secret_paths
            )
        return self._display_inputs

    def _error_info(
        self,
        exc: BaseException,
        kind: str,
        spec: StepSpec,
        arguments: dict[str, Any],
        attempts: int,
    ) -> ErrorInfo:
        return ErrorInfo.from_exception(
            exc,
            kind=kind,
            step=spec.name,
            reactor=self.definition.name,
            retryable=False,
            attempts=attempts,
            inputs=self._redacted_inputs(),
            arguments=redact(_displayable(arguments), spec.argument_secret_paths()),
        )

    def _failure_info(
        self,
        outcome: Failure,
        exc: BaseException | None,
        spec: StepSpec,
        arguments: dict[str, Any],
        attempts: int,
    ) -> ErrorInfo:
        error = exc if exc is not None else outcome.error
        if isinstance(error, BaseException):
            info = self._error_info(error, ErrorKind.STEP, spec, arguments, attempts)
            retryable = outcome.retryable and getattr(error, "retryable", True) is not False
        else:
            info = ErrorInfo(
                kind=ErrorKind.STEP,
                message=str(error),
                step=spec.name,
                reactor=self.definition.name,
                attempts=attempts,
                inputs=self._redacted_inputs(),
                arguments=redact(_displayable(arguments), spec.argument_secret_paths()),
            )
            retryable = outcome.retryable
        return ErrorInfo(**{**info._fields(), "retryable": retryable})


def _step_write(
    spec: StepSpec,
    status: str,
    event: Event,
    attempts: int,
    arguments: dict[str, Any],
    started_at: dt.datetime | None,
    *,
    result: Any = None,
    error: dict[str, Any] | None = None,
    compensable: bool = False,
) -> StepWrite:
    """The step record written with ``event``: same sequence number, same time."""
    return StepWrite(
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
    )


def _contract_owner(spec: StepSpec) -> str:
    """Whose ``Inputs`` a step's arguments answer to: the step's, or its child reactor's."""
    child = getattr(spec.impl, "child", None)
    return str(child.__qualname__) if child is not None else spec.impl.__qualname__


def _nested(step: str, failure: RollbackFailure) -> RollbackFailure:
    """A child's rollback failure as seen from its parent: ``parent_step.child_step``."""
    return RollbackFailure(
        step=f"{step}.{failure.step}",
        action=failure.action,
        exception_class=failure.exception_class,
        message=failure.message,
    )


def _error_summary(outcome: Failure, exc: BaseException | None) -> dict[str, Any]:
    error = exc if exc is not None else outcome.error
    if isinstance(error, BaseException):
        return {
            "error": exception_message(error),
            "exception_class": qualified_class_name(error),
        }
    return {"error": printable(str(error)), "exception_class": None}


def _encode_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    try:
        return encode(arguments)
    except ResultNotSerializable:
        return _displayable(arguments)


def _displayable(data: dict[str, Any]) -> dict[str, Any]:
    """A JSON-safe copy for error reports (unserialisable values shown by repr)."""
    return {printable(k): shown(v) for k, v in data.items()}
