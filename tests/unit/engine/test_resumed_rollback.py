"""A rollback its process did not finish is resumed without running again a handler whose
failure it already recorded (handlers are not retried by themselves); an operator's undo
tries it again."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import Reactor, Step, step
from django_reactor.engine.executor import Executor
from django_reactor.engine.journal import MemoryJournal, RecordedStep, RunRecords
from django_reactor.engine.serialization import encode
from django_reactor.engine.state import RunState
from django_reactor.states import ExecutionStatus, RollbackStatus, StepStatus

UNDONE: list[str] = []


class Undoable(Step):
    def run(self, **arguments: Any) -> Any:
        return self.context.step

    def undo(self, result: Any, **arguments: Any) -> None:
        UNDONE.append(self.context.step)
        if self.context.step == "second":
            raise RuntimeError("second's undo failed")


class Three(Reactor):
    first = step(Undoable)
    second = step(Undoable, wait_for=["first"])
    third = step(Undoable, wait_for=["second"])


SECOND_FAILED = {
    "step": "second",
    "action": "undo",
    "exception_class": "RuntimeError",
    "message": "second's undo failed",
}


def records() -> RunRecords:
    """``third`` failed; the rollback undid nothing yet but ``second``, whose undo failed;
    then its process died (before ``first``'s undo)."""

    def done(name: str, **fields: Any) -> RecordedStep:
        return RecordedStep(name, StepStatus.COMPLETED, arguments={}, result=encode(name), **fields)

    return RunRecords(
        steps=[
            done("first", seq=2),
            done("second", seq=3, rollback=RollbackStatus.FAILED, rollback_error=SECOND_FAILED),
            RecordedStep("third", StepStatus.FAILED, error={"kind": "step", "message": "boom"}),
        ],
        last_seq=6,
        status=ExecutionStatus.ROLLING_BACK,
        failure={"kind": "step", "message": "boom", "step": "third"},
    )


@pytest.fixture(autouse=True)
def _clear() -> Any:
    UNDONE.clear()
    yield
    UNDONE.clear()


def test_a_resumed_rollback_does_not_run_a_failed_undo_again() -> None:
    state = RunState.restore(Three.definition, records())
    assert [entry.step for entry in state.undo_stack] == ["first"]
    journal = MemoryJournal()
    executor = Executor(Three.definition, journal, inputs={}, state=state)
    failures = executor.finish_rollback("resumed")
    assert UNDONE == ["first"]
    assert [(f.step, f.action, f.message) for f in failures] == [
        ("second", "undo", "second's undo failed")
    ]
    # Still a failed rollback: the run needs a person, who can undo it again.
    assert journal.statuses[-1] == ExecutionStatus.NEEDS_ATTENTION
    assert journal.failure is not None
    assert [f["step"] for f in journal.failure["rollback_failures"]] == ["second"]


def test_an_operators_undo_tries_the_failed_undo_again() -> None:
    state = RunState.restore(Three.definition, records(), for_rollback=True)
    assert [entry.step for entry in state.undo_stack] == ["first", "second"]
    executor = Executor(Three.definition, MemoryJournal(), inputs={}, state=state)
    executor.finish_rollback("undo requested")
    assert UNDONE == ["second", "first"]
