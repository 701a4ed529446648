"""Steps side by side (``Meta.max_concurrency``) in the pure executor, on a memory journal.

Concurrency is shown with barriers and events (a barrier of three passes only when three steps
run at once), never with sleeps or timings.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from django_reactor import Failure, Halt, Reactor, Retry, Step, Success, arg, step
from django_reactor.engine.context import RunPolicy
from django_reactor.engine.executor import Executor, RunState
from django_reactor.engine.journal import MemoryJournal
from django_reactor.engine.outcomes import Rescheduled
from django_reactor.exceptions import DefinitionError
from django_reactor.states import EventKind, ExecutionStatus
from tests.helpers import ledger, run_in_memory, trace

WAIT = 10  # seconds any barrier or event waits at most: far longer than the steps need


class Gate:
    """Shared by the steps of one test: a barrier, events, and the most steps seen at once."""

    def __init__(self, parties: int = 1) -> None:
        self.barrier = threading.Barrier(parties, timeout=WAIT)
        self.events: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0

    def event(self, name: str) -> threading.Event:
        with self.lock:
            return self.events.setdefault(name, threading.Event())

    def enter(self) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)

    def leave(self) -> None:
        with self.lock:
            self.running -= 1


gate = Gate()


@pytest.fixture(autouse=True)
def fresh_gate() -> None:
    global gate
    gate = Gate()


class Meets(Step):
    """Waits at the barrier (so it passes only with the others), then records its run."""

    def run(self, **arguments: Any) -> Any:
        gate.enter()
        try:
            gate.barrier.wait()
            ledger("run", self.context.step)
            return Success(self.context.step)
        finally:
            gate.leave()

    def undo(self, result: Any, **arguments: Any) -> None:
        ledger("undo", self.context.step)


class Acts(Step):
    """Does what ``how`` says: waits for events, sets events, fails, halts."""

    def run(self, how: dict[str, Any]) -> Any:
        gate.enter()
        try:
            for name in how.get("wait", ()):
                assert gate.event(name).wait(WAIT), f"{name} never came"
            ledger("run", self.context.step)
            outcome: Any = Success(self.context.step)
            if how.get("fail"):
                outcome = Failure(RuntimeError(f"{self.context.step} failed"), retryable=False)
            if how.get("halt"):
                outcome = Halt(f"{self.context.step} has seen enough")
            return outcome
        finally:
            gate.leave()
            for name in how.get("set", ()):
                gate.event(name).set()

    def undo(self, result: Any, how: dict[str, Any]) -> None:
        ledger("undo", self.context.step)

    def compensate(self, error: Any, how: dict[str, Any]) -> None:
        ledger("compensate", self.context.step)


def acts(**how: Any) -> Any:
    return step(Acts, how=arg.value(how))


def launches(journal: MemoryJournal) -> list[dict[str, Any]]:
    return [e.data for e in journal.events if e.kind == EventKind.LAUNCH]


def test_ready_steps_run_at_the_same_time_and_the_trace_says_so() -> None:
    class Fetch(Reactor):
        a = step(Meets)
        b = step(Meets)
        c = step(Meets)
        total = step(Acts, how=arg.value({}), wait_for=["a", "b", "c"])

        class Meta:
            max_concurrency = 3

    gate.barrier = threading.Barrier(3, timeout=WAIT)
    outcome, journal = run_in_memory(Fetch)
    assert outcome.ok, outcome
    assert gate.most == 3  # the barrier of three passed: a, b and c ran at once
    assert launches(journal) == [{"steps": ["a", "b", "c"]}]
    steps = trace(journal)
    assert sorted(steps[:3]) == [("run", "a"), ("run", "b"), ("run", "c")]
    assert steps[3:] == [("run", "total")]  # alone, once the three are done


def test_steps_that_become_ready_together_start_together() -> None:
    """Once the steps in flight have settled, the steps they made ready start side by side
    again (the loop never runs one of them alone while another is ready beside it)."""

    class Diamonds(Reactor):
        a = step(Meets)
        b = step(Meets)
        c = step(Meets, wait_for=["a", "b"])
        d = step(Meets, wait_for=["a", "b"])

        class Meta:
            max_concurrency = 2

    gate.barrier = threading.Barrier(2, timeout=WAIT)
    outcome, journal = run_in_memory(Diamonds)
    assert outcome.ok, outcome
    assert launches(journal) == [{"steps": ["a", "b"]}, {"steps": ["c", "d"]}]


def test_no_more_than_max_concurrency_run_at_once_and_they_start_in_order() -> None:
    class Five(Reactor):
        a = step(Meets)
        b = step(Meets)
        c = acts()
        d = acts()
        e = acts()

        class Meta:
            max_concurrency = 2

    gate.barrier = threading.Barrier(2, timeout=WAIT)
    outcome, journal = run_in_memory(Five)
    assert outcome.ok, outcome
    assert gate.most == 2  # a and b met at the barrier of two
    assert launches(journal)[0] == {"steps": ["a", "b"]}
    started = [name for data in launches(journal) for name in data["steps"]]
    # In declaration order (the last ones may have run alone once the others were done).
    assert started == ["a", "b", "c", "d", "e"][: len(started)]
    assert sorted(name for kind, name in trace(journal) if kind == "run") == list("abcde")
    for data in launches(journal)[1:]:
        # Each later launch names what still ran beside it: never more than two in all.
        assert len(data["steps"]) + len(data.get("alongside", [])) <= 2


def test_a_chain_runs_as_without_max_concurrency() -> None:
    class Chain(Reactor):
        a = acts()
        b = step(Acts, how=arg.value({}), wait_for=["a"])

        class Meta:
            max_concurrency = 4

    outcome, journal = run_in_memory(Chain)
    assert outcome.ok
    assert launches(journal) == []
    assert trace(journal) == [("run", "a"), ("run", "b")]


class FailureSignals(MemoryJournal):
    """Sets the gate's "failure recorded" event once a batch starts the run's rollback."""

    def commit(self, batch: Any) -> str | None:
        cancel = super().commit(batch)
        if batch.status == ExecutionStatus.ROLLING_BACK:
            gate.event("failure recorded").set()
        return cancel


def test_a_failure_stops_new_steps_lets_those_in_flight_settle_then_rolls_back() -> None:
    class Fails(Reactor):
        done_first = acts(set=["first"])
        a = acts(wait=["first"], fail=True)
        b = acts(wait=["first", "failure recorded"])  # still running when a's failure is
        later = step(Acts, how=arg.value({}), wait_for=["b"])  # ready after it: never starts

        class Meta:
            max_concurrency = 3

    outcome, journal = run_in_memory(Fails, journal=FailureSignals())
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.step == "a"
    assert ("run", "later") not in ledger.calls
    steps = trace(journal)
    # b completed after a's failure was recorded, before the rollback started; the rollback
    # compensates a, then undoes in reverse order of completion (the order of the records).
    assert steps.index(("fail", "a")) < steps.index(("run", "b"))
    completed = [name for kind, name in steps if kind == "run"]
    assert sorted(completed) == ["b", "done_first"]
    assert steps[-3:] == [("compensate", "a")] + [("undo", name) for name in completed[::-1]]
    assert journal.statuses[-1] == ExecutionStatus.FAILED


def test_a_halt_stops_new_steps_and_ends_the_run_without_rollback() -> None:
    class Halts(Reactor):
        a = acts(halt=True, set=["halted"])
        b = acts(wait=["halted"])
        later = acts()

        class Meta:
            max_concurrency = 2

    outcome, journal = run_in_memory(Halts)
    assert outcome.status == ExecutionStatus.HALTED
    assert outcome.step == "a"
    assert ("run", "b") in trace(journal)  # settled and recorded
    assert ("run", "later") not in ledger.calls
    assert not [c for c in ledger.calls if c[0] == "undo"]


def test_retries_run_in_their_lane_inline() -> None:
    tries: list[str] = []

    class Flaky(Step):
        retry = Retry(attempts=3, delay=2)

        def run(self) -> Any:
            tries.append(self.context.step)
            if self.context.attempt < 3:
                raise RuntimeError("timeout")
            return "ok"

    class Retries(Reactor):
        a = step(Flaky)
        b = acts()

        class Meta:
            max_concurrency = 2

    sleeps: list[float] = []
    outcome, journal = run_in_memory(Retries, sleeps=sleeps)
    assert outcome.ok
    assert tries == ["a", "a", "a"]
    assert sleeps == [2, 4] or sleeps == [2, 2]  # the backoff waited in a's lane
    assert [(e.kind, e.attempt) for e in journal.events if e.step == "a"] == [
        (EventKind.RETRY, 1),
        (EventKind.RETRY, 2),
        (EventKind.RUN, 3),
    ]


def test_on_a_worker_a_retry_parks_the_run_once_the_others_settle() -> None:
    class Later(Step):
        retry = Retry(attempts=3, delay=30)

        def run(self) -> Any:
            gate.event("a tried").set()
            raise RuntimeError("partner down")

    class Waits(Reactor):
        a = step(Later)
        b = acts(wait=["a tried"])
        c = acts(wait=["a tried"])

        class Meta:
            max_concurrency = 3

    journal = MemoryJournal()
    executor = Executor(
        Waits.definition, journal, inputs={}, state=RunState(), policy=RunPolicy(retry_later=True)
    )
    outcome = executor.run()
    assert isinstance(outcome, Rescheduled)
    assert outcome.step == "a"
    assert outcome.delay == 30
    assert journal.dispatches == [("retry", 30)]
    assert journal.statuses == [ExecutionStatus.PENDING]
    steps = trace(journal)
    assert ("run", "b") in steps
    assert ("run", "c") in steps
    assert steps[-1] == ("park", "a")
    assert ("retry", "a") in steps


def test_an_argument_that_cannot_be_resolved_stops_the_run_after_the_others() -> None:
    class Bad(Reactor):
        a = acts(set=["a"])
        b = acts(wait=["a"], set=["b"])
        c = acts(wait=["b"])
        broken = step(Acts, how=arg.result("a", "missing"))

        class Meta:
            max_concurrency = 3

    outcome, journal = run_in_memory(Bad)
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.step == "broken"
    assert ("compensate", "broken") not in trace(journal)  # it never started


def test_a_cancellation_takes_effect_once_the_steps_in_flight_settle() -> None:
    journal = MemoryJournal()

    class Cancelling(Step):
        def run(self) -> Any:
            journal.cancel_requested = "stop, please"
            return "asked"

    class Cancels(Reactor):
        asks = step(Cancelling)
        b = acts()
        c = acts()
        later = step(Acts, how=arg.value({}), wait_for=["asks", "b", "c"])

        class Meta:
            max_concurrency = 3

    outcome, _ = run_in_memory(Cancels, journal=journal)
    assert outcome.status == ExecutionStatus.CANCELLED
    assert ("run", "later") not in ledger.calls


def test_a_pause_takes_effect_once_the_steps_in_flight_settle() -> None:
    journal = MemoryJournal()

    class Pausing(Step):
        def run(self) -> Any:
            journal.pause_requested = "partner outage"
            return "asked"

    class Pauses(Reactor):
        asks = step(Pausing)
        b = acts()
        c = acts()
        later = step(Acts, how=arg.value({}), wait_for=["asks", "b", "c"])

        class Meta:
            max_concurrency = 3

    outcome, _ = run_in_memory(Pauses, journal=journal)
    assert outcome.status == ExecutionStatus.SUSPENDED
    assert journal.statuses[-1] == ExecutionStatus.SUSPENDED
    assert journal.events[-1].kind == "suspend"
    assert journal.events[-1].data["reason"] == "partner outage"
    # What was in flight settled and was recorded; nothing started after the pause.
    assert {"asks", "b", "c"} <= set(journal.steps)
    assert ("run", "later") not in ledger.calls


def test_hand_off_after_a_step_waits_for_the_others() -> None:
    class Hands(Reactor):
        a = acts(set=["a"])
        b = acts(wait=["a"])
        c = step(Acts, how=arg.value({}), wait_for=["a", "b"])

        class Meta:
            max_concurrency = 2
            background = {"after": "a"}

    journal = MemoryJournal()
    executor = Executor(
        Hands.definition, journal, inputs={}, state=RunState(), policy=RunPolicy(hand_off=True)
    )
    outcome = executor.run()
    assert outcome.status == ExecutionStatus.PENDING
    assert journal.dispatches == [("handoff", 0.0)]
    assert ("run", "b") in trace(journal)
    assert ("run", "c") not in ledger.calls


@pytest.mark.parametrize("value", [0, -1, 1.5, "4", True, None])
def test_max_concurrency_must_be_a_positive_whole_number(value: Any) -> None:
    with pytest.raises(DefinitionError, match=r"Meta\.max_concurrency must be a positive whole"):

        class Refused(Reactor):
            a = acts()

            class Meta:
                max_concurrency = value


def test_two_steps_under_one_name_are_refused() -> None:
    with pytest.raises(DefinitionError, match="step 'fetch' is declared twice"):

        class Collides(Reactor):
            @step()
            def fetch() -> str:
                return "first"

            @step()
            def fetch() -> str:  # noqa: F811
                return "second"


def test_a_rollback_function_may_take_its_steps_name() -> None:
    class Reuses(Reactor):
        @step()
        def reserve() -> str:
            return "r"

        @reserve.undo
        def reserve(result: Any) -> None:
            ledger("undo", "reserve")

    assert list(Reuses.definition.by_name) == ["reserve"]
