"""The checkpoint's two paths write the same rows: the one-statement SQL of PostgreSQL and the
ORM path every other database (and every non-routine checkpoint) takes."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from django_reactor import Reactor, Retry, Skip, Step, step, store
from django_reactor.models import Execution, StepRecord
from tests.integration.reactors import FAIL_AT, Tracked

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


class SkipsOne(Step):
    def run(self) -> Any:
        return Skip({"skipped": True})


class FlakyOnce(Step):
    retry = Retry(attempts=2, delay=0)

    def run(self) -> Any:
        if "flaky" in FAIL_AT:
            FAIL_AT.discard("flaky")
            raise RuntimeError("first attempt fails")
        return {"second": "attempt"}


class EveryKindOfWrite(Reactor):
    """Completed, skipped and retried steps, then a failure that undoes them."""

    first = step(Tracked)
    skipped = step(SkipsOne, wait_for=["first"])
    flaky = step(FlakyOnce, wait_for=["skipped"])
    last = step(Tracked, wait_for=["flaky"])


def rows(execution_id: Any) -> dict[str, Any]:
    """What the checkpoints wrote, without ids and clock values."""
    run = Execution.objects.get(pk=execution_id)
    steps = [
        (r.step, r.status, r.seq, r.attempts, r.arguments, r.result, r.compensable, r.rollback)
        for r in StepRecord.objects.filter(execution_id=execution_id).order_by("seq")
    ]
    errors = [
        (r.step, (r.error or {}).get("kind"), (r.rollback_error or {}).get("message"))
        for r in StepRecord.objects.filter(execution_id=execution_id).order_by("seq")
    ]
    events = [
        (e.seq, e.kind, e.step, e.attempt, {k: v for k, v in e.data.items() if k != "delay"})
        for e in store.event_rows(execution_id)
    ]
    return {
        "execution": (
            run.status,
            run.current_step,
            run.current_attempt,
            run.result,
            (run.failure or {}).get("kind"),
            run.lease_owner,
            run.finished_at is not None,
        ),
        "steps": steps,
        "errors": errors,
        "events": events,
    }


def run_through(path: str, monkeypatch: pytest.MonkeyPatch, *, fail_last: bool) -> Any:
    original = store.DatabaseJournal.commit

    def commit(self: Any, batch: Any) -> Any:
        self.fast_path = path == "sql"
        return original(self, batch)

    monkeypatch.setattr(store.DatabaseJournal, "commit", commit)
    FAIL_AT.clear()
    FAIL_AT.add("flaky")
    if fail_last:
        FAIL_AT.add("last")
    try:
        return EveryKindOfWrite.run({}).execution_id
    finally:
        monkeypatch.undo()
        FAIL_AT.clear()


@pytest.mark.parametrize("fail_last", [False, True], ids=["completes", "fails-and-undoes"])
def test_the_sql_and_orm_checkpoints_write_the_same_rows(
    monkeypatch: pytest.MonkeyPatch, fail_last: bool
) -> None:
    assert connection.vendor == "postgresql"
    by_sql = rows(run_through("sql", monkeypatch, fail_last=fail_last))
    by_orm = rows(run_through("orm", monkeypatch, fail_last=fail_last))
    assert by_sql == by_orm
    assert by_sql["steps"], "the runs wrote step records"
