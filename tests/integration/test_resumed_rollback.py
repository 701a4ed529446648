"""A rollback cut off by its process's death is resumed by a worker (the one-statement claim
of PostgreSQL, or the ORM's) without running again the undo whose failure it recorded, and the
run's failure still names that undo's own error."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import Reactor, Step, services, step
from django_reactor.engine import probes
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

UNDONE: list[str] = []


class Undoable(Step):
    def run(self, **arguments: Any) -> Any:
        if self.context.step == "third":
            raise RuntimeError("third failed")
        return self.context.step

    def undo(self, result: Any, **arguments: Any) -> None:
        UNDONE.append(self.context.step)
        if self.context.step == "second":
            raise RuntimeError("second's undo failed")


class ThreeUndoable(Reactor):
    first = step(Undoable)
    second = step(Undoable, wait_for=["first"])
    third = step(Undoable, wait_for=["second"])


def test_a_resumed_rollback_reports_the_failed_undo_without_running_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    UNDONE.clear()

    def die_before_first_undo(point: str, step_name: str) -> None:
        if point == "before_undo" and step_name == "first":
            raise SystemExit("the process running the rollback died")

    monkeypatch.setattr(probes, "active", die_before_first_undo)
    with pytest.raises(SystemExit):
        ThreeUndoable.run({})
    monkeypatch.setattr(probes, "active", None)
    row = Execution.objects.get(reactor=ThreeUndoable.definition.name)
    assert UNDONE == ["second"]
    # The process is gone: its lease runs out and a worker takes the run over.
    Execution.objects.filter(pk=row.pk).update(
        status=ExecutionStatus.ROLLING_BACK, lease_expires_at="2000-01-01T00:00:00Z"
    )
    services.resume(row.id)
    row.refresh_from_db()
    assert UNDONE == ["second", "first"]  # second's undo is not run again
    assert row.status == ExecutionStatus.NEEDS_ATTENTION
    (failure,) = row.failure["rollback_failures"]
    assert failure["step"] == "second"
    assert failure["message"] == "second's undo failed"
