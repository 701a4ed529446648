"""Atomic steps on real workers killed at every point of a step: the money moves once.

``AtomicTransfer`` debits ``alice`` and credits ``bob`` with atomic steps (each step's balance
change and ledger entry commit with its checkpoint). A worker is SIGKILLed before the body,
in the middle of it, after it but before the commit, and after the commit; another worker (or
the same one's next process) resumes the run. Whatever the point, the run completes, the
balances moved once and the ledger holds one entry per step. A body killed before its commit
started again (the count of starts is kept in a file, outside the transaction); its first
writes vanished with its transaction.
"""

from __future__ import annotations

import os
import signal
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from django_reactor.states import ExecutionStatus
from testproject.example.models import Account, LedgerEntry
from tests.workers.conftest import WORKER_REACTOR_SETTINGS
from tests.workers.harness import Worker, process_state, wait_until
from tests.workers.reactors import AtomicTransfer, AtomicTransferThenRead
from tests.workers.test_crashes import sweep_until_finished, trace


def starts(tmp_path: Path, execution_id: Any) -> list[str]:
    path = tmp_path / f"starts-{execution_id}"
    return path.read_text().split() if path.exists() else []


def ledger() -> list[tuple[str, str, Decimal]]:
    return [
        (e.account.name, e.step, e.amount)
        for e in LedgerEntry.objects.select_related("account").order_by("id")
    ]


@pytest.mark.parametrize(
    ("point", "credit_starts"),
    [
        ("before_step", 1),  # killed before the body began
        ("mid_body", 2),  # after its writes, inside its transaction
        ("before_step_commit", 2),  # body done, checkpoint not committed
        ("after_step_commit", 1),  # committed: never runs again
    ],
)
def test_an_atomic_step_killed_at_any_point_moves_the_money_once(
    start_worker: Any, tmp_path: Path, point: str, credit_starts: int
) -> None:
    Account.objects.create(name="alice", balance=100)
    Account.objects.create(name="bob", balance=0)
    start_worker(faults=f"{point}@credit=kill:once")
    outcome = AtomicTransfer.run({"source": "alice", "target": "bob"})
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED
    # After the last step's commit the run is complete: nothing is left to recover.
    assert row.recovery_attempts == (0 if point == "after_step_commit" else 1)
    assert Account.objects.get(name="alice").balance == 70
    assert Account.objects.get(name="bob").balance == 30
    assert ledger() == [("alice", "debit", Decimal(-30)), ("bob", "credit", Decimal(30))]
    assert starts(tmp_path, row.id) == ["debit"] + ["credit"] * credit_starts
    assert [s for _, s in trace(row.id) if s] == ["debit", "credit"]


@pytest.mark.behind_pgbouncer
@pytest.mark.parametrize("point", ["mid_undo", "before_undo"])
def test_an_atomic_undo_killed_midway_puts_the_money_back_once(
    start_worker: Any, tmp_path: Path, point: str
) -> None:
    Account.objects.create(name="alice", balance=100)
    Account.objects.create(name="closed", balance=0)
    start_worker(faults=f"{point}@debit=kill:once")
    outcome = AtomicTransfer.run({"source": "alice", "target": "closed"})
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.FAILED
    assert Account.objects.get(name="alice").balance == 100
    assert Account.objects.get(name="closed").balance == 0
    # The failed credit's writes never committed; the undo's committed once.
    assert ledger() == [("alice", "debit", Decimal(-30)), ("alice", "undo:debit", Decimal(30))]
    assert [(k, s) for k, s in trace(row.id) if s] == [
        ("run", "debit"),
        ("fail", "credit"),
        ("undo", "debit"),
    ]


def _stall_credit_and_take_over(
    start_worker: Any, monkeypatch: pytest.MonkeyPatch, reactor: Any
) -> tuple[Worker, Any]:
    """Run ``reactor`` (alice pays bob 30) on a worker that stops itself inside ``credit``'s
    transaction after its writes; sweep until another process took the run over and completed
    it (ending the stopped session, ``ATOMIC_STEP_TIMEOUT`` being far beyond the wait); then
    wake the stopped process. Returns the worker and the finished run's row."""
    monkeypatch.setitem(WORKER_REACTOR_SETTINGS, "ATOMIC_STEP_TIMEOUT", 600)
    Account.objects.create(name="alice", balance=100)
    Account.objects.create(name="bob", balance=0)
    worker: Worker = start_worker(faults="mid_body@credit=stop:once")
    outcome = reactor.run({"source": "alice", "target": "bob"})
    stopped = wait_until(
        lambda: [p for p in worker.children() if process_state(p) == "T"],
        what="a worker process to stop inside credit's transaction",
    )[0]
    row = sweep_until_finished(outcome.execution_id, timeout=60)
    assert row.status == ExecutionStatus.COMPLETED, (row.status, row.failure)
    assert "ended 1 database session(s) of execution" in worker.log()
    os.kill(stopped, signal.SIGCONT)
    return worker, row


@pytest.mark.behind_pgbouncer
def test_a_takeover_ends_the_stalled_owner_that_holds_the_atomic_steps_locks(
    start_worker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopped inside ``credit``'s transaction (after its writes: it holds bob's row
    lock) is taken over once its lease expires; the new owner ends the stalled session instead
    of waiting on its lock until ``ATOMIC_STEP_TIMEOUT``, which is set far beyond the wait
    here. Woken, the stalled worker writes nothing: the money moved once."""
    worker, row = _stall_credit_and_take_over(start_worker, monkeypatch, AtomicTransfer)
    wait_until(
        lambda: "moved on while this process's connection was lost" in worker.log(),
        what="the woken worker to find its session ended and the run moved on",
    )
    assert Account.objects.get(name="alice").balance == 70
    assert Account.objects.get(name="bob").balance == 30
    assert ledger() == [("alice", "debit", Decimal(-30)), ("bob", "credit", Decimal(30))]
    assert starts(tmp_path, row.id) == ["debit", "credit", "credit"]
    assert [s for _, s in trace(row.id) if s] == ["debit", "credit"]


@pytest.mark.behind_pgbouncer
def test_a_stalled_owner_whose_session_was_ended_does_not_run_its_step_again(
    start_worker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the stalled body queries again once woken (it reads the balance back):
    that query finds its session ended by the takeover, a lost connection. The body is not run
    again on a new connection (the new owner ran the step): the woken worker stops."""
    worker, row = _stall_credit_and_take_over(start_worker, monkeypatch, AtomicTransferThenRead)
    wait_until(
        lambda: f"execution {row.id} was taken over by another process" in worker.log(),
        what="the woken worker to find the run taken over and stop",
    )
    assert "running it again on a new connection" not in worker.log()
    assert starts(tmp_path, row.id) == ["debit", "credit", "credit"]  # none by the woken one
    assert Account.objects.get(name="alice").balance == 70
    assert Account.objects.get(name="bob").balance == 30
    assert ledger() == [("alice", "debit", Decimal(-30)), ("bob", "credit", Decimal(30))]
    assert [kind for kind, _ in trace(row.id) if kind == "reconnect"] == []


def test_only_sessions_of_an_older_fence_are_ended(transactional_db: Any) -> None:
    """``end_stalled_owners`` ends a session marked with the run and an older fence; never
    one of the same fence, of another run, or one that is not an atomic step's."""
    import uuid

    import psycopg
    from django.db import connection

    from django_reactor import store
    from django_reactor.store.dialects.postgresql import atomic_owner

    run, other = uuid.uuid4(), uuid.uuid4()
    params = connection.get_connection_params()
    wanted = ("dbname", "user", "host", "port", "password")
    dsn = psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items() if k in wanted})
    sessions = {}
    for name in (atomic_owner(run, 3), atomic_owner(run, 4), atomic_owner(other, 1), "psql"):
        session = psycopg.connect(dsn)
        session.execute("SELECT 1")  # inside a transaction, as a stalled body would be
        session.execute(f"SET LOCAL application_name = '{name}'")
        sessions[name] = session
    try:
        assert store.end_stalled_owners(store.Owned(run, 3)) == 0  # none older than 3
        assert store.end_stalled_owners(store.Owned(run, 5)) == 2
        gone = {name for name, s in sessions.items() if _ended(s)}
        assert gone == {atomic_owner(run, 3), atomic_owner(run, 4)}
    finally:
        for session in sessions.values():
            session.close()


def _ended(session: Any) -> bool:
    try:
        session.execute("SELECT 1")
    except Exception:
        return True
    return False
