"""A step under its coordination (its ``coordination=``): locks, semaphores, rate limits and
periods held around its body, undo and compensate.

What to hold is declared with :mod:`..coordination`; the run's holds (:mod:`..holds`) acquire
it. What cannot be held skips the step (a claimed period), parks the run on a worker
(:func:`snooze`) or fails the step unstarted.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from ...states import EventKind, RollbackStatus
from ..coordination import Blocked, StepHold
from ..journal import JournalBatch, RollbackWrite
from ..outcomes import ErrorKind, Rescheduled, RollbackFailure
from .base import ROLLBACK_KINDS, RollbackAction, StepDone, StepFailed, StepResult, Stop
from .step import PlainStep, has_handler

if TYPE_CHECKING:
    from ..context import RunContext
    from ..holds import RunHolds
    from ..spec import StepSpec

WAITING_KINDS = ("contention", "unavailable")


class CoordinatedStep(PlainStep):
    """A plain step that holds its locks, slots, rate limits and period around its body (until
    its result is recorded) and around its undo and compensate."""

    name = "coordination"

    def claims(self, spec: StepSpec) -> bool:
        return bool(spec.coordination)

    def run(
        self, run: RunContext, spec: StepSpec, arguments: dict[str, object], started_at: dt.datetime
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

    def finish(self, run: RunContext, spec: StepSpec) -> None:
        """Give the holds back once the step's result is recorded (a period is claimed only
        when the step completed)."""
        super().finish(run, spec)
        hold: StepHold | None = run.memo.pop(self.name, None)
        if hold is not None:
            run.fences = {}
            hold.release(spec.name in run.state.done)

    def rollback(
        self,
        run: RunContext,
        spec: StepSpec,
        action: RollbackAction,
        first: object,
        arguments: dict[str, object],
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
    run: RunContext, holds: RunHolds, spec: StepSpec, blocked: Blocked, arguments: dict[str, object]
) -> StepResult:
    """A step's coordination cannot be held: skip it (its period is claimed), wait on a
    worker, or fail it without compensation (it never started)."""
    if blocked.kind == "halt":
        return StepDone(None, attempts=0, duration_ms=0.0, skipped=True)
    if (
        blocked.kind in WAITING_KINDS
        and run.policy.retry_later
        and holds.coordinator.snoozes_left()
    ):
        return Stop(snooze(run, blocked, step=spec.name))
    error = run.step_error(
        spec,
        blocked.error_kind,
        f"step {spec.name!r}: {blocked.message}",
        arguments=arguments,
        retryable=blocked.retryable,
    )
    return StepFailed(error)


def _rollback_blocked(
    run: RunContext, spec: StepSpec, action: RollbackAction, blocked: Blocked
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
    run.notices.rolled_back(action, spec.name, rollback.status, None, failure)
    return [failure]


def snooze(run: RunContext, blocked: Blocked, *, step: str) -> Rescheduled:
    """Reschedule the run (not retry it): it holds nothing and no worker meanwhile."""
    delay = max(blocked.retry_after, 0.05)
    event = run.event(
        EventKind.PARK,
        step=step,
        data={"waiting_for": blocked.message, "reason": blocked.kind, "delay": delay},
    )
    return run.park(step, reason="contention", delay=delay, event=event, by_task=True)


COORDINATED_STEP = CoordinatedStep()
