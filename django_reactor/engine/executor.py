"""The executor core: the loop that runs a reactor's steps, and the rollback rule.

The executor is pure: it calls step code and hands every state change to a :class:`Journal`.
The next step is always the first one, in declaration order, whose dependencies are done, so
the order depends only on which steps are done (a run restored from its records takes the
same path); with ``Meta.max_concurrency`` the same loop starts independent ready steps side by
side (:mod:`.lanes`). Each step runs through its construct (:mod:`.constructs`: a plain step,
a composed child, an async unit, a map, an interrupt, a sleep, a step under coordination),
which sees the run as a :class:`~.context.RunContext` and says how the step ended; the core
records it (:meth:`~.recording.RunRecorder.record_step`) and, when the run fails, applies the
rollback rule:

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
import functools
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import ArgumentResolutionError
from ..states import EventKind, ExecutionStatus
from .constructs import construct_for, registered
from .constructs.base import (
    INTERRUPTIONS,
    Postponed,
    RollbackPending,
    StepDone,
    StepFailed,
    StepHalted,
    StepResult,
    Stop,
)
from .constructs.compose import ChildRunner
from .context import Reconnect, RunPolicy
from .coordination import Coordinator
from .holds import RunHolds
from .journal import Journal, JournalBatch, StopRequest
from .lanes import SideBySide
from .observers import RunObserver
from .outcomes import (
    Cancelled,
    Completed,
    Dispatched,
    ErrorInfo,
    ErrorKind,
    Failed,
    Halted,
    Outcome,
    Rescheduled,
    RollbackFailure,
    Suspended,
)
from .recording import RunRecorder
from .serialization import JSONData, JSONMapping, JSONObject, shown
from .spec import ReactorDefinition, StepSpec
from .state import PendingCompensation, RunState, UndoEntry
from .templates import ResolutionScope
from .validation import summarise_errors, validate

__all__ = ["INTERRUPTIONS", "Executor", "PendingCompensation", "RunState", "UndoEntry", "utcnow"]


#: The current time, timezone-aware (UTC): the executor's default clock. A partial of the
#: C function rather than a function of ours: a step reads the clock at least twice.
utcnow: Callable[[], dt.datetime] = functools.partial(dt.datetime.now, dt.UTC)


class Executor(RunRecorder):
    """Runs one execution of a reactor against a journal.

    What it records, and how its constructs record, is :class:`RunRecorder`'s; here are the
    loop and the rollback rule.
    """

    def __init__(
        self,
        definition: ReactorDefinition,
        journal: Journal,
        *,
        inputs: Mapping[str, object],
        state: RunState | None = None,
        policy: RunPolicy | None = None,
        children: ChildRunner | None = None,
        observer: RunObserver | None = None,
        coordinator: Coordinator | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        policy = policy or _in_memory_policy(None, None)
        super().__init__(
            definition,
            journal,
            inputs=inputs,
            state=state,
            clock=clock,
            sleep=sleep,
            policy=policy,
            observer=observer,
            coordinator=coordinator,
        )
        # In the caller: stop at the reactor's background hand-off point (once: a worker
        # never hands off).
        background = definition.background
        self.hand_off_point = background if policy.hand_off and background is not None else None
        self.children = children
        self.scope = ResolutionScope(inputs=inputs, results=self.state.results)
        self.holds = RunHolds(self, coordinator) if coordinator is not None else None
        # What the constructs keep for this run, by construct name.
        self.memo: dict[str, Any] = {}
        # Marks the threads that run a step alongside others (see in_branch).
        self.branch = threading.local()
        # How many steps may run at once.
        self.max_concurrency = policy.max_concurrency or definition.max_concurrency

    @classmethod
    def in_memory(
        cls,
        definition: ReactorDefinition,
        journal: Journal,
        *,
        inputs: Mapping[str, object],
        state: RunState | None = None,
        max_retry_delay: float | None = None,
        reconnect: Reconnect | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Executor:
        """An executor for a run kept in memory (a map's element): no children, no
        coordination, no observers. Every run kept in the database gets its executor from
        ``django_reactor.runtime.executors``."""
        return cls(
            definition,
            journal,
            inputs=inputs,
            state=state,
            policy=_in_memory_policy(max_retry_delay, reconnect, element=True),
            sleep=sleep,
        )

    # ------------------------------------------------------------------ public

    def run(self) -> Outcome:
        """Run every remaining step; return how the run ended."""
        holds = self.holds
        new = self.state.next_seq <= 2  # nothing but the start event: a new run
        if self.past_deadline():
            # Before taking any hold: a run that waited for a lock, a start time or a wake-up
            # stops at its deadline without waiting on.
            following = self.definition.next_ready(self.state.done, self.state.waiting)
            return self.deadline_passed(following.name if following is not None else "")
        if holds is None:
            return self._run(new)
        stopped = holds.enter(new=new)
        if stopped is not None:
            return stopped
        outcome: Outcome | None = None
        try:
            outcome = self._run(new)
        finally:
            # Finished, failed or halted: released; paused: released (taken again on resume);
            # parked or handed off: kept for the process that resumes the run.
            holds.exit(outcome.status if outcome is not None else None)
        return outcome

    def _run(self, new: bool) -> Outcome:
        notices = self.notices
        if notices.observer is not None:  # tested here: a map makes many runs nobody watches
            notices.started(new=new)
        if self.holds is not None:
            self.holds.tell()
        for construct in registered():
            construct.catch_up(self)
        # The one loop: steps that may run alongside others go to lanes; the next step runs
        # alone when none is in flight.
        side_by_side = SideBySide(self, self.max_concurrency) if self.max_concurrency > 1 else None
        try:
            while True:
                if side_by_side is not None:
                    outcome = side_by_side.turn()
                    if outcome is not None:
                        return outcome
                outcome = self.step_once()
                if outcome is not None:
                    if side_by_side is not None:
                        side_by_side.ended_cleanly = True
                    return outcome
        finally:
            if side_by_side is not None:
                side_by_side.close()

    def step_once(self) -> Outcome | None:
        """Run the next ready step (or end the run: pause, complete, hand off); None while the
        run goes on."""
        definition = self.definition
        state = self.state
        spec = definition.next_ready(state.done, state.waiting)
        if spec is None:
            if state.waiting:
                waiting = [s.name for s in definition.steps if s.name in state.waiting]
                return construct_for(definition.step(waiting[0])).pause(self, waiting)
            return self._complete()
        if self.past_deadline():
            return self.deadline_passed(spec.name)
        point = self.hand_off_point
        if point is not None and point.mode == "before" and spec.name == point.step:
            return self.hand_off(next_step=spec.name)
        if self.holds is not None and self.holds.lost:
            # A lock or slot lapsed while the run held it: take it again, or wait.
            stopped = self.holds.retake()
            if stopped is not None:
                return stopped
        return self._run_step(spec)

    def deadline_passed(self, step: str) -> Outcome:
        """The run's deadline passed before ``step`` could start: no step starts any more; the
        run fails and rolls back, or halts (``Meta.on_deadline``)."""
        deadline = self.policy.deadline
        assert deadline is not None
        at = deadline.isoformat()
        event = self.event(EventKind.DEADLINE, step=step, data={"deadline": at})
        if self.definition.on_deadline == "halt":
            reason = f"the run's deadline ({at}) passed"
            self.commit(
                JournalBatch(
                    events=[event],
                    status=ExecutionStatus.HALTED,
                    current_step=step,
                    result={"halted_at": step, "reason": reason},
                    finished=True,
                )
            )
            self.notices.halted(step=step, reason=reason)
            return Halted(execution_id=self.execution_id, reason=reason, step=step)
        spec = self.definition.by_name.get(step)
        where = f"before step {step!r} could start"
        if spec is not None and (spec.map is not None or spec.child is not None):
            # A map or a composed child the run waited for may have done part of its work
            # (elements, child steps): it is stopped and that part undone, newest first.
            self.state.rolled_back_in_place(step)
            where = f"while the run waited for step {step!r}"
        error = ErrorInfo(
            kind=ErrorKind.DEADLINE,
            message=f"the run's deadline ({at}) passed {where}",
            step=step,
            reactor=self.definition.name,
            inputs=self.redacted_inputs(),
            retryable=False,
        )
        attempts = self.state.attempts_done.get(step, 0)
        if spec is not None and attempts and not spec.atomic and where.startswith("before"):
            # Its failed attempts started its work (it waited for a retry): it is compensated.
            arguments = self.arguments_for(step)
            batch = self.failed_step(
                spec, error, arguments, attempts=attempts, started_at=None, compensable=True
            )
            batch.events.insert(0, event)
            self.state.compensation_due(step, arguments, error)
        else:
            batch = JournalBatch(events=[event], current_step=step)
        batch.status = ExecutionStatus.ROLLING_BACK
        batch.failure = error.to_dict()
        self.commit(batch)
        return self.roll_back_failed(step, error)

    def past_deadline(self) -> bool:
        """Whether the run's deadline has passed."""
        deadline = self.policy.deadline
        return deadline is not None and self.clock() >= deadline

    def in_branch(self) -> bool:
        """Whether this thread runs a step alongside others (``Meta.max_concurrency``)."""
        return bool(getattr(self.branch, "active", False))

    def arguments_for(self, step: str) -> dict[str, object]:
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
        recorded an outcome, so it is marked failed (interrupted) and compensable (an atomic
        step is not: its transaction died with the process, and its writes with it).
        """
        spec = self.definition.step(step)
        arguments = self.arguments_for(step)
        error = self.step_error(spec, ErrorKind.INTERRUPTED, reason, arguments=arguments)
        # An atomic step's writes died with its transaction: there is nothing to compensate.
        compensable = not spec.atomic
        self.commit(
            self.failed_step(
                spec, error, arguments, attempts=0, started_at=None, compensable=compensable
            )
        )
        if compensable:
            # Before the others: it was in flight when the others were recorded.
            self.state.pending_compensation.insert(0, PendingCompensation(step, arguments, error))

    def finish_rollback(
        self, reason: str, *, note: JSONMapping | None = None
    ) -> list[RollbackFailure]:
        """Roll a restored run back to its end (an undo, or a rollback its last process did
        not finish): the steps that were in flight when its process stopped are compensated,
        then the rest as :meth:`rollback` does. The run ends ``failed`` if one of its steps
        had failed, else ``cancelled`` (``needs_attention`` either way when part of the
        rollback fails)."""
        state = self.state
        for step in state.in_flight:
            self.adopt_in_flight(
                step, "the process running this step stopped before recording its outcome"
            )
            state.recorded.add(step)
        state.in_flight.clear()
        return self.rollback(
            final_status=ExecutionStatus.FAILED if state.step_failed else ExecutionStatus.CANCELLED,
            reason=reason,
            failure=state.failure,
            note=note,
        )

    def rollback(
        self,
        *,
        final_status: str,
        reason: str = "",
        failure: ErrorInfo | None = None,
        note: JSONMapping | None = None,
    ) -> list[RollbackFailure]:
        """Compensate pending failed steps, undo every completed step newest first, finish.

        Used by ``undo()``. The run ends ``final_status`` when everything rolled back,
        ``needs_attention`` otherwise. ``failure`` is the run's failure, if it failed: its
        ``rollback_failures`` are replaced by what this rollback could not do.

        Raises the construct's RollbackPending (MapRollbackPending), after parking the run
        ``rolling_back``, while workers roll a step back; the run is woken to finish then.
        ``note`` goes on the ``rollback`` entry besides the reason (who asked for an undo).
        """
        started: dict[str, JSONData] = {**(note or {})}
        if reason:
            started["reason"] = reason
        self.commit(
            JournalBatch(
                events=[self.event(EventKind.ROLLBACK, data=started)],
                status=ExecutionStatus.ROLLING_BACK,
            )
        )
        if self.holds is not None:
            self.holds.enter_rollback()
        try:
            failures = self._rollback_all()
        except RollbackPending as pending:
            self._park_rollback(pending)
            if self.holds is not None:
                self.holds.exit(ExecutionStatus.ROLLING_BACK)
            raise
        except INTERRUPTIONS as exc:
            self.abort(exc)
            raise
        status = final_status if not failures else ExecutionStatus.NEEDS_ATTENTION
        kind = EventKind.CANCEL if status == ExecutionStatus.CANCELLED else EventKind.FAIL
        stored: JSONObject | None
        if failures:
            if failure is None or failure.kind == ErrorKind.ROLLBACK:
                failure = ErrorInfo(
                    kind=ErrorKind.ROLLBACK,
                    message=f"{len(failures)} rollback action(s) failed during undo; "
                    "fix the cause and undo again",
                    reactor=self.definition.name,
                    inputs=self.redacted_inputs(),
                )
            stored = failure.with_rollback_failures(failures).to_dict()
        elif failure is None or failure.kind == ErrorKind.ROLLBACK:
            stored = None  # nothing failed, or only an earlier rollback that now succeeded
        else:
            stored = failure.with_rollback_failures([]).to_dict()
        data: JSONObject = {"reason": reason} if reason else {}
        if kind == EventKind.FAIL:
            data["status"] = status
        self.commit(
            JournalBatch(
                events=[self.event(kind, data=data)],
                status=status,
                failure=stored,
                finished=True,
            )
        )
        if self.holds is not None:
            self.holds.exit(status)
        if status == ExecutionStatus.CANCELLED:
            self.notices.cancelled(reason=reason or None, failure=stored)
        else:
            self.notices.failed(status, failure=stored, reason=reason or None)
        return failures

    # ------------------------------------------------------------------ steps

    def _run_step(self, spec: StepSpec) -> Outcome | None:
        started_at = self.clock()
        units = self.state.units
        if units:
            for name in sorted(spec.depends_on & units):
                unit = self.definition.step(name)
                waiting = construct_for(unit).settle(self, unit, spec, started_at)
                if waiting is not None:
                    return self._conclude(spec, waiting, {}, started_at)
        arguments = self.arguments(spec)
        if isinstance(arguments, StepFailed):
            return self._conclude(spec, arguments, arguments.arguments or {}, started_at)
        construct = construct_for(spec)
        try:
            result = construct.run(self, spec, arguments, started_at)
            return self._conclude(spec, result, arguments, started_at)
        finally:
            construct.finish(self, spec)

    def arguments(self, spec: StepSpec) -> dict[str, object] | StepFailed:
        """The step's arguments, resolved and validated by its contract (from then on, run,
        the stored record, undo and compensate all see the contract's validated data); or the
        failure (never started) when they cannot be."""
        try:
            arguments = self._resolve(spec)
        except ArgumentResolutionError as unresolved:
            return StepFailed(
                self.error_info(unresolved, ErrorKind.ARGUMENT, spec, {}, 0), arguments={}
            )
        if spec.contract is None:
            return arguments
        validated, errors = validate(spec.contract, arguments)
        if validated is not None:
            return validated
        message = (
            f"the arguments of step {spec.name!r} do not satisfy "
            f"{_contract_owner(spec)}.Inputs: {summarise_errors(errors)}"
        )
        error = self.step_error(
            spec, ErrorKind.CONTRACT, message, arguments=arguments, field_errors=errors
        )
        return StepFailed(error, arguments=arguments)

    def _conclude(
        self,
        spec: StepSpec,
        result: StepResult,
        arguments: dict[str, object],
        started_at: dt.datetime,
    ) -> Outcome | None:
        """Apply what the construct said: record the step done, halted or failed, or stop."""
        if not isinstance(result, StepDone | StepFailed | StepHalted):
            if isinstance(result, Stop):
                return result.outcome
            if isinstance(result, Postponed):  # pragma: no cover - only a lane postpones
                raise AssertionError(f"step {spec.name!r} postponed its retry outside a lane")
            return None  # Continue: the construct recorded the step, the loop goes on
        # The cursor names the step that runs next, so that if this process dies during it,
        # whoever takes the run over knows which step was in flight.
        following = self.next_after(spec)
        last = following is None and not self.state.waiting
        recorded = self.record_step(
            spec,
            result,
            arguments,
            started_at,
            current_step=following.name if following is not None else spec.name,
            completes=last,
        )
        asked = recorded.wait()
        # What the loop does once the step's outcome is recorded.
        if recorded.kind == "failed":
            assert recorded.error is not None
            return self.roll_back_failed(spec.name, recorded.error)
        if recorded.kind == "halted":
            self.notices.halted(step=spec.name, reason=str(shown(recorded.reason)))
            return Halted(execution_id=self.execution_id, reason=recorded.reason, step=spec.name)
        if last:
            if self.notices.observer is not None:
                self.notices.completed()
            successor = result.successor if isinstance(result, StepDone) else None
            return Completed(
                execution_id=self.execution_id,
                value=recorded.value,
                continued_as=successor.execution_id if successor is not None else None,
            )
        if asked is not None:
            # A cancel or a pause takes effect between steps; after the last one the run is
            # complete.
            return self.stop_as_asked(asked, last_step=spec.name)
        point = self.hand_off_point
        if (
            point is not None
            and point.mode == "after"
            and point.step == spec.name
            and following is not None
        ):
            return self.hand_off(next_step=following.name)
        return None

    def hand_off(self, *, next_step: str) -> Dispatched:
        """Move the rest of the run to a Celery worker (once: workers never hand off)."""
        self.commit(
            JournalBatch(
                events=[self.event(EventKind.HANDOFF, data={"next_step": next_step})],
                status=ExecutionStatus.PENDING,
                current_step=next_step,
                release=True,
                handed_off=True,
                dispatch="handoff",
            )
        )
        self.notices.handed_off(step=next_step)
        self.hand_off_point = None
        return Dispatched(execution_id=self.execution_id, results=dict(self.state.results))

    # ------------------------------------------------------------------ failure and rollback

    def roll_back_failed(self, step: str, error: ErrorInfo) -> Failed | Rescheduled:
        """The run failed at ``step`` (recorded, rolling back): apply the rollback rule, then
        end the run ``failed`` (``needs_attention`` when part of the rollback failed)."""
        try:
            failures = self._rollback_all()
        except RollbackPending as pending:
            return self._park_rollback(pending)
        except INTERRUPTIONS as exc:
            self.abort(exc)
            raise
        final = error.with_rollback_failures([*error.rollback_failures, *failures])
        status = (
            ExecutionStatus.FAILED
            if not final.rollback_failures
            else ExecutionStatus.NEEDS_ATTENTION
        )
        self.commit(
            JournalBatch(
                events=[self.event(EventKind.FAIL, data={"status": status})],
                status=status,
                failure=final.to_dict(),
                finished=True,
            )
        )
        self.notices.failed(status, step=step, failure=final.to_dict())
        return Failed(execution_id=self.execution_id, error=final, status=status)

    def _rollback_all(self) -> list[RollbackFailure]:
        """Compensate the failed steps that started, then undo the completed ones, newest
        first, each through its construct (rules 2 to 4)."""
        state = self.state
        # What the rollback this one resumes could not do: reported again, not tried again.
        failures, state.rollback_failures = state.rollback_failures, []
        while state.pending_compensation:
            pending = state.pending_compensation[0]
            spec = self.definition.step(pending.step)
            failures.extend(
                construct_for(spec).rollback(
                    self, spec, "compensate", pending.error, pending.arguments
                )
            )
            state.pending_compensation.pop(0)
        while state.undo_stack:
            entry = state.undo_stack[-1]
            spec = self.definition.step(entry.step)
            failures.extend(
                construct_for(spec).rollback(self, spec, "undo", entry.result, entry.arguments)
            )
            state.undo_stack.pop()
        return failures

    def _park_rollback(self, pending: RollbackPending) -> Rescheduled:
        """A step is being rolled back on workers: release the run, rolling back.

        The step may be a composed child's: the child parked first, and its work wakes this run.
        """
        own = pending.step in self.definition.by_name
        step = pending.step if own else ""
        park_poll = self.policy.park_poll
        self.commit(
            JournalBatch(
                events=[self.event(EventKind.PARK, step=step, data=pending.data)],
                status=ExecutionStatus.ROLLING_BACK,
                release=True,
                wake_after=park_poll,
            )
        )
        self.notices.parked(step, pending.reason, park_poll)
        if own:
            spec = self.definition.step(step)
            construct_for(spec).parked(self, spec)
        return Rescheduled(
            execution_id=self.execution_id,
            step=step,
            delay=park_poll,
            reason=pending.reason,
            status=ExecutionStatus.ROLLING_BACK,
        )

    # ------------------------------------------------------------------ endings

    def _complete(self) -> Completed:
        """Finish the run: nothing is left to run (its last step completed it otherwise)."""
        batch = JournalBatch()
        value = self.completion(batch)
        self.commit(batch)
        self.notices.completed()
        return Completed(execution_id=self.execution_id, value=value)

    def stop_as_asked(self, asked: StopRequest, *, last_step: str) -> Cancelled | Suspended:
        """Do what an operator asked, found after ``last_step``: cancel the run, or suspend
        it."""
        if asked.kind == "cancel":
            return self.cancelled(asked.reason, last_step=last_step)
        return self.suspend(asked)

    def suspend(self, asked: StopRequest) -> Suspended:
        """Stop between steps for an operator's pause: the run is suspended, holds no worker,
        and goes on from its cursor when it is unpaused."""
        self.commit(
            JournalBatch(
                events=[self.event(EventKind.SUSPEND, data={"reason": asked.reason, **asked.data})],
                status=ExecutionStatus.SUSPENDED,
                release=True,
            )
        )
        self.notices.suspended(reason=asked.reason)
        return Suspended(execution_id=self.execution_id, reason=asked.reason)

    def cancelled(self, reason: str, *, last_step: str) -> Cancelled:
        """End the run cancelled (an operator asked), after ``last_step``."""
        self.commit(
            JournalBatch(
                events=[
                    self.event(
                        EventKind.CANCEL,
                        data={**self.journal.cancel_requester(), "reason": reason},
                    )
                ],
                status=ExecutionStatus.CANCELLED,
                current_step=last_step,  # nothing is in flight: the next step never started
                finished=True,
            )
        )
        self.notices.cancelled(step=last_step, reason=reason)
        return Cancelled(execution_id=self.execution_id, reason=reason)

    def _resolve(self, spec: StepSpec) -> dict[str, object]:
        scope = self.scope
        return {name: template.resolve(scope) for name, template in spec.arguments.items()}


@functools.lru_cache(maxsize=8)
@functools.lru_cache(maxsize=16)
def _in_memory_policy(
    max_retry_delay: float | None, reconnect: Reconnect | None, *, element: bool = False
) -> RunPolicy:
    """The policy of a run kept in memory (one object per cap: a map makes many such runs;
    ``element``: a map's element, which keeps no attributes)."""
    return RunPolicy(
        max_retry_delay=max_retry_delay,
        reconnect=reconnect,
        keeps_attributes=not element,
        keeps_patches=not element,
    )


def _contract_owner(spec: StepSpec) -> str:
    """Whose ``Inputs`` a step's arguments answer to: the step's, or its child reactor's."""
    child = getattr(spec.impl, "child", None)
    return str(child.__qualname__) if child is not None else spec.impl.__qualname__
