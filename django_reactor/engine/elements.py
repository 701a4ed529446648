"""Running one map element, and undoing it, in memory.

An element is a run of the element reactor whose steps are not checkpointed one by one: the
element's whole outcome (its value or error, and what it needs to be undone) is stored in its
slot when it settles. A crash before that runs the element again from its first step, as a
crash inside a step runs that step again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid5

from ..states import ElementStatus, ExecutionStatus
from .constructs import construct_for
from .context import Reconnect
from .executor import Executor
from .journal import MemoryJournal
from .outcomes import (
    Completed,
    ErrorInfo,
    ErrorKind,
    Failed,
    Halted,
    Outcome,
    Paused,
    RollbackFailure,
)
from .serialization import JSONObject, JSONValue, decode, encode
from .spec import ReactorDefinition
from .state import RunState, UndoEntry
from .validation import summarise_errors, validate


@dataclass(slots=True)
class ElementOutcome:
    """What one element did, ready to be stored in its slot (values already encoded)."""

    status: str
    value: object = None
    error: JSONObject | None = None
    undo: JSONObject | None = None
    halt_reason: str = ""


def element_id(map_id: UUID, index: int) -> UUID:
    """The stable identity of one element: the same on every attempt, unique per element.

    Its steps see it as ``context.execution_id``, so their idempotency keys differ from one
    element to the next and stay the same when an element runs again after a crash.
    """
    return uuid5(map_id, str(index))


@dataclass(frozen=True, slots=True)
class RunningElement:
    """Which map element is running (or being undone) in this context."""

    map_id: UUID
    index: int


_current_element: ContextVar[RunningElement | None] = ContextVar(
    "django_reactor_element", default=None
)


def current_element() -> RunningElement | None:
    """The map element whose steps run now, or None outside a map element.

    Set by the map runner around each element's run and undo, so code that only sees the
    element's ``StepContext`` (whose ``execution_id`` is :func:`element_id`) can know the
    element's index; ``django_reactor.testing`` uses it to replace a step of one element.
    """
    return _current_element.get()


class _Running:
    """:func:`running_element`'s block (a class: cheaper than a generator per element)."""

    __slots__ = ("ref", "token")

    def __init__(self, ref: RunningElement) -> None:
        self.ref = ref

    def __enter__(self) -> RunningElement:
        self.token = _current_element.set(self.ref)
        return self.ref

    def __exit__(self, *exc: object) -> None:
        _current_element.reset(self.token)


def running_element(map_id: UUID, index: int) -> AbstractContextManager[RunningElement]:
    """Make element ``index`` of map ``map_id`` :func:`current_element` while the block runs."""
    return _Running(RunningElement(map_id, index))


class ElementRunner:
    """Runs elements of one map with its element reactor, one after another.

    What is the same for every element is worked out once, not per element: the steps whose
    results an undo needs, the executor's retry cap and reconnect.
    """

    __slots__ = (
        "definition",
        "map_id",
        "max_retry_delay",
        "reconnect",
        "sleep",
        "undoing",
    )

    def __init__(
        self,
        definition: ReactorDefinition,
        map_id: UUID | None = None,
        *,
        max_retry_delay: float | None = None,
        reconnect: Reconnect | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.definition = definition
        self.map_id = map_id
        self.max_retry_delay = max_retry_delay
        self.reconnect = reconnect
        self.sleep = sleep
        by_name = definition.by_name
        #: The element reactor's steps that have an undo.
        self.undoing = frozenset(
            name for name, spec in by_name.items() if construct_for(spec).undoes(spec)
        )

    def run_at(self, index: int, inputs: Mapping[str, object]) -> ElementOutcome:
        """Run element ``index`` of this runner's map: its identity, and it is
        :func:`current_element` while it runs."""
        assert self.map_id is not None, "a runner without a map has no element indexes"
        with running_element(self.map_id, index):
            return self.run(inputs, identity=element_id(self.map_id, index))

    def run(self, inputs: Mapping[str, object], *, identity: UUID | None = None) -> ElementOutcome:
        """Run the element reactor on ``inputs``; a failed element has rolled itself back."""
        definition = self.definition
        if definition.inputs_serializer is not None:
            validated, errors = validate(definition.inputs_serializer, inputs)
            if validated is None:
                error = ErrorInfo(
                    kind=ErrorKind.CONTRACT,
                    message="the element's inputs do not satisfy "
                    f"{definition.reactor_class.__qualname__}.Inputs: "
                    f"{summarise_errors(errors)}",
                    reactor=definition.name,
                    field_errors=errors or {},
                    retryable=False,
                )
                return ElementOutcome(ElementStatus.FAILED, error=error.to_dict())
            inputs = validated
        journal = MemoryJournal(identity)
        executor = Executor.in_memory(
            definition,
            journal,
            inputs=inputs,
            max_retry_delay=self.max_retry_delay,
            reconnect=self.reconnect,
            sleep=self.sleep,
        )
        outcome: Outcome = executor.run()
        if isinstance(outcome, Completed):
            # An element none of whose steps has an undo stores nothing to undo. Otherwise
            # every completed step's result is kept (the undoing steps' arguments are read
            # from them).
            stack = executor.state.undo_stack
            undoing = self.undoing
            steps: list[JSONValue] = [e.step for e in stack if e.step in undoing]
            undo: JSONObject | None = (
                {"steps": steps, "results": {e.step: encode(e.result) for e in stack}}
                if steps
                else None
            )
            return ElementOutcome(ElementStatus.SUCCEEDED, value=journal.result, undo=undo)
        if isinstance(outcome, Paused):
            waiting = ", ".join(p.step for p in outcome.interrupts) or "an interrupt"
            error = ErrorInfo(
                kind=ErrorKind.STEP,
                message=f"interrupt {waiting} cannot pause inside a map element: a map element "
                "runs to its end. Move the interrupt to the reactor that declares the map",
                reactor=definition.name,
                step=waiting,
                retryable=False,
            )
            failures = executor.rollback(final_status=ExecutionStatus.FAILED, failure=error)
            outcome = Failed(
                execution_id=None, error=error.with_rollback_failures(failures), status="failed"
            )
        if isinstance(outcome, Halted):
            return ElementOutcome(ElementStatus.HALTED, halt_reason=outcome.reason or "")
        error_info = getattr(outcome, "error", None)
        error_dict = (
            error_info.to_dict()
            if error_info is not None
            else {"kind": ErrorKind.STEP, "message": f"the element ended {outcome.status}"}
        )
        return ElementOutcome(ElementStatus.FAILED, error=error_dict)


def run_element(
    definition: ReactorDefinition,
    inputs: Mapping[str, object],
    *,
    identity: UUID | None = None,
    max_retry_delay: float | None = None,
    reconnect: Reconnect | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ElementOutcome:
    """Run the element reactor on ``inputs`` once (:class:`ElementRunner` runs many); a
    failed element has rolled itself back (``reconnect``: how its steps' bodies recover a lost
    database connection)."""
    runner = ElementRunner(
        definition, max_retry_delay=max_retry_delay, reconnect=reconnect, sleep=sleep
    )
    return runner.run(inputs, identity=identity)


def rollback_element(
    definition: ReactorDefinition,
    inputs: Mapping[str, object],
    undo: Mapping[str, Any] | None,
    *,
    identity: UUID | None = None,
    reconnect: Reconnect | None = None,
) -> list[RollbackFailure]:
    """Undo a succeeded element's completed steps, newest first; return what failed."""
    if not undo or not undo.get("steps"):
        return []
    results = {step: decode(value) for step, value in undo.get("results", {}).items()}
    state = RunState(results=results, done=set(results))
    executor = Executor.in_memory(
        definition, MemoryJournal(identity), inputs=inputs, state=state, reconnect=reconnect
    )
    state.undo_stack.extend(
        UndoEntry(step, executor.arguments_for(step), results.get(step))
        for step in undo["steps"]
        if step in definition.by_name
    )
    return executor.rollback(final_status=ExecutionStatus.CANCELLED)
