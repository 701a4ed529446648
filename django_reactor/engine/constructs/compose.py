"""``compose(Child, ...)``: a whole reactor run as one step of another.

The child runs in the same process as its parent, as an execution of its own (linked to the
parent), checkpointing its own steps. If it fails it has rolled itself back before the parent
sees the failure; if a later parent step fails, the completed child is undone in place (its own
steps, newest first). A ``Halt`` inside a child halts the parent: a child is part of its
parent's run, and ``Halt`` stops the run it is in. Children are never retried as a whole: put
retries on their steps. A child that waits (a retry's backoff on a worker, an async unit) parks
its parent with it; resuming the parent re-enters the step, which continues the child.

A child that pauses at an interrupt pauses its parent: the compose step waits (its record says
``waiting``) while the parent runs what it can, then the parent pauses too. The interrupt is
resumed through the run at the top by its path, ``"<compose step>.<interrupt>"`` (deeper for
children of children); when its payload is accepted the top run resumes, re-enters the step and
continues the child. A waiting compose step is rolled back like a completed one, in its place:
the child's rollback undoes what it completed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ...exceptions import DefinitionError, ReactorError
from ...states import EventKind, StepStatus
from ..declarations import StepDeclaration
from ..journal import JournalBatch, RecordedStep, StepWrite
from ..outcomes import (
    Completed,
    ErrorInfo,
    ErrorKind,
    Halted,
    Paused,
    Rescheduled,
    RollbackFailure,
)
from ..step import Step
from ..templates import Template
from .base import (
    CONTINUE,
    INTERRUPTIONS,
    Construct,
    RollbackAction,
    StepDone,
    StepFailed,
    StepHalted,
    StepResult,
    Stop,
    record_nested_rollback,
    unstorable_arguments,
)
from .interrupt import INTERRUPT, interrupt_event, reached_interrupts

if TYPE_CHECKING:
    from uuid import UUID

    from ..context import RunContext
    from ..outcomes import Outcome
    from ..spec import ReactorDefinition, StepSpec
    from ..state import RunState


class ComposeStep(Step):
    """The step a ``compose()`` declaration makes; the executor runs its child instead."""

    child: ClassVar[type]

    def run(self, **arguments: object) -> object:  # pragma: no cover - never called
        raise NotImplementedError("a composed reactor runs through the executor's child runner")


class ChildRunner(Protocol):
    """Runs and rolls back composed children durably (implemented by the Django layer)."""

    def run(
        self, step: str, definition: ReactorDefinition, inputs: Mapping[str, object]
    ) -> Outcome:
        """Run (or, after a crash, continue) the child of ``step``; return its outcome.

        A child that paused at interrupts returns ``Paused`` listing the interrupts it reached
        in this call (paths relative to the child, such as ``"approval"`` or
        ``"inner.approval"``), with their correlation ids, expiry and tokens.
        """
        ...

    def accepted(self, step: str) -> tuple[str, ...] | None:
        """For the paused child of ``step``: None while it still waits untouched; otherwise the
        interrupt paths (relative to the child) whose payloads were accepted meanwhile, empty
        when the child moved on for another reason (its process died while it ran)."""
        ...

    def rollback(self, step: str) -> list[RollbackFailure]:
        """Undo everything the child of ``step`` completed, newest first."""
        ...

    def dispatch(
        self, step: str, definition: ReactorDefinition, inputs: Mapping[str, object]
    ) -> UUID:
        """Start the async unit of ``step`` on workers (or find it, if already started)."""
        ...

    def settle(self, step: str, *, wait: bool) -> Outcome | None:
        """The unit's outcome; None while it runs (after waiting, when ``wait``).

        Raises UnitWaitTimeout once the unit has taken longer than its reader may wait.
        """
        ...


def child_declaration(
    child: type, options: dict[str, Any], what: str, base: type[Step], unit: str | None
) -> StepDeclaration:
    """The declaration of a step running the reactor ``child`` (``compose``, ``async_reactor``).

    ``base`` is the step class it makes a subclass of; ``unit`` is None for a composed child.
    """
    definition = getattr(child, "definition", None)
    if not isinstance(child, type) or definition is None:
        raise DefinitionError(f"{what}() takes a Reactor subclass, got {child!r}")
    if "atomic" in options:
        raise DefinitionError(
            f"{what}({child.__qualname__}) cannot be atomic: the child's steps each commit "
            "their own checkpoint. Declare atomic=True on the child's steps whose database "
            "writes must happen once"
        )
    if "retry" in options:
        raise DefinitionError(
            f"{what}({child.__qualname__}) cannot be retried as a whole: a retried child could "
            "resume with undone steps. Put Retry(...) on the child's steps instead"
        )
    wait_for = options.pop("wait_for", ())
    if isinstance(wait_for, str):
        wait_for = (wait_for,)
    for name, value in options.items():
        if not isinstance(value, Template):
            raise DefinitionError(
                f"{what}({child.__qualname__}) argument {name}={value!r} must be "
                "arg.input(...), arg.result(...) or arg.value(...)"
            )
    impl = type(
        f"{base.__name__.removesuffix('Step')}{child.__name__}",
        (base,),
        {
            "child": child,
            "Inputs": getattr(child, "Inputs", None),
            "__module__": child.__module__,
            "__doc__": f"Runs {child.__qualname__} as one step.",
        },
    )
    return StepDeclaration(impl, dict(options), wait_for=tuple(wait_for), unit=unit)


def compose(child: type, /, **options: Any) -> StepDeclaration:
    """Declare a step that runs the reactor ``child`` with arguments wired like a step's.

    ``checkout = compose(Checkout, order_id=arg.input("order_id"), wait_for=["reserve"])``.
    The child's ``Inputs`` serializer validates the arguments (a violation fails the step
    without rollback of the child, which never started). The step's result is the child's
    value.
    """
    return child_declaration(child, options, "compose", ComposeStep, None)


class Compose(Construct):
    """Runs a composed child through the executor's child runner; its rollback is the child's."""

    name = "compose"

    def claims(self, spec: StepSpec) -> bool:
        return spec.child is not None

    def run(
        self, run: RunContext, spec: StepSpec, arguments: dict[str, object], started_at: dt.datetime
    ) -> StepResult:
        """Run (or continue) the child as this step; map its outcome onto the step."""
        refused = unstorable_arguments(run, spec, arguments)
        if refused is not None:
            return refused
        child = spec.child
        assert child is not None  # the steps this construct claims
        runner = child_runner(run, spec)
        run.notices.step_started(spec.name, 1)
        t0 = time.perf_counter()
        try:
            outcome = runner.run(spec.name, child.definition, arguments)
        except INTERRUPTIONS as interruption:
            run.abort(
                interruption, spec=spec, arguments=arguments, attempt=1, started_at=started_at
            )
            raise
        duration = (time.perf_counter() - t0) * 1000
        if isinstance(outcome, Completed):
            return StepDone(outcome.value, attempts=1, duration_ms=duration)
        if isinstance(outcome, Halted):
            return StepHalted(outcome.reason, attempts=1, duration_ms=duration)
        if isinstance(outcome, Rescheduled):
            return Stop(_park_with_child(run, spec, outcome))
        if isinstance(outcome, Paused):
            return _wait_for_child(run, spec, outcome, started_at)
        child_error = getattr(outcome, "error", None)
        name = child.__qualname__
        if child_error is not None:
            error = ErrorInfo(
                **{
                    **child_error._fields(),
                    "message": f"composed {name} failed: {child_error}",
                    "step": spec.name,
                    "reactor": run.definition.name,
                    "inputs": run.redacted_inputs(),
                    "arguments": run.redacted_arguments(spec, arguments),
                    # What the child could not roll back is tried again by this step's
                    # compensation (the child's own rollback) and reported from there.
                    "rollback_failures": (),
                }
            )
        else:
            error = run.step_error(spec, ErrorKind.STEP, f"composed {name} ended {outcome.status}")
        # The child rolled itself back already. Compensating this step re-runs the child's
        # rollback, which does nothing unless part of it failed: then it is tried again here,
        # and once more by an operator's undo().
        return StepFailed(error, started=True, attempts=1)

    def catch_up(self, run: RunContext) -> None:
        """A compose step waits for its paused child: offer it again if a payload was accepted
        below it (or the child moved on), so the step continues the child."""
        state = run.state
        if not state.waiting or run.children is None:
            return
        for spec in run.definition.steps:
            if spec.name not in state.waiting or spec.child is None:
                continue
            accepted = run.children.accepted(spec.name)
            if accepted is None:
                continue  # still waiting: it is rolled back in its place if the run fails
            state.waiting.discard(spec.name)
            # The step records its own undo entry when the child completes.
            state.forget_undo(spec.name)
            for path in accepted:
                run.note(EventKind.PAYLOAD, step=f"{spec.name}.{path}")

    def pause(self, run: RunContext, waiting: list[str]) -> Outcome:
        """Nothing can run while a child waits: the run pauses as at an interrupt of its own."""
        return INTERRUPT.pause(run, waiting)

    def restore(self, state: RunState, spec: StepSpec | None, record: RecordedStep) -> None:
        """A step whose child paused waits, and is rolled back in its place (the child undoes
        what it completed) unless that was done already."""
        if record.status == StepStatus.WAITING:
            state.waiting.add(record.step)
            if record.compensable and state.rolls_back(record):
                state.rolled_back_in_place(record.step)
            return
        super().restore(state, spec, record)

    def restore_unfinished(self, state: RunState, spec: StepSpec) -> None:
        """The run stopped inside the child (it halted, or the run stopped while it waited):
        the child's rollback undoes what it completed, in the step's place."""
        state.rolled_back_in_place(spec.name)

    def rollback(
        self,
        run: RunContext,
        spec: StepSpec,
        action: RollbackAction,
        first: object,
        arguments: dict[str, object],
    ) -> list[RollbackFailure]:
        """Undo (or, cut off mid-run, compensate) the child: its own rollback."""
        t0 = time.perf_counter()
        failures = [_nested(spec.name, f) for f in child_runner(run, spec).rollback(spec.name)]
        return record_nested_rollback(
            run,
            spec,
            action,
            failures,
            f"{len(failures)} step(s) of the composed reactor could not be rolled back",
            (time.perf_counter() - t0) * 1000,
        )


def child_runner(run: RunContext, spec: StepSpec) -> ChildRunner:
    """The executor's child runner; a step that needs one fails loudly without it."""
    if run.children is None:
        raise ReactorError(
            f"step {spec.name!r} needs a child runner (compose, async_step, async_reactor), "
            "but this executor has none"
        )
    return run.children


def _park_with_child(run: RunContext, spec: StepSpec, child: Rescheduled) -> Rescheduled:
    """A composed child waits (a retry's backoff, an async unit): the run waits with it.

    The worker is released; the retry's dispatch (or the unit's completion) resumes this run,
    which re-enters the compose step and continues the child where it stopped.
    """
    event = run.event(
        EventKind.PARK, step=spec.name, data={"child_step": child.step, "reason": child.reason}
    )
    return run.park(
        spec.name,
        reason=child.reason,
        delay=child.delay,
        event=event,
        by_task=child.reason == "retry",
    )


def _wait_for_child(
    run: RunContext, spec: StepSpec, child: Paused, started_at: dt.datetime
) -> StepResult:
    """The child paused at interrupts: this step waits for it, and the run goes on with the
    steps that do not need it (it pauses when nothing else can run).

    Each interrupt the child reached gets an ``interrupt`` entry here under its path
    (``<step>.<interrupt>``); the step's record says ``waiting``, and is rolled back in its
    place (the child undoes what it completed) if the run fails or is undone meanwhile.
    """
    reached = reached_interrupts(run)
    events = []
    for pending in child.interrupts:
        path = f"{spec.name}.{pending.step}"
        reached[path] = dataclasses.replace(pending, step=path)
        events.append(interrupt_event(run, path, pending.correlation_id, pending.expires_at))
    if events or spec.name not in run.state.recorded:
        if not events:  # it paused before this run recorded it (its process died meanwhile)
            events.append(run.event(EventKind.INTERRUPT, step=spec.name))
        run.commit(
            JournalBatch(
                events=events,
                # compensable: the child started, so the waiting step has work to roll back.
                step=StepWrite.of(
                    spec, StepStatus.WAITING, events[0], 1, {}, started_at, compensable=True
                ),
                current_step=spec.name,
            )
        )
    run.state.waiting.add(spec.name)
    run.state.rolled_back_in_place(spec.name)
    return CONTINUE


def interrupt_paths(definition: ReactorDefinition) -> Iterator[str]:
    """Every interrupt a run of ``definition`` can wait at, by path from the run: its own
    (``"approval"``), then its composed children's (``"checkout.approval"``), in declaration
    order."""
    for spec in definition.steps:
        if spec.interrupt is not None:
            yield spec.name
        elif spec.child is not None:
            for path in interrupt_paths(spec.child.definition):
                yield f"{spec.name}.{path}"


def _nested(step: str, failure: RollbackFailure) -> RollbackFailure:
    """A child's rollback failure as seen from its parent: ``parent_step.child_step``."""
    return RollbackFailure(
        step=f"{step}.{failure.step}",
        action=failure.action,
        exception_class=failure.exception_class,
        message=failure.message,
    )


COMPOSE = Compose()
