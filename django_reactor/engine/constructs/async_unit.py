"""Async units: ``async_step(...)`` and ``async_reactor(Child, ...)``, a step run as its own
execution on workers.

When the unit's step is reached, the unit is dispatched and the run goes on with the steps
that do not need it. A step that reads the unit (``arg.result("<name>")``, or ``wait_for``)
waits for its outcome first: inline, the caller waits; on a worker, the run parks and the
unit's completion wakes it. The reader gets the unit's value, or its ``Failed``/``Halted``
outcome to decide on. A unit retries and compensates itself; its parent never undoes it.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from ...exceptions import UnitWaitTimeout
from ...states import EventKind, StepStatus
from ..coordination import DispatchRefused
from ..declarations import StepDeclaration
from ..journal import JournalBatch, RecordedStep, StepWrite
from ..outcomes import Completed, ErrorInfo, ErrorKind, Rescheduled, RollbackFailure
from .base import (
    CONTINUE,
    Construct,
    RollbackAction,
    StepFailed,
    StepResult,
    Stop,
    unstorable_arguments,
)
from .compose import ComposeStep, child_declaration, child_runner

if TYPE_CHECKING:
    from ..context import RunContext
    from ..spec import StepSpec
    from ..state import RunState


class AsyncReactorStep(ComposeStep):
    """The step an ``async_reactor()`` declaration makes: dispatches its child to workers."""


def async_reactor(child: type, /, **options: Any) -> StepDeclaration:
    """Declare a step that dispatches the reactor ``child`` as an independent execution.

    The child gets its own id, runs on workers and recovers on its own; the parent never undoes
    it. Its inputs are validated when the step is reached: invalid inputs fail the step and
    create nothing. Steps that read ``arg.result("<name>")`` wait for the child to finish.
    """
    return child_declaration(child, options, "async_reactor", AsyncReactorStep, "reactor")


class AsyncUnit(Construct):
    """Dispatches a unit through the child runner and settles its outcome for its readers."""

    name = "async_unit"
    # The unit's outcome belongs to the steps that read it, not to the run's value.
    in_value = False

    def claims(self, spec: StepSpec) -> bool:
        return spec.unit is not None

    def run(
        self, run: RunContext, spec: StepSpec, arguments: dict[str, object], started_at: dt.datetime
    ) -> StepResult:
        """Hand the unit to workers; the run goes on with the steps that do not need it."""
        refused = unstorable_arguments(run, spec, arguments)
        if refused is not None:
            return refused
        assert spec.unit_definition is not None
        try:
            unit_id = child_runner(run, spec).dispatch(spec.name, spec.unit_definition, arguments)
        except DispatchRefused as refusal:
            message = f"async unit {spec.name!r} was not dispatched: {refusal}"
            return StepFailed(run.step_error(spec, "coordination", message))
        following = run.next_after(spec)
        event = run.event(EventKind.DISPATCH, step=spec.name, data={"execution_id": str(unit_id)})
        run.commit(
            JournalBatch(
                events=[event],
                step=StepWrite.of(
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
        run.state.done.add(spec.name)
        run.state.units.add(spec.name)
        return CONTINUE

    def settle(
        self, run: RunContext, spec: StepSpec, reader: StepSpec, started_at: dt.datetime
    ) -> StepResult | None:
        """Get the unit's outcome for ``reader``: wait inline, or park the run on a worker."""
        unit = spec.name
        try:
            outcome = child_runner(run, reader).settle(unit, wait=not run.policy.retry_later)
        except UnitWaitTimeout as timeout:
            error = run.error_info(timeout, ErrorKind.ARGUMENT, reader, {}, 0)
            return StepFailed(error, arguments={})
        if outcome is None:
            if run.policy.retry_later:
                return Stop(_park(run, reader, unit))
            error = ErrorInfo(
                kind=ErrorKind.ARGUMENT,
                message=f"async unit {unit!r} has not finished",
                step=reader.name,
                reactor=run.definition.name,
            )
            return StepFailed(error, arguments={})
        run.state.results[unit] = outcome.value if isinstance(outcome, Completed) else outcome
        run.state.units.discard(unit)
        return None

    def rollback(
        self,
        run: RunContext,
        spec: StepSpec,
        action: RollbackAction,
        first: object,
        arguments: dict[str, object],
    ) -> list[RollbackFailure]:
        """Nothing: a unit owns its rollback, and its parent never undoes it."""
        return []

    def restore(self, state: RunState, spec: StepSpec | None, record: RecordedStep) -> None:
        """A dispatched unit is done for the steps that do not read it; its readers settle it."""
        if record.status == StepStatus.DISPATCHED:
            state.done.add(record.step)
            state.units.add(record.step)
            return
        super().restore(state, spec, record)


def _park(run: RunContext, reader: StepSpec, unit: str) -> Rescheduled:
    """Release the worker while ``reader`` waits for ``unit``; its completion wakes the run."""
    event = run.event(EventKind.PARK, step=reader.name, data={"waiting_for": unit})
    # The delay is a safety net: if the wake-up message is lost, the sweeper wakes the run.
    return run.park(reader.name, reason="park", delay=run.policy.park_poll, event=event)


ASYNC_UNIT = AsyncUnit()
