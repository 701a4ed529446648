"""The connection-loss matrix: a step body (or an undo, or a compensation) whose own database
backend is terminated mid-way, as a failover, a pooler restart or an idle-session timeout
would, is run again on a new connection instead of failing the step.

Every kind of body (plain, atomic, side by side, under a timeout, a map's element, a plain
undo, an atomic undo, a compensation), inline in this process and on a real worker (directly
and behind a transaction-pooling PgBouncer): the run ends as it would without the loss;
checkpointed steps never run again; only the body that lost its connection runs twice;
effects happen once per idempotency key; an atomic body's writes commit exactly once; the
trace has a ``reconnect`` entry and no retry.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from django_reactor import Reactor, services
from django_reactor.models import Execution, StepRecord
from django_reactor.states import EventKind, ExecutionStatus
from testproject.example.models import Account, BodyRun, Effect, LedgerEntry
from tests.workers import cut_reactors
from tests.workers.harness import wait_until
from tests.workers.test_background import finished


@dataclass(frozen=True)
class Case:
    reactor: type[Reactor]
    faults: str
    status: str
    #: How many times each body started (the body that lost its connection: twice).
    bodies: dict[str, int]
    #: The steps whose trace has a reconnect entry.
    reconnected: tuple[str, ...]
    ledger: list[tuple[str, str, Decimal]] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)


ACCOUNTS = {"source": "alice", "target": "bob"}
MOVED = [("alice", "debit", Decimal(-30)), ("bob", "credit", Decimal(30))]
PUT_BACK = [("alice", "debit", Decimal(-30)), ("alice", "undo:debit", Decimal(30))]
ROLLED_BACK = {"first": 1, "debit": 1, "fails": 1, "compensate:fails": 1, "undo:debit": 1,
               "undo:first": 1}  # fmt: skip

CASES = {
    "plain": Case(
        cut_reactors.CutPlain,
        "mid_body@second=db_kill:once",
        ExecutionStatus.COMPLETED,
        {"first": 1, "second": 2, "third": 1},
        ("second",),
    ),
    "atomic": Case(
        cut_reactors.CutAtomic,
        "mid_body@credit=db_kill:once",
        ExecutionStatus.COMPLETED,
        {"first": 1, "debit": 1, "credit": 2},
        ("credit",),
        MOVED[:1] + MOVED[1:],
        ACCOUNTS,
    ),
    "side_by_side": Case(
        cut_reactors.CutSideBySide,
        "mid_body@right=db_kill:once;mid_body@debit=db_kill:once",
        ExecutionStatus.COMPLETED,
        {"left": 1, "right": 2, "debit": 2, "after": 1},
        ("right", "debit"),
        MOVED[:1],
        ACCOUNTS,
    ),
    "timeout": Case(
        cut_reactors.CutUnderTimeout,
        "mid_body@timed=db_kill:once",
        ExecutionStatus.COMPLETED,
        {"timed": 2, "after": 1},
        ("timed",),
    ),
    "map_element": Case(
        cut_reactors.CutMap,
        "mid_body@tick=db_kill:once",
        ExecutionStatus.COMPLETED,
        {"tick": 7, "after": 1},  # six elements, one of them run again
        (),  # an element's trace is its own (kept in memory); the map step did not retry
    ),
    "undo": Case(
        cut_reactors.CutRollback,
        "mid_undo@first=db_kill:once",
        ExecutionStatus.FAILED,
        {**ROLLED_BACK, "undo:first": 2},
        ("first",),
        PUT_BACK,
        ACCOUNTS,
    ),
    "atomic_undo": Case(
        cut_reactors.CutRollback,
        "mid_undo@debit=db_kill:once",
        ExecutionStatus.FAILED,
        {**ROLLED_BACK, "undo:debit": 2},
        ("debit",),
        PUT_BACK,
        ACCOUNTS,
    ),
    "compensate": Case(
        cut_reactors.CutRollback,
        "mid_compensate@fails=db_kill:once",
        ExecutionStatus.FAILED,
        {**ROLLED_BACK, "compensate:fails": 2},
        ("fails",),
        PUT_BACK,
        ACCOUNTS,
    ),
}


def bodies(folder: Path) -> Counter[str]:
    path = folder / "bodies"
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter(line.split(" ", 1)[1] for line in lines)


def ledger() -> list[tuple[str, str, Decimal]]:
    return [
        (e.account.name, e.step, e.amount)
        for e in LedgerEntry.objects.select_related("account").order_by("id")
    ]


def open_accounts() -> None:
    Account.objects.create(name="alice", balance=100)
    Account.objects.create(name="bob", balance=0)


def check(case: Case, row: Execution, folder: Path) -> None:
    assert row.status == case.status, (row.status, row.failure)
    assert row.recovery_attempts == 0
    if case.status == ExecutionStatus.FAILED:
        # The failure is the step's own, never the lost connection.
        assert row.failure["step"] == "fails", row.failure
        assert "failed, as it should" in row.failure["message"]
        assert not row.failure.get("rollback_failures"), row.failure
    assert dict(bodies(folder)) == case.bodies
    # Past the cut, every body ran once (the body that lost its connection never got there).
    after_cut = Counter(BodyRun.objects.values_list("step", flat=True))
    plain = {label for label in case.bodies if label not in {"debit", "credit", "undo:debit"}}
    assert set(after_cut) == plain
    assert all(count == (6 if label == "tick" else 1) for label, count in after_cut.items())
    keys = list(Effect.objects.values_list("key", flat=True))
    assert len(keys) == len(set(keys))
    assert ledger() == case.ledger
    if case.ledger:
        moved = sum(amount for name, _, amount in case.ledger if name == "alice")
        assert Account.objects.get(name="alice").balance == 100 + moved
    events = services.find(row.id).trace
    reconnects = [e for e in events if e.kind == EventKind.RECONNECT]
    assert sorted(e.step for e in reconnects) == sorted(case.reconnected)
    assert not [e for e in events if e.kind == EventKind.RETRY]
    assert all(r.attempts <= 1 for r in StepRecord.objects.filter(execution_id=row.id)), (
        "a run again after a lost connection is not one of the step's attempts"
    )


@pytest.mark.parametrize("name", list(CASES))
def test_inline_a_body_that_loses_its_connection_runs_again(
    name: str, transactional_db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    open_accounts()
    monkeypatch.setenv("REACTOR_FAULTS", case.faults)
    monkeypatch.setenv("REACTOR_FAULTS_STATE", str(tmp_path))
    outcome = case.reactor.run(case.inputs)
    assert outcome.status == case.status, outcome
    check(case, Execution.objects.get(pk=outcome.execution_id), tmp_path)


@pytest.mark.behind_pgbouncer
@pytest.mark.parametrize("name", list(CASES))
def test_on_a_worker_a_body_that_loses_its_connection_runs_again(
    name: str, start_worker: Any, tmp_path: Path
) -> None:
    case = CASES[name]
    open_accounts()
    worker = start_worker(faults=case.faults)
    on_worker = getattr(cut_reactors, f"{case.reactor.__name__}OnWorker")
    outcome = on_worker.run(case.inputs)
    row = wait_until(
        lambda: finished(outcome.execution_id), timeout=90, what=f"the {name} run to finish"
    )
    check(case, row, tmp_path)
    assert "running it again on a new connection" in worker.log()
    assert "Traceback" not in worker.log()


def test_a_lost_connection_is_told_from_a_refused_statement(transactional_db: Any) -> None:
    """Only a connection that is gone counts: a statement timeout, a constraint or a syntax
    error are the body's own failures."""
    from django.db import DatabaseError, IntegrityError, InterfaceError, connection

    from django_reactor.store import connection_lost, reconnect_after

    def error_of(sql: str) -> BaseException:
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
        except DatabaseError as exc:
            return exc
        raise AssertionError(f"{sql!r} did not fail")

    timeout = error_of("SET statement_timeout = 1; SELECT pg_sleep(1)")
    connection.close()
    Effect.objects.create(key="taken", execution_id="00000000-0000-0000-0000-000000000001")
    duplicate: BaseException | None = None
    try:
        Effect.objects.create(key="taken", execution_id="00000000-0000-0000-0000-000000000001")
    except IntegrityError as exc:
        duplicate = exc
    assert duplicate is not None
    syntax = error_of("SELEC 1")
    for refused in (timeout, duplicate, syntax):
        assert not connection_lost(refused), refused
        assert not reconnect_after(refused)
        assert connection.connection is not None  # left alone
    terminated = error_of("SELECT pg_terminate_backend(pg_backend_pid())")
    assert connection_lost(terminated)
    assert connection_lost(RuntimeError("wrapped")) is False
    wrapped = RuntimeError("the step's own error")
    wrapped.__cause__ = terminated
    assert connection_lost(wrapped)  # a body that wraps the driver's error
    assert connection_lost(InterfaceError("connection already closed"))
    assert reconnect_after(terminated)
    assert connection.connection is None  # dropped: the next statement connects again
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
