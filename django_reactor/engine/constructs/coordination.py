"""Coordination holds: the run's (``Meta.coordination``) and a step's (its ``coordination``).

What to hold is declared with :mod:`..coordination` (locks, semaphores, rate limits, periods,
ordered locks); the Django layer's :class:`~..coordination.Coordinator` acquires it. Here is
what the executor does with it: :class:`RunHolds` takes the run's holds before its first step
(and again when they lapse) and gives them back when the run stops; :class:`CoordinatedStep`
is a plain step whose body, undo and compensate run under the step's holds. What cannot be
held halts, fails, or waits: a worker reschedules the run, an inline caller hands it to one.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from ...states import EventKind, ExecutionStatus, RollbackStatus
from ..coordination import NOT_STARTED, Blocked, Coordinator, StepHold
from ..journal import JournalBatch, RollbackWrite
from ..observers import CoordinationEvent
from ..outcomes import (
    Dispatched,
    ErrorInfo,
    ErrorKind,
    Failed,
    Halted,
    Outcome,
    Rescheduled,
    RollbackFailure,
)
from .base import ROLLBACK_KINDS, RollbackAction, StepDone, StepFailed, StepResult, Stop
from .step import PlainStep, has_handler

if TYPE_CHECKING:
    from ..executor import Executor
    from ..spec import StepSpec

WAITING_KINDS = ("contention", "unavailable")


class CoordinatedStep(PlainStep):
    """A plain step that holds its locks, slots, rate limits and period around its body (until
    its result is recorded) and around its undo and compensate."""

    name = "coordination"

    def claims(self, spec: StepSpec) -> bool:
        return bool(spec.coordination)

    def run(
        self, run: Executor, spec: StepSpec, arguments: dict[str, Any], started_at: dt.datetime
    ) -> StepResult:
        """Take the step's holds (keyed on its arguments), then run it as a plain step; what
        cannot be held skips the step, parks the run or fails the step unstarted."""
        holds = run.holds
        if holds is None:
            return super().run(run, spec, arguments, started_at)
        hold = holds.coordinator.enter_step(spec.name, spec.coordination, arguments)
        holds.acquired(spec.name)
        if isinstance(hold, Blocked):
            return _step_blocked(run, holds, spec, hold, arguments)
        run.memo[self.name] = hold
        run.fences = dict(hold.fences)
        return super().run(run, spec, arguments, started_at)

    def finish(self, run: Executor, spec: StepSpec) -> None:
        """Give the holds back once the step's result is recorded (a period is claimed only
        when the step completed)."""
        super().finish(run, spec)
        hold: StepHold | None = run.memo.pop(self.name, None)
        if hold is not None:
            run.fences = {}
            hold.release(spec.name in run.state.done)

    def rollback(
        self,
        run: Executor,
        spec: StepSpec,
        action: RollbackAction,
        first: Any,
        arguments: dict[str, Any],
    ) -> list[RollbackFailure]:
        """Run the undo or compensate holding the step's locks and slots, never unlocked."""
        holds = run.holds
        if holds is None or not has_handler(spec, action):
            return super().rollback(run, spec, action, first, arguments)
        taken = holds.coordinator.enter_step_rollback(spec.name, spec.coordination, arguments)
        holds.acquired(spec.name)
        if isinstance(taken, Blocked):
            return _rollback_blocked(run, spec, action, taken)
        return self.call_handler(run, spec, action, first, arguments, hold=taken)


def _step_blocked(
    run: Executor, holds: RunHolds, spec: StepSpec, blocked: Blocked, arguments: dict[str, Any]
) -> StepResult:
    """A step's coordination cannot be held: skip it (its period is claimed), wait on a
    worker, or fail it without compensation (it never started)."""
    if blocked.kind == "halt":
        return StepDone(None, attempts=0, duration_ms=0.0, skipped=True)
    if blocked.kind in WAITING_KINDS and run.retry_later and holds.coordinator.snoozes_left():
        return Stop(_snooze(run, blocked, step=spec.name))
    error = run.step_error(
        spec,
        blocked.error_kind,
        f"step {spec.name!r}: {blocked.message}",
        arguments=arguments,
        retryable=blocked.retryable,
    )
    return StepFailed(error)


def _rollback_blocked(
    run: Executor, spec: StepSpec, action: RollbackAction, blocked: Blocked
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
    event = run.event(
        ROLLBACK_KINDS[action][1],
        step=spec.name,
        data={"error": failure.message, "kind": failure.kind},
    )
    rollback = RollbackWrite(spec.name, RollbackStatus.FAILED, event.at, error=failure.to_dict())
    run.commit(JournalBatch(events=[event], rollback=rollback))
    run.notify_rollback(action, spec.name, rollback.status, None, failure)
    return [failure]


def _snooze(run: Executor, blocked: Blocked, *, step: str) -> Rescheduled:
    """Reschedule the run (not retry it): it holds nothing and no worker meanwhile."""
    delay = max(blocked.retry_after, 0.05)
    run.commit(
        JournalBatch(
            events=[
                run.event(
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
            dispatch="retry" if not run.attached else None,
            dispatch_delay=delay,
        )
    )
    run.notify_parked(step, "contention", delay)
    return Rescheduled(execution_id=run.execution_id, step=step, delay=delay, reason="contention")


class RunHolds:
    """The coordination of one run on its :class:`Coordinator`, as its executor uses it."""

    def __init__(self, run: Executor, coordinator: Coordinator) -> None:
        self.run = run
        self.coordinator = coordinator
        # Acquisitions noted in the trace, told to the observers once the run has started.
        self._acquisitions: list[CoordinationEvent] = []

    @property
    def lost(self) -> bool:
        """A lock or slot lapsed while the run held it."""
        return self.coordinator.lost

    def enter(self, *, new: bool) -> Outcome | None:
        """Take the run's holds before its first step; None when held, otherwise how the run
        stopped."""
        blocked = self.coordinator.enter(new=new)
        self.acquired()
        return self._blocked(blocked) if blocked is not None else None

    def retake(self) -> Outcome | None:
        """Take the holds again after one lapsed; None when held, otherwise how the run
        stopped."""
        blocked = self.coordinator.enter(new=False)
        self.acquired()
        self.tell()
        return self._blocked(blocked) if blocked is not None else None

    def exit(self, status: Any) -> None:
        """Give the holds back as the run stops with ``status`` (None: interrupted)."""
        self.coordinator.exit(status)

    def enter_rollback(self) -> None:
        """Take what the run's rollback needs (an undo outside a running run)."""
        self.coordinator.enter_rollback()

    def acquired(self, step: str = "") -> None:
        """Put what the coordinator just acquired in the trace (with the next state change),
        and tell the observers (a run's own acquisitions once it has started)."""
        coordinator = self.coordinator
        run = self.run
        if coordinator.notes:
            for data in coordinator.notes:
                run.note(EventKind.ACQUIRE, data, step=step)
                if run.observer is not None:
                    self._acquisitions.append(self._coordination_event(data, step))
            coordinator.notes.clear()
        if step:
            self.tell()

    def tell(self) -> None:
        """Tell the observers what was acquired since they were last told."""
        observer = self.run.observer
        if observer is not None:
            for event in self._acquisitions:
                observer.coordination_acquired(event)
        self._acquisitions.clear()

    def _coordination_event(self, data: dict[str, Any], step: str) -> CoordinationEvent:
        kind = next((k for k in ("lock", "semaphore", "rate_limit", "period") if k in data), "lock")
        return CoordinationEvent(
            execution_id=self.run.execution_id,
            reactor=self.run.definition.name,
            kind=kind,
            key=str(data.get(kind, "")),
            step=step or None,
            fence=data.get("fence"),
        )

    def _blocked(self, blocked: Blocked) -> Outcome:
        """The run's coordination cannot be held now: halt, fail, wait on a worker, or hand
        the run to a worker (an inline caller never sleeps for it once steps have run)."""
        run = self.run
        state = run.state
        if blocked.kind == "halt":
            reason = blocked.message
            run.commit(
                JournalBatch(
                    events=[run.event(EventKind.HALT, data={"reason": reason})],
                    status=ExecutionStatus.HALTED,
                    result={"halted_at": "", "reason": reason},
                    finished=True,
                    close_interrupts=True,
                )
            )
            self.coordinator.exit(ExecutionStatus.HALTED)
            if run.observer is not None:
                run.observer.execution_halted(run.run_event(ExecutionStatus.HALTED, reason=reason))
            return Halted(execution_id=run.execution_id, reason=reason, step=None)
        waiting = blocked.kind in WAITING_KINDS
        if waiting and run.retry_later:
            if not self.coordinator.snoozes_left():
                blocked = Blocked(
                    "fail",
                    f"{blocked.message}; gave up after REACTOR['MAX_CONTENTION_SNOOZES'] "
                    "reschedules",
                    error_kind=blocked.error_kind,
                )
            else:
                return _snooze(run, blocked, step="")
        elif waiting and (state.done or state.undo_stack):
            # Steps ran already (a resumed run): a worker goes on once it can hold them.
            run.commit(
                JournalBatch(
                    events=[
                        run.event(
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
            return Dispatched(execution_id=run.execution_id, results=dict(state.results))
        error = ErrorInfo(
            kind=blocked.error_kind,
            message=blocked.message,
            reactor=run.definition.name,
            retryable=blocked.retryable,
            inputs=run.redacted_inputs(),
        )
        if state.undo_stack or state.pending_compensation:
            run.rollback(final_status=ExecutionStatus.FAILED, failure=error)
            return Failed(execution_id=run.execution_id, error=error)
        run.commit(
            JournalBatch(
                events=[
                    run.event(EventKind.FAIL, data={"kind": error.kind, "error": error.message})
                ],
                status=ExecutionStatus.FAILED,
                failure=error.to_dict(),
                finished=True,
                close_interrupts=True,
            )
        )
        # Nothing ran: it leaves its ordered-lock queue without halting the chain.
        self.coordinator.exit(NOT_STARTED if not state.done else ExecutionStatus.FAILED)
        if run.observer is not None:
            run.observer.execution_failed(
                run.run_event(ExecutionStatus.FAILED, failure=error.to_dict())
            )
        return Failed(execution_id=run.execution_id, error=error)


COORDINATED_STEP = CoordinatedStep()
