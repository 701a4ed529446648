"""The executor's side of coordination, against a fake coordinator (no backend, no database)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from django_reactor import (
    Completed,
    Dispatched,
    Failed,
    Halted,
    Lock,
    Period,
    RateLimit,
    Reactor,
    Rescheduled,
    Semaphore,
    Step,
    arg,
    step,
)
from django_reactor.engine.context import RunPolicy
from django_reactor.engine.coordination import (
    Blocked,
    CoordinationKeyError,
    resolve_key,
    windows_of,
)
from django_reactor.engine.executor import Executor, RunState
from django_reactor.engine.journal import MemoryJournal
from django_reactor.exceptions import DefinitionError
from tests.helpers import ledger


@dataclass
class Hold:
    fences: Mapping[str, int]
    released: list[bool] = field(default_factory=list)

    def release(self, succeeded: bool = True) -> None:
        self.released.append(succeeded)


@dataclass
class FakeCoordinator:
    """Answers ``enter``/``enter_step`` from queues; records what the executor told it."""

    run_answers: list[Blocked | None] = field(default_factory=list)
    step_answers: list[Blocked | None] = field(default_factory=list)
    lost: bool = False
    fences: dict[str, int] = field(default_factory=lambda: {"order-1": 7})
    notes: list[dict[str, Any]] = field(default_factory=list)
    exits: list[Any] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    snoozes: int = 3
    rollback_answers: list[Blocked | None] = field(default_factory=list)
    rollback_holds: list[Hold] = field(default_factory=list)

    def enter(self, *, new: bool) -> Blocked | None:
        answer = self.run_answers.pop(0) if self.run_answers else None
        if answer is None:
            self.notes.append({"lock": "order-1", "fence": 7})
        return answer

    def enter_rollback(self) -> None:
        return None

    def exit(self, status: Any) -> None:
        self.exits.append(status)

    def snoozes_left(self) -> bool:
        self.snoozes -= 1
        return self.snoozes >= 0

    def enter_step(self, step: str, declarations: Any, arguments: Any) -> Hold | Blocked:
        answer = self.step_answers.pop(0) if self.step_answers else None
        if answer is not None:
            return answer
        hold = Hold({"step-key": 3})
        self.holds.append(hold)
        return hold

    def enter_step_rollback(self, step: str, declarations: Any, arguments: Any) -> Hold | Blocked:
        answer = self.rollback_answers.pop(0) if self.rollback_answers else None
        if answer is not None:
            return answer
        hold = Hold({"step-key": 3})
        self.rollback_holds.append(hold)
        return hold


class Record(Step):
    coordination = [Semaphore("partner-{order_id}", limit=2)]

    def run(self, order_id: int) -> Any:
        from django_reactor import step_context

        ledger("run", "record")
        return dict(step_context().fences)


class Guarded(Reactor):
    @step(order_id=arg.input("order_id"))
    def first(order_id: int) -> int:
        ledger("run", "first")
        return order_id

    @first.undo
    def unfirst(result: int, order_id: int) -> None:
        ledger("undo", "first")

    record = step(Record, order_id=arg.input("order_id"), wait_for=["first"])

    class Meta:
        coordination = [Lock("order-{order_id}")]


def run(coordinator: FakeCoordinator, *, worker: bool = False, state: RunState | None = None):
    journal = MemoryJournal()
    executor = Executor(
        Guarded.definition,
        journal,
        inputs={"order_id": 1},
        state=state or RunState(next_seq=2),
        policy=RunPolicy(retry_later=worker),
        coordinator=coordinator,
    )
    return executor.run(), journal


def test_a_run_holds_its_coordination_and_the_trace_says_what_it_took() -> None:
    coordinator = FakeCoordinator()
    outcome, journal = run(coordinator)
    assert isinstance(outcome, Completed)
    assert outcome.value["record"] == {"step-key": 3}  # the step's own fences while it ran
    acquired = [e.data for e in journal.events if e.kind == "acquire"]
    assert acquired == [{"lock": "order-1", "fence": 7}]
    assert coordinator.exits == ["completed"]
    assert coordinator.holds[0].released == [True]


def test_a_halt_before_the_first_step_runs_nothing() -> None:
    coordinator = FakeCoordinator(run_answers=[Blocked("halt", "period 'x' claimed by r1")])
    outcome, journal = run(coordinator)
    assert isinstance(outcome, Halted)
    assert outcome.reason == "period 'x' claimed by r1"
    assert ledger.calls == []
    assert [e.kind for e in journal.events] == ["halt"]


def test_inline_contention_on_a_new_run_fails_it_retryably() -> None:
    coordinator = FakeCoordinator(run_answers=[Blocked("contention", "lock 'order-1' is held")])
    outcome, _ = run(coordinator)
    assert isinstance(outcome, Failed)
    assert (outcome.error.kind, outcome.error.retryable) == ("contention", True)
    assert ledger.calls == []
    assert coordinator.exits == ["not_started"]


def test_contention_on_a_worker_reschedules_the_run() -> None:
    coordinator = FakeCoordinator(
        run_answers=[Blocked("contention", "lock 'order-1' is held", retry_after=2.5)]
    )
    outcome, journal = run(coordinator, worker=True)
    assert isinstance(outcome, Rescheduled)
    assert (outcome.reason, outcome.delay) == ("contention", 2.5)
    (park,) = [e for e in journal.events if e.kind == "park"]
    assert park.data == {
        "waiting_for": "lock 'order-1' is held",
        "reason": "contention",
        "delay": 2.5,
    }
    assert journal.dispatches == [("retry", 2.5)]


def test_a_worker_gives_up_after_its_snoozes() -> None:
    coordinator = FakeCoordinator(
        run_answers=[Blocked("contention", "lock 'order-1' is held")], snoozes=0
    )
    outcome, _ = run(coordinator, worker=True)
    assert isinstance(outcome, Failed)
    assert "gave up after REACTOR['MAX_CONTENTION_SNOOZES']" in outcome.error.message


def test_an_inline_resume_that_cannot_hold_its_locks_goes_to_a_worker() -> None:
    state = RunState(next_seq=5, results={"first": 1}, done={"first"}, recorded={"first"})
    coordinator = FakeCoordinator(run_answers=[Blocked("contention", "lock held", retry_after=1)])
    outcome, journal = run(coordinator, state=state)
    assert isinstance(outcome, Dispatched)
    assert journal.dispatches == [("retry", 1)]


def test_a_step_denied_its_coordination_fails_without_compensation_inline() -> None:
    coordinator = FakeCoordinator(step_answers=[Blocked("contention", "no free slot")])
    outcome, journal = run(coordinator)
    assert isinstance(outcome, Failed)
    assert outcome.error.step == "record"
    assert "step 'record': no free slot" in outcome.error.message
    assert ledger.calls == [("run", "first"), ("undo", "first")]
    assert ("compensate_skipped", "record") not in [(e.kind, e.step) for e in journal.events]


def test_a_step_whose_period_is_claimed_is_skipped() -> None:
    coordinator = FakeCoordinator(step_answers=[Blocked("halt", "period claimed")])
    outcome, journal = run(coordinator)
    assert isinstance(outcome, Completed)
    assert ("skip", "record") in [(e.kind, e.step) for e in journal.events]
    assert ("run", "record") not in ledger.calls


def test_keys_resolve_from_format_strings_and_callables() -> None:
    assert resolve_key("order-{order_id}", {"order_id": 7}, "Lock") == "order-7"
    assert resolve_key(lambda order_id: f"o{order_id}", {"order_id": 7, "x": 1}, "Lock") == "o7"
    with pytest.raises(CoordinationKeyError, match=r"names \{customer\}, but only order_id"):
        resolve_key("c-{customer}", {"order_id": 1}, "Lock")
    with pytest.raises(CoordinationKeyError, match="must be a non-empty string, got 5"):
        resolve_key(lambda: 5, {}, "Lock")
    with pytest.raises(CoordinationKeyError, match="ZeroDivisionError"):
        resolve_key(lambda: 1 / 0, {}, "Lock")


def test_declarations_check_their_arguments() -> None:
    assert windows_of({"second": 3, "minute": 100}) == [(3, 1.0), (100, 60.0)]
    with pytest.raises(DefinitionError, match="not one of"):
        windows_of({"fortnight": 1})
    with pytest.raises(DefinitionError, match="Lock ttl must be longer than zero"):
        Lock("k", ttl=0)
    with pytest.raises(DefinitionError, match="Period every must be one of"):
        Period("k", every="decade")
    with pytest.raises(DefinitionError, match="needs a key and limits="):
        RateLimit("k")
    with pytest.raises(DefinitionError, match="must be a list of Lock"):

        class Wrong(Reactor):
            @step()
            def noop() -> None:
                return None

            class Meta:
                coordination = ["lock"]


class Booked(Step):
    coordination = [Lock("ledger-{order_id}", ttl=30)]

    def run(self, order_id: int) -> int:
        ledger("run", "booked")
        return order_id

    def undo(self, result: int, order_id: int) -> None:
        ledger("undo", "booked")


class BookThenFail(Reactor):
    booked = step(Booked, order_id=arg.input("order_id"))

    @step(wait_for=["booked"])
    def refuse() -> None:
        raise RuntimeError("declined")


def rollback_run(coordinator: FakeCoordinator) -> tuple[Any, MemoryJournal]:
    journal = MemoryJournal()
    executor = Executor(
        BookThenFail.definition,
        journal,
        inputs={"order_id": 1},
        state=RunState(next_seq=2),
        coordinator=coordinator,
    )
    return executor.run(), journal


def test_an_undo_runs_holding_its_steps_lock() -> None:
    coordinator = FakeCoordinator()
    outcome, journal = rollback_run(coordinator)
    assert isinstance(outcome, Failed)
    assert ledger.calls == [("run", "booked"), ("undo", "booked")]
    assert [h.released for h in coordinator.rollback_holds] == [[True]]
    assert ("undo", "booked") in [(e.kind, e.step) for e in journal.events]


def test_an_undo_whose_lock_another_run_holds_does_not_run_and_is_reported() -> None:
    held = Blocked("contention", "lock 'ledger-1' is held by execution other")
    coordinator = FakeCoordinator(rollback_answers=[held])
    outcome, journal = rollback_run(coordinator)
    assert isinstance(outcome, Failed)
    assert outcome.status == "needs_attention"
    assert ledger.calls == [("run", "booked")]  # the undo never ran unlocked
    (failure,) = outcome.error.rollback_failures
    assert (failure.step, failure.action, failure.kind) == (
        "booked",
        "undo",
        "coordination_unavailable",
    )
    assert "lock 'ledger-1' is held by execution other" in failure.message
    (event,) = [e for e in journal.events if e.kind == "undo_failed"]
    assert event.data["kind"] == "coordination_unavailable"
    assert journal.rollbacks["booked"].status == "failed"
