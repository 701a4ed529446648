"""Running one map element, and undoing it, in memory.

An element is a run of the element reactor whose steps are not checkpointed one by one: the
element's whole outcome (its value or error, and what it needs to be undone) is stored in its
slot when it settles. A crash before that runs the element again from its first step, as a
crash inside a step runs that step again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
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
    duration_ms: float = 0.0
    events: list[JSONObject] = field(default_factory=list)


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


@contextmanager
def running_element(map_id: UUID, index: int) -> Iterator[RunningElement]:
    """Make element ``index`` of map ``map_id`` :func:`current_element` while the block runs."""
    ref = RunningElement(map_id, index)
    token = _current_element.set(ref)
    try:
        yield ref
    finally:
        _current_element.reset(token)


def run_element(
    definition: ReactorDefinition,
    inputs: Mapping[str, object],
    *,
    identity: UUID | None = None,
    max_retry_delay: float | None = None,
    reconnect: Reconnect | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ElementOutcome:
    """Run the element reactor on ``inputs``; a failed element has rolled itself back
    (``reconnect``: how its steps' bodies recover a lost database connection)."""
    t0 = time.perf_counter()
    if definition.inputs_serializer is not None:
        validated, errors = validate(definition.inputs_serializer, inputs)
        if validated is None:
            error = ErrorInfo(
                kind=ErrorKind.CONTRACT,
                message="the element's inputs do not satisfy "
                f"{definition.reactor_class.__qualname__}.Inputs: {summarise_errors(errors)}",
                reactor=definition.name,
                field_errors=errors or {},
                retryable=False,
            )
            return ElementOutcome(ElementStatus.FAILED, error=error.to_dict(), duration_ms=_ms(t0))
        inputs = validated
    journal = MemoryJournal(identity)
    executor = Executor.in_memory(
        definition,
        journal,
        inputs=inputs,
        max_retry_delay=max_retry_delay,
        reconnect=reconnect,
        sleep=sleep,
    )
    outcome: Outcome = executor.run()
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
    if isinstance(outcome, Completed):
        # An element none of whose steps has an undo stores nothing to undo. Otherwise every
        # completed step's result is kept (the undoing steps' arguments are read from them).
        stack = executor.state.undo_stack
        by_name = definition.by_name
        undoing: list[JSONValue] = [
            e.step for e in stack if construct_for(by_name[e.step]).undoes(by_name[e.step])
        ]
        undo: JSONObject | None = (
            {"steps": undoing, "results": {e.step: encode(e.result) for e in stack}}
            if undoing
            else None
        )
        return ElementOutcome(
            ElementStatus.SUCCEEDED, value=journal.result, undo=undo, duration_ms=_ms(t0)
        )
    if isinstance(outcome, Halted):
        return ElementOutcome(
            ElementStatus.HALTED, halt_reason=outcome.reason or "", duration_ms=_ms(t0)
        )
    error_info = getattr(outcome, "error", None)
    error_dict = (
        error_info.to_dict()
        if error_info is not None
        else {"kind": ErrorKind.STEP, "message": f"the element ended {outcome.status}"}
    )
    return ElementOutcome(ElementStatus.FAILED, error=error_dict, duration_ms=_ms(t0))


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


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000
