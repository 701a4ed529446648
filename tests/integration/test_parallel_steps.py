"""Steps side by side on PostgreSQL, inline: each lane has its own connection, closed after the
run; atomic steps keep their transactions apart; the rollback rule holds on the stored trace.

Concurrency is shown with barriers (a barrier of four passes only when four steps run at
once); the runs commit for real (``transactional_db``), since each lane reads and writes on a
connection of its own.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from django_reactor import Lock, Reactor, Step, arg, interrupt, services, step
from django_reactor.models import StepRecord
from django_reactor.states import ExecutionStatus, RollbackStatus
from testproject.example.models import Account, LedgerEntry
from testproject.example.reactors import move
from tests.workers.harness import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WAIT = 20
meeting = {"barrier": threading.Barrier(1)}


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


class Meets(Step):
    """Notes its connection's backend, then waits for the others at the barrier."""

    def run(self) -> Any:
        pid = backend_pid()
        meeting["barrier"].wait(timeout=WAIT)
        return pid


def pairs(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace if e.step]


def test_each_lane_has_its_own_connection_and_closes_it_after_the_run() -> None:
    class Four(Reactor):
        a = step(Meets)
        b = step(Meets)
        c = step(Meets)
        d = step(Meets)

        class Meta:
            max_concurrency = 4

    meeting["barrier"] = threading.Barrier(4)
    mine = backend_pid()
    outcome = Four.run({})
    assert outcome.ok, outcome
    pids = set(outcome.value.values())
    assert len(pids) == 4  # four connections at once: the barrier of four passed
    assert mine not in pids
    trace = [(e.kind, e.data) for e in services.find(outcome.execution_id).trace]
    assert ("launch", {"steps": ["a", "b", "c", "d"]}) in trace

    def gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)]
            )
            return cursor.fetchone()[0] == 0

    wait_until(gone, timeout=WAIT, what="the lanes' connections to close")


class Moves(Step):
    atomic = True

    def run(self, account: str, amount: str) -> Any:
        moved = move(account, Decimal(amount), step=self.context.step)
        meeting["barrier"].wait(timeout=WAIT)
        if account == "closed":
            raise RuntimeError("the account is closed")
        return moved

    def undo(self, result: Any, account: str, amount: str) -> None:
        move(account, -Decimal(amount), step=f"undo:{self.context.step}")


def test_atomic_steps_side_by_side_keep_their_transactions_apart() -> None:
    for name in ("alice", "bob", "closed"):
        Account.objects.create(name=name, balance=100)

    class Payouts(Reactor):
        to_alice = step(Moves, account=arg.value("alice"), amount=arg.value("10"))
        to_bob = step(Moves, account=arg.value("bob"), amount=arg.value("20"))
        to_closed = step(Moves, account=arg.value("closed"), amount=arg.value("30"))

        class Meta:
            max_concurrency = 3

    meeting["barrier"] = threading.Barrier(3)
    outcome = Payouts.run({})
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.step == "to_closed"
    # The failed step's writes rolled back with its transaction; the others were undone.
    balances = dict(Account.objects.values_list("name", "balance"))
    assert balances == {"alice": Decimal(100), "bob": Decimal(100), "closed": Decimal(100)}
    entries = sorted(LedgerEntry.objects.values_list("step", "amount"))
    assert entries == sorted(
        [
            ("to_alice", Decimal(10)),
            ("to_bob", Decimal(20)),
            ("undo:to_alice", Decimal(-10)),
            ("undo:to_bob", Decimal(-20)),
        ]
    )
    steps = pairs(outcome.execution_id)
    completed = [name for kind, name in steps if kind == "run"]
    undone = [name for kind, name in steps if kind == "undo"]
    assert undone == completed[::-1]  # newest first, by completion
    assert steps.index(("fail", "to_closed")) < steps.index(("undo", undone[0]))
    for name in completed:
        record = StepRecord.objects.get(execution_id=outcome.execution_id, step=name)
        assert record.rollback == RollbackStatus.UNDONE


def test_the_steps_overlapping_show_in_their_records() -> None:
    class Two(Reactor):
        a = step(Meets)
        b = step(Meets)

        class Meta:
            max_concurrency = 2

    meeting["barrier"] = threading.Barrier(2)
    outcome = Two.run({})
    assert outcome.ok
    a, b = (StepRecord.objects.get(execution_id=outcome.execution_id, step=name) for name in "ab")
    assert a.started_at < b.finished_at
    assert b.started_at < a.finished_at


def test_an_interrupt_among_steps_side_by_side_pauses_once_they_settle() -> None:
    class Approves(Reactor):
        a = step(Meets)
        b = step(Meets)
        approval = interrupt(after=["a"])

        @step(decision=arg.result("approval"), x=arg.result("b"))
        def settle(decision: dict[str, Any], x: int) -> str:
            return "approved" if decision["approved"] else "declined"

        class Meta:
            max_concurrency = 2
            returns = "settle"

    meeting["barrier"] = threading.Barrier(2)
    paused = Approves.run({})
    assert paused.status == ExecutionStatus.PAUSED
    assert pairs(paused.execution_id)[:2] in (
        [("run", "a"), ("run", "b")],
        [("run", "b"), ("run", "a")],
    )
    assert ("interrupt", "approval") in pairs(paused.execution_id)
    finished = services.find(paused.execution_id).resume("approval", {"approved": True})
    assert finished.ok
    assert finished.value == "approved"


def test_a_step_under_its_own_coordination_runs_alone(backend: Any) -> None:
    class Guarded(Reactor):
        a = step(Meets)
        b = step(Meets)

        @step(coordination=[Lock("guard", ttl=30)])
        def guarded() -> str:
            return "guarded"

        class Meta:
            max_concurrency = 3

    meeting["barrier"] = threading.Barrier(2)
    outcome = Guarded.run({})
    assert outcome.ok, outcome
    launched = [e.data for e in services.find(outcome.execution_id).trace if e.kind == "launch"]
    assert launched == [{"steps": ["a", "b"]}]  # guarded was ready too, but runs alone
    records = {r.step: r for r in StepRecord.objects.filter(execution_id=outcome.execution_id)}
    assert records["guarded"].started_at >= max(records["a"].finished_at, records["b"].finished_at)
