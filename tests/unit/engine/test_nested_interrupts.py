"""The compose construct and a child that pauses at an interrupt, with no database: an
in-memory child runner stands in for the Django layer's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django_reactor import Reactor, Step, arg, compose, interrupt, step
from django_reactor.engine.constructs.compose import interrupt_paths
from django_reactor.engine.constructs.interrupt import reached_interrupts
from django_reactor.engine.executor import Executor, RunState, UndoEntry
from django_reactor.engine.journal import MemoryJournal
from django_reactor.engine.outcomes import Completed, Outcome, Paused, RollbackFailure
from django_reactor.engine.spec import ReactorDefinition
from django_reactor.states import ExecutionStatus, StepStatus
from tests.helpers import ledger, trace


class Noted(Step):
    def run(self, **arguments: Any) -> Any:
        ledger("run", self.context.step)
        return {"step": self.context.step, **arguments}

    def undo(self, result: Any, **arguments: Any) -> None:
        ledger("undo", self.context.step)


class MemoryChild(Reactor):
    charge = step(Noted)
    approval = interrupt(after="charge")
    ship = step(Noted, approved=arg.result("approval", "approved"))


class MemoryParent(Reactor):
    reserve = step(Noted)
    checkout = compose(MemoryChild, wait_for=["reserve"])
    receipt = step(Noted, wait_for=["checkout"])


class MemoryChildren:
    """Runs composed children in memory, keeping each child's journal and state by step."""

    def __init__(self) -> None:
        self.journals: dict[str, MemoryJournal] = {}
        self.states: dict[str, RunState] = {}
        self.claimed: dict[str, dict[str, Any]] = {}

    def run(self, step: str, definition: ReactorDefinition, inputs: Mapping[str, Any]) -> Outcome:
        journal = self.journals.setdefault(step, MemoryJournal())
        state = self.states.setdefault(step, RunState())
        state.claimed.update(self.claimed.pop(step, {}))
        child = Executor(definition, journal, inputs=dict(inputs), state=state)
        outcome = child.run()
        if isinstance(outcome, Paused):
            reached = reached_interrupts(child)
            return Paused(
                execution_id=None,
                interrupts=tuple(i for i in outcome.interrupts if i.step in reached),
            )
        return outcome

    def accepted(self, step: str) -> tuple[str, ...] | None:
        return tuple(self.claimed.get(step, {})) or None

    def rollback(self, step: str) -> list[RollbackFailure]:
        state = self.states[step]
        child = Executor(MemoryChild.definition, self.journals[step], inputs={}, state=state)
        return child.rollback(final_status=ExecutionStatus.CANCELLED)


def paused_parent() -> tuple[Executor, MemoryChildren, MemoryJournal, Outcome]:
    children = MemoryChildren()
    journal = MemoryJournal()
    parent = Executor(MemoryParent.definition, journal, inputs={}, children=children)  # type: ignore[arg-type]
    return parent, children, journal, parent.run()


def test_the_child_at_its_interrupt_pauses_the_parent_which_lists_it_by_path() -> None:
    _parent, children, journal, outcome = paused_parent()

    assert isinstance(outcome, Paused)
    assert [i.step for i in outcome.interrupts] == ["checkout.approval"]
    assert trace(journal) == [("run", "reserve"), ("interrupt", "checkout.approval")]
    record = journal.steps["checkout"]
    assert (record.status, record.compensable) == (StepStatus.WAITING, True)
    assert journal.statuses[-1] == ExecutionStatus.PAUSED
    assert journal.events[-1].data == {"waiting_for": ["checkout.approval"]}
    assert children.journals["checkout"].statuses[-1] == ExecutionStatus.PAUSED


def test_the_waiting_child_is_rolled_back_in_its_place_before_the_parents_steps() -> None:
    parent, _children, journal, _outcome = paused_parent()

    assert [e.step for e in parent.state.undo_stack] == ["reserve", "checkout"]
    parent.rollback(final_status=ExecutionStatus.CANCELLED)

    assert ledger.calls[-2:] == [("undo", "charge"), ("undo", "reserve")]
    assert trace(journal)[-2:] == [("undo", "checkout"), ("undo", "reserve")]


def test_a_payload_accepted_below_makes_the_parent_continue_the_child() -> None:
    parent, children, journal, _outcome = paused_parent()
    children.claimed["checkout"] = {"approval": {"approved": True}}
    # The parent resumes as the store would load it: checkout waits, in the undo stack.
    state = RunState(
        results=dict(parent.state.results),
        done={"reserve"},
        undo_stack=[UndoEntry("reserve", {}, parent.state.results["reserve"])],
        waiting={"checkout"},
        next_seq=parent.state.next_seq,
    )
    state.undo_stack.append(UndoEntry("checkout", {}, None))
    resumed = Executor(MemoryParent.definition, journal, inputs={}, state=state, children=children)  # type: ignore[arg-type]

    outcome = resumed.run()

    assert isinstance(outcome, Completed)
    assert trace(journal)[-3:] == [
        ("payload", "checkout.approval"),
        ("run", "checkout"),
        ("run", "receipt"),
    ]
    assert [e.step for e in resumed.state.undo_stack] == ["reserve", "checkout", "receipt"]
    assert ledger.calls[-2:] == [("run", "ship"), ("run", "receipt")]


def test_interrupt_paths_list_a_reactors_own_and_its_childrens_interrupts() -> None:
    class MemoryOuter(Reactor):
        review = interrupt()
        parent = compose(MemoryParent, wait_for=["review"])

    assert list(interrupt_paths(MemoryParent.definition)) == ["checkout.approval"]
    assert list(interrupt_paths(MemoryOuter.definition)) == ["review", "parent.checkout.approval"]
