"""Patches in the engine (``self.context.patched(name)``): the decision rule, recorded once per
run and name before the call returns, and the same answer everywhere after; checked with the
in-memory journal, crashes simulated by a probe that stops the process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from django_reactor import Failure, Reactor, Retry, Step, arg, map_over, step, step_context
from django_reactor.engine import probes
from django_reactor.engine.elements import run_element
from django_reactor.engine.executor import Executor
from django_reactor.engine.journal import MemoryJournal, RunRecords
from django_reactor.engine.outcomes import Completed, ErrorKind, Failed
from django_reactor.engine.patches import Patches
from django_reactor.engine.state import RunState
from django_reactor.exceptions import PatchError, PatchRemoved
from django_reactor.states import ExecutionStatus
from tests.helpers import run_in_memory

#: What the step bodies did, in order: (step, branch) pairs.
LEDGER: list[tuple[str, str]] = []
#: Which code is deployed: "old" (no patch), "new" (patched), "deprecated" (old branch gone).
CODE = {"version": "new"}


class Crash(BaseException):
    """The process stops (a probe raises it; nothing in the engine catches it)."""


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    LEDGER.clear()
    CODE["version"] = "new"
    yield
    probes.active = None


class Reserve(Step):
    def run(self) -> str:
        LEDGER.append(("reserve", "-"))
        return "reserved"


class Charge(Step):
    """The step whose body a deploy changes: the new code charges with tax, behind a patch."""

    def run(self) -> str:
        version = CODE["version"]
        if version == "old":
            branch = "old"
        elif version == "deprecated":
            self.context.deprecated_patch("tax-v2")
            branch = "new"
        else:
            branch = "new" if self.context.patched("tax-v2") else "old"
        LEDGER.append(("charge", branch))
        return branch

    def undo(self, result: str) -> None:
        branch = "new" if self.context.patched("tax-v2") else "old"
        LEDGER.append(("refund", branch))


class Receipt(Step):
    def run(self) -> str:
        branch = "new" if self.context.patched("tax-v2") else "old"
        LEDGER.append(("receipt", branch))
        return branch


class Order(Reactor):
    reserve = step(Reserve)
    charge = step(Charge, wait_for=["reserve"])
    receipt = step(Receipt, wait_for=["charge"])


def crash_after_body(step_name: str) -> None:
    """Stop the process once ``step_name``'s body returned, before its checkpoint."""

    def probe(point: str, name: str) -> None:
        if point == "before_step_commit" and name == step_name:
            raise Crash

    probes.active = probe


def resume(journal: MemoryJournal) -> Executor:
    """Another process takes the run over: its state restored from the journal's records."""
    state = RunState.restore(Order.definition, journal.read())
    return Executor(Order.definition, journal, inputs={}, state=state)


def test_a_new_run_takes_the_new_branch_and_every_step_agrees() -> None:
    outcome, journal = run_in_memory(Order)

    assert isinstance(outcome, Completed)
    assert LEDGER == [("reserve", "-"), ("charge", "new"), ("receipt", "new")]
    assert journal.patches == {"tax-v2": (True, "charge")}


def test_a_run_whose_step_was_in_flight_under_old_code_stays_on_the_old_branch() -> None:
    CODE["version"] = "old"
    crash_after_body("charge")
    journal = MemoryJournal()
    with pytest.raises(Crash):
        Executor(Order.definition, journal, inputs={}).run()
    assert LEDGER == [("reserve", "-"), ("charge", "old")]

    CODE["version"] = "new"  # deployed; the run is taken over and crashes again, twice
    for _ in range(2):
        with pytest.raises(Crash):
            resume(journal).run()
    probes.active = None
    outcome = resume(journal).run()

    assert isinstance(outcome, Completed)
    assert LEDGER[2:] == [("charge", "old")] * 3 + [("receipt", "old")]
    assert journal.patches == {"tax-v2": (False, "charge")}


def test_a_run_that_asked_before_its_crash_keeps_its_answer() -> None:
    crash_after_body("charge")
    journal = MemoryJournal()
    with pytest.raises(Crash):
        Executor(Order.definition, journal, inputs={}).run()
    # Recorded at once: before the step's checkpoint, which never came.
    assert journal.patches == {"tax-v2": (True, "charge")}
    assert "charge" not in journal.steps

    for _ in range(2):
        with pytest.raises(Crash):
            resume(journal).run()
    probes.active = None
    assert isinstance(resume(journal).run(), Completed)
    assert LEDGER[1:] == [("charge", "new")] * 4 + [("receipt", "new")]


def test_a_step_reached_after_the_takeover_decides_anew() -> None:
    """Only the steps in flight when the process stopped count as started before."""
    CODE["version"] = "old"
    crash_after_body("reserve")
    journal = MemoryJournal()
    journal.current_step = "reserve"  # as a new run's row names its first step
    with pytest.raises(Crash):
        Executor(Order.definition, journal, inputs={}).run()
    CODE["version"] = "new"
    probes.active = None

    assert isinstance(resume(journal).run(), Completed)
    assert LEDGER == [("reserve", "-"), ("reserve", "-"), ("charge", "new"), ("receipt", "new")]


def test_a_retry_waiting_after_failed_attempts_elsewhere_stays_on_the_old_branch() -> None:
    records = RunRecords(status=ExecutionStatus.RUNNING, current_step="charge", current_attempt=2)
    state = RunState.restore(Order.definition, records)
    assert state.attempted_before == {"charge"}
    state = RunState.restore(Order.definition, RunRecords(status=ExecutionStatus.PENDING))
    assert state.attempted_before == set()


def test_attempts_of_this_process_do_not_count_as_started_before() -> None:
    """An inline retry runs the same code: had the first attempt reached the call, it would
    have recorded the decision."""
    failures = {"left": 1}

    class Flaky(Step):
        retry = None

        def run(self) -> str:
            if failures["left"]:
                failures["left"] -= 1
                raise ConnectionError("the gateway hung up")
            return "new" if self.context.patched("tax-v2") else "old"

    class Retried(Reactor):
        pay = step(Flaky, retry=Retry(attempts=2, delay=0))

    outcome, journal = run_in_memory(Retried)
    assert isinstance(outcome, Completed)
    assert outcome.value == {"pay": "new"}
    assert journal.patches == {"tax-v2": (True, "pay")}


def test_undo_uses_the_runs_decision() -> None:
    class Failing(Step):
        def run(self) -> Any:
            return Failure("card declined")

    class Declined(Reactor):
        reserve = step(Reserve)
        charge = step(Charge, wait_for=["reserve"])
        after = step(Failing, wait_for=["charge"])

    journal = MemoryJournal()
    journal.patches["tax-v2"] = (False, "charge")  # decided by an earlier process
    outcome, journal = run_in_memory(Declined, journal=journal)

    assert isinstance(outcome, Failed)
    assert LEDGER == [("reserve", "-"), ("charge", "old"), ("refund", "old")]


def test_undo_without_a_decision_takes_the_old_branch_and_records_nothing() -> None:
    class Refund(Step):
        def run(self) -> str:
            return "charged"

        def undo(self, result: str) -> None:
            LEDGER.append(("refund", "new" if self.context.patched("tax-v2") else "old"))

    class Failing(Step):
        def run(self) -> Any:
            return Failure("declined")

    class Undone(Reactor):
        charge = step(Refund)
        after = step(Failing, wait_for=["charge"])

    outcome, journal = run_in_memory(Undone)
    assert isinstance(outcome, Failed)
    assert LEDGER == [("refund", "old")]
    assert journal.patches == {}


def test_deprecated_patch_records_the_new_branch_for_a_run_without_a_decision() -> None:
    CODE["version"] = "deprecated"
    outcome, journal = run_in_memory(Order)

    assert isinstance(outcome, Completed)
    assert journal.patches == {"tax-v2": (True, "charge")}
    assert LEDGER == [("reserve", "-"), ("charge", "new"), ("receipt", "new")]


def test_deprecated_patch_in_a_run_on_the_old_branch_escapes_without_failing_the_step() -> None:
    CODE["version"] = "deprecated"
    journal = MemoryJournal()
    journal.patches["tax-v2"] = (False, "charge")

    with pytest.raises(PatchRemoved) as raised:
        run_in_memory(Order, journal=journal)

    assert raised.value.patch == "tax-v2"
    assert raised.value.step == "charge"
    assert "Deploy code that still has patched('tax-v2')" in str(raised.value)
    # Not the step's failure: no fail entry, no rollback, the reserve not undone.
    assert [kind for kind, _ in journal.trace()] == ["run"]
    assert ExecutionStatus.ROLLING_BACK not in journal.statuses
    assert LEDGER == [("reserve", "-")]


@pytest.mark.parametrize("name", ["", "-lead", "has space", "x" * 101, 7, "tax/v2"])
def test_a_bad_patch_name_fails_the_attempt_saying_what_a_name_is(name: object) -> None:
    class Bad(Step):
        def run(self) -> bool:
            return step_context().patched(name)  # type: ignore[arg-type]

    class Named(Reactor):
        only = step(Bad)

    outcome, journal = run_in_memory(Named)
    assert isinstance(outcome, Failed)
    assert outcome.error.exception_class == "django_reactor.exceptions.PatchError"
    assert "takes a patch name of at most 100 letters" in outcome.error.message
    assert journal.patches == {}


def test_a_function_step_asks_through_step_context() -> None:
    @step()
    def pay() -> str:
        return "new" if step_context().patched("tax-v2") else "old"

    class Functions(Reactor):
        only = pay

    outcome, _journal = run_in_memory(Functions)
    assert isinstance(outcome, Completed)
    assert outcome.value == {"only": "new"}


def element_asking(item: int) -> bool:
    return step_context().patched("tax-v2")


def test_a_maps_element_cannot_decide() -> None:
    class Mapped(Reactor):
        each = map_over(arg.value([1]), element_asking, item=arg.element())

    spec = Mapped.definition.by_name["each"]
    assert spec.map is not None
    done = run_element(spec.map.element_definition, {"item": 1})
    assert done.status == "failed"
    assert done.error is not None
    assert "call patched() in the step that maps" in str(done.error["message"])


def test_threads_deciding_at_once_read_the_run_once_and_agree() -> None:
    class Book:
        def __init__(self) -> None:
            self.reads = 0
            self.kept: dict[str, bool] = {}

        def patch_decisions(self) -> dict[str, bool]:
            self.reads += 1
            return dict(self.kept)

        def decide_patch(self, name: str, taken: bool, step: str) -> bool:
            return self.kept.setdefault(name, taken)

    book = Book()
    patches = Patches(book)
    barrier = threading.Barrier(4, timeout=10)
    answers: list[bool] = []

    def decide(attempted_before: bool) -> None:
        barrier.wait()
        answers.append(patches.decide("tax-v2", "charge", attempted_before=attempted_before))

    threads = [threading.Thread(target=decide, args=(i % 2 == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive()

    assert len(answers) == 4
    assert len(set(answers)) == 1
    assert book.reads == 1


def test_a_run_that_never_asks_reads_no_decisions() -> None:
    class Counting(MemoryJournal):
        reads = 0

        def patch_decisions(self) -> dict[str, bool]:
            Counting.reads += 1
            return super().patch_decisions()

    class Plain(Reactor):
        only = step(Reserve)

    run_in_memory(Plain, journal=Counting())
    assert Counting.reads == 0


def test_the_patch_removed_kind_is_an_error_kind() -> None:
    assert ErrorKind.PATCH_REMOVED == "patch_removed"
    assert issubclass(PatchError, ValueError)
