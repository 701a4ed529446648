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

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from django_reactor.states import ExecutionStatus
from testproject.example.models import Account, LedgerEntry
from tests.workers.reactors import AtomicTransfer
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
