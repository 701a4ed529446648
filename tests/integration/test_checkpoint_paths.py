"""The checkpoint's two paths write the same rows: the one-statement SQL of PostgreSQL and the
ORM path every other database (and every non-routine checkpoint) takes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection

from django_reactor import Reactor, Retry, Skip, Step, services, sleep, step, store
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
    """Completed, skipped and retried steps, a sleep that parks the run, then a failure that
    undoes them."""

    first = step(Tracked)
    skipped = step(SkipsOne, wait_for=["first"])
    flaky = step(FlakyOnce, wait_for=["skipped"])
    nap = sleep(dt.timedelta(hours=1), after=["flaky"])
    last = step(Tracked, wait_for=["nap"])


def rows(execution_id: Any) -> dict[str, Any]:
    """What the checkpoints wrote, without ids and clock values."""
    run = Execution.objects.get(pk=execution_id)
    steps = [
        (
            r.step,
            r.status,
            r.seq,
            r.attempts,
            r.arguments,
            "<the time it slept until>" if r.step == "nap" else r.result,
            r.compensable,
            r.rollback,
        )
        for r in StepRecord.objects.filter(execution_id=execution_id).order_by("seq")
    ]
    errors = [
        (r.step, (r.error or {}).get("kind"), (r.rollback_error or {}).get("message"))
        for r in StepRecord.objects.filter(execution_id=execution_id).order_by("seq")
    ]
    events = [
        (
            e.seq,
            e.kind,
            e.step,
            e.attempt,
            {k: v for k, v in e.data.items() if k not in ("delay", "until")},
        )
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
            run.wake_at is not None,
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
        parked = EveryKindOfWrite.run({}).execution_id
        parked_rows = rows(parked)  # the park, as written
        store.start_now(parked)  # its sleep ends now; resumed as a worker would
        services.resume(parked)
        return parked, parked_rows
    finally:
        monkeypatch.undo()
        FAIL_AT.clear()


@pytest.mark.parametrize("fail_last", [False, True], ids=["completes", "fails-and-undoes"])
def test_the_sql_and_orm_checkpoints_write_the_same_rows(
    monkeypatch: pytest.MonkeyPatch, fail_last: bool
) -> None:
    assert connection.vendor == "postgresql"
    sql_run, sql_parked = run_through("sql", monkeypatch, fail_last=fail_last)
    orm_run, orm_parked = run_through("orm", monkeypatch, fail_last=fail_last)
    assert sql_parked == orm_parked
    assert sql_parked["execution"][0] == "pending"
    by_sql, by_orm = rows(sql_run), rows(orm_run)
    assert by_sql == by_orm
    assert by_sql["steps"], "the runs wrote step records"


def test_the_sweep_ends_sleeps_alike_in_sql_and_through_the_orm() -> None:
    from django_reactor.store import sleeps

    def slept(end: Any) -> dict[str, Any]:
        FAIL_AT.clear()
        FAIL_AT.add("flaky")
        parked = EveryKindOfWrite.run({}).execution_id
        future = Execution.objects.filter(pk=parked).values_list("wake_at", flat=True).get()
        assert end([parked], future - dt.timedelta(seconds=1)) == 0  # not over yet
        assert end([parked], future + dt.timedelta(seconds=1)) == 1
        assert end([parked], future + dt.timedelta(seconds=2)) == 0  # ended once
        Execution.objects.filter(pk=parked).update(wake_at=future - dt.timedelta(hours=2))
        services.resume(parked)
        return rows(parked)

    try:
        by_sql = slept(sleeps.end_due_sleeps_sql)
        by_orm = slept(sleeps.end_due_sleeps_orm)
    finally:
        FAIL_AT.clear()
    assert by_sql == by_orm
    assert by_sql["execution"][0] == "completed"
    assert ("nap", "completed") in [(s[0], s[1]) for s in by_sql["steps"]]
