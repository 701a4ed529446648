"""Atomic steps in the pure executor: which record each action's transaction commits with,
when it rolls back, and what the definition refuses."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import (
    Failure,
    Halt,
    Reactor,
    Retry,
    Step,
    Success,
    arg,
    async_step,
    compose,
    map_over,
    step,
)
from django_reactor.engine.journal import JournalBatch, MemoryJournal
from django_reactor.engine.outcomes import ErrorKind
from django_reactor.engine.step import refuse_in_atomic_step
from django_reactor.exceptions import AtomicStepError, DefinitionError
from django_reactor.states import EventKind, ExecutionStatus, StepStatus
from tests.helpers import FAIL_AT, ledger, run_in_memory, trace


class WatchingJournal(MemoryJournal):
    """Notes, for every transaction that commits, the batch it committed with."""

    def __init__(self) -> None:
        super().__init__()
        self.last: JournalBatch | None = None
        self.joined: list[tuple[str, str, str | None]] = []
        self.open: list[str] = []

    def begin(self, step: str, action: str) -> Any:
        transaction = super().begin(step, action)
        journal = self
        journal.open.append(step)

        class Watched(type(transaction)):  # type: ignore[misc]
            def commit(self) -> None:
                super().commit()
                batch = journal.last
                assert batch is not None
                written = batch.step or batch.rollback
                journal.joined.append((step, action, written.status if written else None))
                journal.open.remove(step)

            def rollback(self) -> None:
                super().rollback()
                journal.open.remove(step)

        transaction.__class__ = Watched
        return transaction

    def commit(self, batch: JournalBatch) -> str | None:
        self.last = batch
        return super().commit(batch)


class Moves(Step):
    """Writes to the ledger (its "database writes"); fails where FAIL_AT says."""

    atomic = True

    def run(self, **arguments: Any) -> Any:
        ledger("run", self.context.step)
        if self.context.step in FAIL_AT:
            raise RuntimeError(f"{self.context.step} failed")
        return Success(self.context.step)

    def undo(self, result: Any, **arguments: Any) -> None:
        ledger("undo", self.context.step)


class Plain(Step):
    def run(self, **arguments: Any) -> Any:
        ledger("run", self.context.step)
        if self.context.step in FAIL_AT:
            raise RuntimeError(f"{self.context.step} failed")
        return Success(self.context.step)


def test_the_body_and_its_done_record_commit_in_one_transaction() -> None:
    class Transfer(Reactor):
        debit = step(Moves)
        credit = step(Moves, wait_for=["debit"])
        notify = step(Plain, wait_for=["credit"])

    journal = WatchingJournal()
    outcome, _ = run_in_memory(Transfer, journal=journal)
    assert outcome.ok
    # The last atomic step's record is not the run's last write, the plain step's is.
    assert journal.joined == [
        ("debit", "run", StepStatus.COMPLETED),
        ("credit", "run", StepStatus.COMPLETED),
    ]
    assert journal.open == []
    assert trace(journal) == [("run", "debit"), ("run", "credit"), ("run", "notify")]


def test_the_last_step_commits_with_the_runs_completion() -> None:
    class One(Reactor):
        only = step(Moves)

    journal = WatchingJournal()
    outcome, _ = run_in_memory(One, journal=journal)
    assert outcome.ok
    assert journal.joined == [("only", "run", StepStatus.COMPLETED)]
    assert journal.last is not None
    assert journal.last.status == ExecutionStatus.COMPLETED


def test_each_attempt_has_its_own_transaction_and_backs_off_outside_it() -> None:
    attempts: list[int] = []

    class Flaky(Step):
        atomic = True
        retry = Retry(attempts=3, delay=5)

        def run(self) -> Any:
            attempts.append(self.context.attempt)
            if self.context.attempt < 3:
                raise RuntimeError("deadlock detected")
            return "moved"

    class Retries(Reactor):
        move = step(Flaky)

    journal = WatchingJournal()
    open_while_sleeping: list[list[str]] = []

    from django_reactor.engine.executor import Executor, RunState

    executor = Executor(
        Retries.definition,
        journal,
        inputs={},
        state=RunState(),
        sleep=lambda seconds: open_while_sleeping.append(list(journal.open)),
    )
    outcome = executor.run()
    assert outcome.ok
    assert attempts == [1, 2, 3]
    assert journal.transactions == [
        ("move", "run", "rollback"),
        ("move", "run", "rollback"),
        ("move", "run", "commit"),
    ]
    assert open_while_sleeping == [[], []]  # no transaction is open during a backoff
    assert [(e.kind, e.attempt) for e in journal.events if e.step == "move"] == [
        (EventKind.RETRY, 1),
        (EventKind.RETRY, 2),
        (EventKind.RUN, 3),
    ]


def test_a_failed_body_rolls_back_and_a_later_failure_undoes_in_a_transaction() -> None:
    FAIL_AT.add("credit")

    class Transfer(Reactor):
        debit = step(Moves)
        credit = step(Moves, wait_for=["debit"])

    journal = WatchingJournal()
    outcome, _ = run_in_memory(Transfer, journal=journal)
    assert not outcome.ok
    assert outcome.error.step == "credit"
    # The failed step is not compensated: its writes were rolled back with its attempt.
    assert journal.joined == [
        ("debit", "run", StepStatus.COMPLETED),
        ("debit", "undo", "undone"),
    ]
    assert journal.transactions == [
        ("debit", "run", "commit"),
        ("credit", "run", "rollback"),
        ("debit", "undo", "commit"),
    ]
    assert trace(journal) == [("run", "debit"), ("fail", "credit"), ("undo", "debit")]
    assert not journal.steps["credit"].compensable


def test_a_failure_returned_rolls_back_and_halt_commits() -> None:
    class Returns(Step):
        atomic = True

        def run(self, what: str) -> Any:
            return Failure("no", retryable=False) if what == "fail" else Halt("enough")

    class Halts(Reactor):
        stop = step(Returns, what=arg.value("halt"))

    journal = WatchingJournal()
    outcome, _ = run_in_memory(Halts, journal=journal)
    assert outcome.status == ExecutionStatus.HALTED
    assert journal.joined == [("stop", "run", StepStatus.HALTED)]

    class Fails(Reactor):
        stop = step(Returns, what=arg.value("fail"))

    journal = WatchingJournal()
    outcome, _ = run_in_memory(Fails, journal=journal)
    assert outcome.status == ExecutionStatus.FAILED
    assert journal.transactions == [("stop", "run", "rollback")]


def test_a_value_that_cannot_be_stored_rolls_the_writes_back() -> None:
    class Unstorable(Step):
        atomic = True

        def run(self) -> Any:
            return object()

    class Bad(Reactor):
        odd = step(Unstorable)

    journal = WatchingJournal()
    outcome, _ = run_in_memory(Bad, journal=journal)
    assert outcome.error.kind == ErrorKind.RESULT
    assert journal.transactions == [("odd", "run", "rollback")]
    assert journal.joined == []


def test_what_the_transaction_cannot_contain_is_refused_and_not_retried() -> None:
    class TakesALock(Step):
        atomic = True
        retry = Retry(attempts=3)

        def run(self) -> Any:
            ledger("run", self.context.step)
            refuse_in_atomic_step("take a lock", "it outlives the rollback")
            return "unreachable"

    class Locks(Reactor):
        locked = step(TakesALock)

    journal = WatchingJournal()
    outcome, _ = run_in_memory(Locks, journal=journal)
    assert not outcome.ok
    assert ledger.calls == [("run", "locked")]  # not retried: it would do the same again
    assert outcome.error.exception_class.endswith("AtomicStepError")
    assert "step 'locked' is atomic" in outcome.error.message
    assert "cannot take a lock: it outlives the rollback" in outcome.error.message
    assert journal.transactions == [("locked", "run", "rollback")]


def test_refusal_is_only_inside_an_atomic_step() -> None:
    refuse_in_atomic_step("take a lock", "why")  # outside any step: nothing to refuse

    class NotAtomic(Step):
        def run(self) -> Any:
            refuse_in_atomic_step("take a lock", "why")
            return "fine"

    class Plainly(Reactor):
        fine = step(NotAtomic)

    outcome, journal = run_in_memory(Plainly)
    assert outcome.ok
    assert journal.transactions == []


def test_a_plain_step_opens_no_transaction() -> None:
    class Plainly(Reactor):
        a = step(Plain)

    outcome, journal = run_in_memory(Plainly)
    assert outcome.ok
    assert journal.transactions == []


def test_the_declaration_overrides_the_class_and_function_steps_take_it() -> None:
    @step(atomic=True)
    def write() -> str:
        return "w"

    class Both(Reactor):
        on = step(Plain, atomic=True)
        off = step(Moves, atomic=False)
        fn = write

    by_name = Both.definition.by_name
    assert [by_name[name].atomic for name in ("on", "off", "fn")] == [True, False, True]


class Child(Reactor):
    a = step(Plain)


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda: step(Plain, atomic="yes"), "atomic= must be True or False"),
        (lambda: async_step(Plain, atomic=True), "an async unit cannot be atomic"),
        (lambda: async_step(Moves), "an async unit cannot be atomic"),
        (lambda: compose(Child, atomic=True), "compose(Child) cannot be atomic"),
        (
            lambda: map_over(arg.value([1, 2]), Moves, item=arg.element()),
            "is atomic, and elements are recorded together",
        ),
    ],
)
def test_what_cannot_be_atomic_is_refused_at_definition(declare: Any, message: str) -> None:
    with pytest.raises(DefinitionError, match=message.replace("(", r"\(").replace(")", r"\)")):

        class Refused(Reactor):
            s = declare()


def test_an_atomic_step_with_a_compensate_is_refused() -> None:
    class Compensates(Moves):
        def compensate(self, error: Any) -> None:
            return None

    with pytest.raises(DefinitionError, match="an atomic step has nothing to compensate"):

        class Refused(Reactor):
            s = step(Compensates)


def test_an_atomic_class_attribute_must_be_a_flag() -> None:
    class Odd(Step):
        atomic = 1  # type: ignore[assignment]

        def run(self) -> None:
            return None

    with pytest.raises(DefinitionError, match=r"Odd\.atomic must be True or False"):

        class Refused(Reactor):
            s = step(Odd)


def test_the_error_type_says_it_is_not_retryable() -> None:
    assert AtomicStepError.retryable is False
