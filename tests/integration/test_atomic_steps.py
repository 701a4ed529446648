"""Atomic steps on PostgreSQL: a step's writes commit with its checkpoint, or not at all.

Most tests run with real commits (``transactional_db``): what they check is what another
connection sees after the run, not savepoints inside a test's own transaction.
"""

from __future__ import annotations

import contextlib
import threading
import time
from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.models import F
from django.test import override_settings

from django_reactor import Failure, Reactor, Retry, Step, Success, services, step
from django_reactor.coordination import get_backend
from django_reactor.models import Execution, StepRecord
from django_reactor.states import ExecutionStatus, RollbackStatus, StepStatus
from testproject.example.models import Account, LedgerEntry
from testproject.example.reactors import TransferFunds

# A database server's transactions (PostgreSQL, and MariaDB in its pass), not SQLite's.
pytestmark = [pytest.mark.postgres, pytest.mark.mariadb]


def pairs(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace if e.step]


def accounts(**balances: int) -> None:
    for name, balance in balances.items():
        Account.objects.create(name=name, balance=Decimal(balance))


def balance(name: str) -> Decimal:
    return Account.objects.get(name=name).balance


def entries(**filters: Any) -> list[tuple[str, Decimal]]:
    return [(e.step, e.amount) for e in LedgerEntry.objects.filter(**filters).order_by("id")]


def write_entry(step_name: str, amount: int = 1) -> None:
    LedgerEntry.objects.create(
        account=Account.objects.get(name="a"), amount=Decimal(amount), step=step_name
    )


@pytest.mark.django_db(transaction=True)
def test_a_transfer_moves_the_money_once_and_records_it_with_each_step() -> None:
    accounts(alice=100, bob=0)
    outcome = TransferFunds.run({"source": "alice", "target": "bob", "amount": "30.00"})
    assert outcome.ok, outcome
    assert (balance("alice"), balance("bob")) == (Decimal(70), Decimal(30))
    assert entries() == [("debit", Decimal(-30)), ("credit", Decimal(30))]
    assert pairs(outcome.execution_id) == [("run", "debit"), ("run", "credit")]


@pytest.mark.django_db(transaction=True)
def test_a_failed_credit_undoes_the_debit_in_a_transaction_of_its_own() -> None:
    accounts(alice=100)
    outcome = TransferFunds.run({"source": "alice", "target": "nobody", "amount": "30.00"})
    assert not outcome.ok
    assert outcome.error.message == "no account 'nobody'"
    assert balance("alice") == Decimal(100)
    assert entries() == [("debit", Decimal(-30)), ("undo:debit", Decimal(30))]
    assert pairs(outcome.execution_id) == [("run", "debit"), ("fail", "credit"), ("undo", "debit")]
    debit = StepRecord.objects.get(execution_id=outcome.execution_id, step="debit")
    assert debit.rollback == RollbackStatus.UNDONE


@pytest.mark.django_db(transaction=True)
def test_writes_of_a_failed_attempt_are_rolled_back_before_the_retry() -> None:
    accounts(a=0)

    class Flaky(Step):
        atomic = True
        retry = Retry(attempts=3, delay=0)

        def run(self) -> Any:
            write_entry(f"attempt {self.context.attempt}")
            if self.context.attempt < 3:
                raise RuntimeError("the partner refused")
            return "written"

    class Writes(Reactor):
        write = step(Flaky)

    outcome = Writes.run({})
    assert outcome.ok
    assert entries() == [("attempt 3", Decimal(1))]
    assert [(e.kind, e.attempt) for e in services.find(outcome.execution_id).trace if e.step] == [
        ("retry", 1),
        ("retry", 2),
        ("run", 3),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_process_whose_run_was_taken_over_commits_none_of_its_writes() -> None:
    accounts(a=0)

    class TakenOver(Step):
        atomic = True

        def run(self) -> Any:
            write_entry("zombie")
            execution_id = self.context.execution_id

            def take_over() -> None:  # another worker claims the run: its fence moves on
                try:
                    Execution.objects.filter(pk=execution_id).update(fence=F("fence") + 1)
                finally:
                    connections.close_all()

            other = threading.Thread(target=take_over)
            other.start()
            other.join(timeout=30)
            assert not other.is_alive()
            return "written"

    class Zombie(Reactor):
        write = step(TakenOver)

    outcome = Zombie.run({})  # the checkpoint raised LeaseLost: this process stopped
    assert outcome.status == ExecutionStatus.RUNNING  # the new owner carries it on
    assert entries() == []
    assert not StepRecord.objects.filter(execution_id=outcome.execution_id).exists()
    assert not connection.in_atomic_block


@pytest.mark.django_db(transaction=True, databases=["default", "elsewhere"])
def test_a_query_on_another_database_is_refused_and_nothing_is_written() -> None:
    accounts(a=0)

    class Elsewhere(Step):
        atomic = True
        retry = Retry(attempts=3, delay=0)

        def run(self) -> Any:
            write_entry("here")
            return Account.objects.using("elsewhere").count()

    class TwoDatabases(Reactor):
        both = step(Elsewhere)

    outcome = TwoDatabases.run({})
    assert not outcome.ok
    assert outcome.error.exception_class == "django_reactor.exceptions.AtomicStepError"
    assert "cannot query the database 'elsewhere'" in outcome.error.message
    assert outcome.error.attempts == 1  # refused, not retried
    assert entries() == []
    # Outside an atomic step the other database works as ever.
    assert Account.objects.using("elsewhere").count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_coordination_hold_taken_inside_is_refused() -> None:
    accounts(a=0)

    class Locks(Step):
        atomic = True

        def run(self) -> Any:
            write_entry("before the lock")
            get_backend().acquire_lock("ledger", owner="me", ttl=5)
            return "locked"

    class Locking(Reactor):
        lock = step(Locks)

    outcome = Locking.run({})
    assert not outcome.ok
    assert outcome.error.exception_class == "django_reactor.exceptions.AtomicStepError"
    assert "cannot take a lock, a semaphore slot" in outcome.error.message
    assert "Declare it with coordination=[...]" in outcome.error.message
    assert entries() == []


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="only PostgreSQL bounds each statement (statement_timeout); MariaDB: the body's end",
)
@pytest.mark.django_db(transaction=True)
def test_a_statement_that_outlasts_the_bound_is_cancelled_and_rolled_back() -> None:
    accounts(a=0)

    class Slow(Step):
        atomic = True

        def run(self) -> Any:
            write_entry("before the slow query")
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(5)")
            return "done"

    class SlowQuery(Reactor):
        slow = step(Slow)

    with override_settings(REACTOR={"ATOMIC_STEP_TIMEOUT": 0.3}):
        started = time.monotonic()
        outcome = SlowQuery.run({})
        took = time.monotonic() - started
    assert not outcome.ok
    assert outcome.error.exception_class == "django_reactor.exceptions.AtomicStepTimeout"
    assert "longer than REACTOR['ATOMIC_STEP_TIMEOUT'] (0.3 s)" in outcome.error.message
    assert took < 4.5  # cancelled by the server, not waited out
    assert entries() == []


@pytest.mark.django_db(transaction=True)
def test_a_body_that_returns_past_the_bound_is_rolled_back() -> None:
    accounts(a=0)

    class Dawdles(Step):
        atomic = True

        def run(self) -> Any:
            write_entry("kept locked too long")
            time.sleep(0.4)  # the step's own slow work (a call it should not make here)
            return "done"

    class Dawdling(Reactor):
        slow = step(Dawdles)

    with override_settings(REACTOR={"ATOMIC_STEP_TIMEOUT": 0.2}):
        outcome = Dawdling.run({})
    assert outcome.error.exception_class == "django_reactor.exceptions.AtomicStepTimeout"
    assert entries() == []


@pytest.mark.django_db(transaction=True)
def test_a_deferred_foreign_key_violation_fails_the_attempt_not_the_commit() -> None:
    class Dangling(Step):
        atomic = True

        def run(self) -> Any:
            # Django's foreign keys are checked at commit on PostgreSQL (deferred).
            LedgerEntry.objects.create(account_id=987654, amount=Decimal(1), step="dangling")
            return "written"

    class Dangles(Reactor):
        bad = step(Dangling)

    outcome = Dangles.run({})
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.step == "bad"
    assert outcome.error.exception_class == "django.db.utils.IntegrityError"
    assert LedgerEntry.objects.count() == 0
    record = StepRecord.objects.get(execution_id=outcome.execution_id, step="bad")
    assert record.status == StepStatus.FAILED


@pytest.mark.django_db(transaction=True)
def test_a_database_error_the_body_swallowed_fails_the_attempt() -> None:
    accounts(a=0)

    class Swallows(Step):
        atomic = True

        def run(self) -> Any:
            write_entry("before the error")
            with contextlib.suppress(IntegrityError):
                Account.objects.create(name="a")  # unique: the transaction is now aborted
            return "looks fine"

    class Swallowing(Reactor):
        swallow = step(Swallows)

    outcome = Swallowing.run({})
    assert not outcome.ok
    assert outcome.error.exception_class == "django_reactor.exceptions.AtomicStepError"
    assert "went on after a database error it caught" in outcome.error.message
    assert entries() == []
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.FAILED


@pytest.mark.django_db(transaction=True)
def test_an_undo_that_fails_leaves_none_of_its_writes_and_runs_once_when_undone_again() -> None:
    accounts(a=0)
    broken = {"undo": True}

    class Reverses(Step):
        atomic = True

        def run(self) -> Any:
            write_entry("run")
            return Success("written")

        def undo(self, result: Any) -> Any:
            write_entry("undo")
            if broken["undo"]:
                return Failure("the ledger is closed for the day")
            return None

    class Later(Step):
        def run(self) -> Any:
            raise RuntimeError("a later step failed")

    class Reversing(Reactor):
        write = step(Reverses)
        later = step(Later, wait_for=["write"])

    outcome = Reversing.run({})
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    assert entries() == [("run", Decimal(1))]
    record = StepRecord.objects.get(execution_id=outcome.execution_id, step="write")
    assert record.rollback == RollbackStatus.FAILED
    broken["undo"] = False
    services.find(outcome.execution_id).undo()
    assert entries() == [("run", Decimal(1)), ("undo", Decimal(1))]
    record.refresh_from_db()
    assert record.rollback == RollbackStatus.UNDONE


@pytest.mark.django_db(transaction=True)
def test_a_plain_step_is_not_held_to_the_bound_and_runs_in_autocommit() -> None:
    seen: list[bool] = []

    class Plain(Step):
        def run(self) -> Any:
            seen.append(connection.in_atomic_block)
            return "plain"

    class Atomic(Step):
        atomic = True

        def run(self) -> Any:
            seen.append(connection.in_atomic_block)
            return "atomic"

    class Mixed(Reactor):
        plain = step(Plain)
        atomic = step(Atomic, wait_for=["plain"])

    assert Mixed.run({}).ok
    assert seen == [False, True]
    assert not connection.in_atomic_block


@pytest.mark.django_db(transaction=True)
def test_on_commit_callbacks_of_the_body_run_once_its_step_is_recorded() -> None:
    accounts(a=0)
    seen: list[tuple[str, bool]] = []

    class Notifies(Step):
        atomic = True
        retry = Retry(attempts=2, delay=0)

        def run(self) -> Any:
            write_entry(f"attempt {self.context.attempt}")
            execution_id, attempt = self.context.execution_id, self.context.attempt

            def after_commit() -> None:
                recorded = StepRecord.objects.filter(
                    execution_id=execution_id, step="notify", status=StepStatus.COMPLETED
                ).exists()
                seen.append((f"attempt {attempt}", recorded))

            transaction.on_commit(after_commit)
            if attempt == 1:
                raise RuntimeError("first attempt fails")
            return "sent"

    class Notifying(Reactor):
        notify = step(Notifies)

    assert Notifying.run({}).ok
    # The failed attempt's callback never ran; the second ran after its record committed.
    assert seen == [("attempt 2", True)]
    assert entries() == [("attempt 2", Decimal(1))]
