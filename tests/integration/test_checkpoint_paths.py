"""The checkpoint's two paths write the same rows: the one-statement SQL of PostgreSQL and the
ORM path every other database (and every non-routine checkpoint) takes. Each run below goes
through one dialect of the store on the same database: PostgreSQL's, or the generic store's
(``store.dialects.forced``), creating, checkpointing, waking and claiming the run."""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any

import pytest
from django.db import transaction
from rest_framework import serializers

from django_reactor import Reactor, Retry, Skip, Step, arg, services, sleep, step, store
from django_reactor.models import Execution, ExecutionAttribute, ExecutionEvent, StepRecord
from tests.integration.reactors import FAIL_AT, Tracked

# Transactional: a new step's record is inserted at once in autocommit, and only if there is
# none inside a transaction (the tests below take both ways).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


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


def through(path: str) -> contextlib.AbstractContextManager[Any]:
    """The store as it is on PostgreSQL (``"sql"``), or the generic store (``"orm"``)."""
    assert store.dialect().one_statement_checkpoint, "PostgreSQL's dialect"
    return contextlib.nullcontext() if path == "sql" else store.dialects.forced(generic())


def generic() -> store.dialects.Dialect:
    chosen = store.dialects.generic()
    assert not chosen.one_statement_checkpoint
    return chosen


def run_through(path: str, *, fail_last: bool) -> Any:
    FAIL_AT.clear()
    FAIL_AT.add("flaky")
    if fail_last:
        FAIL_AT.add("last")
    try:
        with through(path):
            parked = EveryKindOfWrite.run({}).execution_id
            parked_rows = rows(parked)  # the park, as written
            store.start_now(parked)  # its sleep ends now; resumed as a worker would
            services.resume(parked)
        return parked, parked_rows
    finally:
        FAIL_AT.clear()


@pytest.mark.parametrize("fail_last", [False, True], ids=["completes", "fails-and-undoes"])
def test_the_sql_and_orm_checkpoints_write_the_same_rows(fail_last: bool) -> None:
    sql_run, sql_parked = run_through("sql", fail_last=fail_last)
    orm_run, orm_parked = run_through("orm", fail_last=fail_last)
    assert sql_parked == orm_parked
    assert sql_parked["execution"][0] == "pending"
    by_sql, by_orm = rows(sql_run), rows(orm_run)
    assert by_sql == by_orm
    assert by_sql["steps"], "the runs wrote step records"


def test_the_sweep_ends_sleeps_alike_in_sql_and_through_the_orm() -> None:
    from django_reactor.store.sleeps import end_due_sleeps

    def slept(path: str) -> dict[str, Any]:
        FAIL_AT.clear()
        FAIL_AT.add("flaky")
        parked = EveryKindOfWrite.run({}).execution_id
        future = Execution.objects.filter(pk=parked).values_list("wake_at", flat=True).get()
        with through(path):
            assert end_due_sleeps([parked], future - dt.timedelta(seconds=1)) == 0  # not yet
            assert end_due_sleeps([parked], future + dt.timedelta(seconds=1)) == 1
            assert end_due_sleeps([parked], future + dt.timedelta(seconds=2)) == 0  # ended once
        Execution.objects.filter(pk=parked).update(wake_at=future - dt.timedelta(hours=2))
        services.resume(parked)
        return rows(parked)

    try:
        by_sql = slept("sql")
        by_orm = slept("orm")
    finally:
        FAIL_AT.clear()
    assert by_sql == by_orm
    assert by_sql["execution"][0] == "completed"
    assert ("nap", "completed") in [(s[0], s[1]) for s in by_sql["steps"]]


class OneStep(Reactor):
    only = step(Tracked)


def statements_sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Collects the text of every checkpoint statement sent from now on."""
    from django_reactor.store import sql

    sent: list[str] = []
    original = sql.execute

    def execute(statement: str, params: Any, connection: Any = None) -> Any:
        sent.append(statement)
        return original(statement, params, connection)

    monkeypatch.setattr(sql, "execute", execute)
    return sent


def test_a_step_without_a_record_is_inserted_without_looking_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = statements_sent(monkeypatch)
    FAIL_AT.clear()
    outcome = EveryKindOfWrite.run({})
    step_checkpoints = [s for s in sent if "INSERT INTO django_reactor_steprecord" in s]
    assert step_checkpoints, "the run checkpointed its steps in SQL"
    # The retried step's second attempt replaces nothing either: its first failure was a
    # retry entry, not a record. None of the new run's checkpoints looked for a record.
    assert not [s for s in step_checkpoints if "su AS (UPDATE" in s]
    assert [r.step for r in StepRecord.objects.filter(execution_id=outcome.execution_id)] != []


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "in-a-transaction"])
def test_a_step_believed_new_that_has_a_record_is_replaced_as_usual(
    monkeypatch: pytest.MonkeyPatch, in_transaction: bool
) -> None:
    from django_reactor.engine.journal import JournalBatch, StepWrite

    FAIL_AT.clear()
    execution_id = OneStep.run({}).execution_id
    old = StepRecord.objects.get(execution_id=execution_id, step="only")
    assert old.traced  # the record stands for the step's trace entry
    assert not ExecutionEvent.objects.filter(execution_id=execution_id, step="only").exists()
    fence = Execution.objects.filter(pk=execution_id).values_list("fence", flat=True).get()
    journal = store.DatabaseJournal(store.Owned(execution_id, fence), recorded=set())
    sent = statements_sent(monkeypatch)
    now = dt.datetime.now(dt.UTC)
    write = StepWrite(
        step="only",
        status="completed",
        seq=old.seq + 5,
        attempts=2,
        arguments={},
        secret_arguments=[],
        started_at=now,
        finished_at=now,
        result={"again": True},
    )
    with transaction.atomic() if in_transaction else contextlib.nullcontext():
        assert journal.commit(JournalBatch(step=write)) is None
    # First the insert the journal believed right (refused by the unique constraint, or, in a
    # transaction, not made), then the statement that replaces the record, keeping its trace
    # entry as an event row.
    assert len(sent) == 2
    assert ("NOT EXISTS" in sent[0]) is in_transaction
    assert "su AS (UPDATE" not in sent[0]
    assert "su AS (UPDATE" in sent[1]
    record = StepRecord.objects.get(execution_id=execution_id, step="only")
    assert (record.pk, record.seq, record.attempts, record.result) == (
        old.pk,
        old.seq + 5,
        2,
        {"again": True},
    )
    kept = ExecutionEvent.objects.get(execution_id=execution_id, step="only")
    assert (kept.kind, kept.seq, kept.attempt) == ("run", old.seq, old.attempts)
    assert [e.step for e in store.event_rows(execution_id)].count("only") == 1
    # Now it knows: the next write of the step replaces it at once.
    sent.clear()
    assert journal.commit(JournalBatch(step=write)) is None
    assert len(sent) == 1
    assert "su AS (UPDATE" in sent[0]


# ---------------------------------------------------------------------------- attributes


class Packs(Step):
    """Sets an attribute, replaces a declared one's value and removes another declared one."""

    def run(self) -> Any:
        self.context.set_attribute("stage", "packed")
        self.context.set_attribute("channel", "phone")
        self.context.set_attribute("customer_id", None)
        return "packed"


class Ships(Step):
    def run(self) -> Any:
        self.context.set_attribute("stage", "shipped")
        self.context.set_attribute("express", True)
        if "ships" in FAIL_AT:
            raise RuntimeError("the carrier is down")
        return "shipped"


class EveryAttributeWrite(Reactor):
    """Attributes written with the run, set and removed by a step, a park, then set again by
    the step after it (or not: it fails, and the run is undone)."""

    class Inputs(serializers.Serializer):
        customer_id = serializers.IntegerField()

    first = step(Tracked)
    packs = step(Packs, wait_for=["first"])
    nap = sleep(dt.timedelta(hours=1), after=["packs"])
    ships = step(Ships, wait_for=["nap"])

    class Meta:
        attributes = {"customer_id": arg.input("customer_id"), "channel": arg.value("web")}


def attribute_rows(execution_id: Any) -> list[tuple[str, str, bool]]:
    """The run's attributes: key, value, and whether it copies the run's creation time."""
    created = Execution.objects.get(pk=execution_id).created_at
    return [
        (a.key, a.value, a.run_created_at == created)
        for a in ExecutionAttribute.objects.filter(execution_id=execution_id).order_by("key")
    ]


@pytest.mark.parametrize("fail_last", [False, True], ids=["completes", "fails-and-undoes"])
def test_the_sql_and_orm_paths_write_the_same_attributes(
    monkeypatch: pytest.MonkeyPatch, fail_last: bool
) -> None:
    sent = statements_sent(monkeypatch)

    def attributes_through(path: str) -> tuple[Any, Any, list[str]]:
        FAIL_AT.clear()
        if fail_last:
            FAIL_AT.add("ships")
        sent.clear()
        with through(path):
            parked = EveryAttributeWrite.run({"customer_id": 42}).execution_id
            at_park = attribute_rows(parked)
            store.start_now(parked)
            services.resume(parked)
        written = [s for s in sent if "executionattribute" in s]
        return (at_park, (attribute_rows(parked), rows(parked)), written)

    try:
        sql_park, sql_end, sql_statements = attributes_through("sql")
        orm_park, orm_end, orm_statements = attributes_through("orm")
    finally:
        FAIL_AT.clear()
    assert (
        sql_park
        == orm_park
        == [
            ("channel", "phone", True),
            ("stage", "packed", True),
        ]
    )
    assert sql_end == orm_end
    expected = [("channel", "phone", True), ("express", "true", True), ("stage", "shipped", True)]
    assert sql_end[0] == ([("channel", "phone", True), ("stage", "packed", True)] if fail_last
                          else expected)  # fmt: skip
    # PostgreSQL wrote them in the run's insert and in the checkpoints' one statement each: the
    # insert, the step that set and removed some, and (unless it failed) the one after the park.
    assert any("at AS (INSERT INTO django_reactor_executionattribute" in s for s in sql_statements)
    assert any("sa AS (INSERT" in s and "ra AS (DELETE" in s for s in sql_statements)
    assert len(sql_statements) == (2 if fail_last else 3)
    assert orm_statements == []
