"""The checkpoint: one transaction per state change, conditional on the fence."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection

from django_reactor import Reactor, step, store
from django_reactor.engine.journal import Event, JournalBatch, RollbackWrite, StepWrite, StopRequest
from django_reactor.engine.state import RunState
from django_reactor.exceptions import LeaseLost
from django_reactor.models import Execution, ExecutionEvent, Pause, StepRecord
from django_reactor.states import ExecutionStatus, StepStatus
from django_reactor.store.dialects import Dialect

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


class ABC(Reactor):
    """Three plain steps, whose records the tests below write by hand."""

    @step()
    def a() -> None: ...

    @step()
    def b() -> None: ...

    @step()
    def c() -> None: ...


@pytest.fixture(params=["sql-prepared", "sql-unprepared", "orm"])
def journal_path(request: pytest.FixtureRequest, settings: Any) -> Dialect:
    """Run each test through the one-statement PostgreSQL path (prepared or not) and the ORM
    (the generic store's dialect)."""
    fast = request.param.startswith("sql")
    if fast and not store.dialect().one_statement_checkpoint:
        pytest.skip("the one-statement checkpoint is PostgreSQL only")
    settings.REACTOR = {"CHECKPOINT_PREPARED_STATEMENTS": request.param == "sql-prepared"}
    return store.dialect() if fast else store.dialects.generic()


def new_run() -> store.Owned:
    return store.create_execution(
        reactor="tests.fake",
        definition_hash="h",
        inputs={"x": 1},
        secret_paths=[],
        status=ExecutionStatus.RUNNING,
        owner="me",
        events=[Event(1, "start", NOW)],
    )


def step_batch(name: str, seq: int) -> JournalBatch:
    return JournalBatch(
        events=[Event(seq, "run", NOW, name, 1, 1.5, {"k": "v"})],
        step=StepWrite(
            step=name,
            status=StepStatus.COMPLETED,
            seq=seq,
            attempts=1,
            arguments={"a": 1},
            secret_arguments=[("a",)],
            started_at=NOW,
            finished_at=NOW,
            result={"ok": True},
        ),
        current_step=name,
    )


def test_checkpoint_writes_record_event_and_cursor_together(journal_path: Dialect) -> None:
    owned = new_run()
    journal = store.DatabaseJournal(owned, dialect=journal_path)
    assert journal.commit(step_batch("a", 2)) is None  # no cancel requested
    record = StepRecord.objects.get(execution_id=owned.execution_id, step="a")
    assert (record.status, record.seq, record.result, record.secret_arguments) == (
        "completed",
        2,
        {"ok": True},
        [["a"]],
    )
    event = ExecutionEvent.objects.get(execution_id=owned.execution_id, seq=2)
    assert (event.kind, event.step, event.duration_ms, event.data) == ("run", "a", 1.5, {"k": "v"})
    row = Execution.objects.get(pk=owned.execution_id)
    assert row.current_step == "a"
    assert row.lease_expires_at is not None


def test_a_superseded_fence_writes_nothing(journal_path: Dialect) -> None:
    owned = new_run()
    zombie = store.DatabaseJournal(owned, dialect=journal_path)
    Execution.objects.filter(pk=owned.execution_id).update(fence=owned.fence + 1)
    with pytest.raises(LeaseLost, match="no longer owned"):
        zombie.commit(step_batch("a", 2))
    assert not StepRecord.objects.filter(execution_id=owned.execution_id).exists()
    assert ExecutionEvent.objects.filter(execution_id=owned.execution_id).count() == 1
    assert Execution.objects.get(pk=owned.execution_id).current_step == ""


def test_rollback_status_and_finish(journal_path: Dialect) -> None:
    owned = new_run()
    journal = store.DatabaseJournal(owned, dialect=journal_path)
    journal.commit(step_batch("a", 2))
    journal.commit(
        JournalBatch(
            events=[Event(3, "undo", NOW, "a")],
            rollback=RollbackWrite("a", "failed", NOW, {"message": "down"}),
        )
    )
    journal.commit(
        JournalBatch(
            events=[Event(4, "fail", NOW)],
            status=ExecutionStatus.NEEDS_ATTENTION,
            failure={"kind": "step", "message": "m"},
            finished=True,
        )
    )
    record = StepRecord.objects.get(execution_id=owned.execution_id, step="a")
    assert (record.rollback, record.rollback_error) == ("failed", {"message": "down"})
    row = Execution.objects.get(pk=owned.execution_id)
    assert row.status == ExecutionStatus.NEEDS_ATTENTION
    assert row.failure == {"kind": "step", "message": "m"}
    assert row.lease_owner is None
    assert row.lease_expires_at is None
    assert row.finished_at is not None


def test_result_and_cancel_flag(journal_path: Dialect) -> None:
    owned = new_run()
    journal = store.DatabaseJournal(owned, dialect=journal_path)
    Execution.objects.filter(pk=owned.execution_id).update(
        cancel_requested_at=NOW, cancel_reason="customer called"
    )
    assert journal.commit(
        JournalBatch(
            events=[Event(2, "complete", NOW)],
            status=ExecutionStatus.COMPLETED,
            result=[1, "two"],
            finished=True,
        )
    ) == StopRequest("cancel", "customer called")
    assert Execution.objects.get(pk=owned.execution_id).result == [1, "two"]


def test_a_checkpoint_says_when_the_run_or_its_reactor_is_paused(journal_path: Dialect) -> None:
    owned = new_run()
    journal = store.DatabaseJournal(owned, dialect=journal_path)
    row = Execution.objects.get(pk=owned.execution_id)
    assert journal.commit(step_batch("a", 2)) is None
    Pause.objects.create(reactor=row.reactor, reason="outage", paused_by="ops")
    assert journal.commit(step_batch("b", 3)) == StopRequest(
        "pause", "outage", {"by": "ops", "reactor_paused": True}
    )
    # The run's own pause comes first.
    Pause.objects.create(reactor=row.reactor, execution_id=row.id, reason="this one")
    assert journal.commit(step_batch("c", 4)) == StopRequest("pause", "this one", {})
    # A cancel request wins over a pause.
    Execution.objects.filter(pk=row.id).update(cancel_requested_at=NOW, cancel_reason="no")
    assert journal.commit(step_batch("d", 5)) == StopRequest("cancel", "no")


def test_a_checkpoint_replaces_an_existing_record_of_the_step(journal_path: Dialect) -> None:
    owned = new_run()
    journal = store.DatabaseJournal(owned, dialect=journal_path)
    journal.commit(step_batch("a", 2))
    journal.commit(step_batch("a", 3))
    assert StepRecord.objects.filter(execution_id=owned.execution_id).count() == 1
    assert StepRecord.objects.get(execution_id=owned.execution_id).seq == 3


def test_claim_bumps_the_fence_and_locks_out_the_old_owner() -> None:
    owned = new_run()
    Execution.objects.filter(pk=owned.execution_id).update(
        status=ExecutionStatus.COMPLETED, lease_owner=None, lease_expires_at=None
    )
    claimed = store.claim(
        owned.execution_id,
        allowed=[ExecutionStatus.COMPLETED],
        new_status=ExecutionStatus.ROLLING_BACK,
        owner="operator",
        action="undo",
    )
    assert claimed.fence == owned.fence + 1
    with pytest.raises(LeaseLost):
        store.DatabaseJournal(owned).commit(step_batch("a", 2))
    store.DatabaseJournal(claimed).commit(step_batch("a", 2))


@pytest.mark.postgres
def test_preparing_the_checkpoint_leaves_the_connection_as_django_configured_it() -> None:
    owned = new_run()
    connection.ensure_connection()
    before = connection.connection.prepare_threshold
    store.DatabaseJournal(owned).commit(step_batch("a", 2))
    assert connection.connection.prepare_threshold == before


@pytest.mark.django_db(transaction=True)
def test_the_lease_keeper_extends_a_live_run_and_stops_when_fenced_out() -> None:
    import time

    owned = new_run()
    Execution.objects.filter(pk=owned.execution_id).update(lease_expires_at=NOW)
    with store.LeaseKeeper(owned, interval=0.02) as keeper:
        deadline = time.monotonic() + 10
        while Execution.objects.get(pk=owned.execution_id).lease_expires_at == NOW:
            assert time.monotonic() < deadline, "the lease was never extended"
            time.sleep(0.02)
        Execution.objects.filter(pk=owned.execution_id).update(fence=owned.fence + 1)
        while not keeper.lost:
            assert time.monotonic() < deadline, "the keeper did not notice the new owner"
            time.sleep(0.02)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the folded claim is PostgreSQL's")
def test_the_workers_claim_carries_the_same_state_as_reading_it_back() -> None:
    owned = new_run()
    journal = store.DatabaseJournal(owned)
    journal.commit(step_batch("a", 2))
    journal.commit(step_batch("b", 3))
    failed = step_batch("c", 4)
    assert failed.step is not None
    journal.commit(
        JournalBatch(
            events=failed.events,
            step=StepWrite(
                step="c",
                status=StepStatus.FAILED,
                seq=4,
                attempts=2,
                arguments={"n": [1, None]},
                secret_arguments=[],
                started_at=NOW,
                finished_at=NOW,
                error={"kind": "step", "message": "down", "exception": "ValueError"},
                compensable=True,
            ),
        )
    )
    Execution.objects.filter(pk=owned.execution_id).update(
        lease_expires_at=NOW, current_step="c", current_attempt=2
    )

    claim = store.claim_for_worker(owned.execution_id, "worker")

    assert claim is not None
    from_claim = RunState.restore(ABC.definition, claim.records)
    read_back = RunState.restore(
        ABC.definition, store.run_records(Execution.objects.get(pk=owned.execution_id))
    )
    assert from_claim == read_back
    assert from_claim.results == {"a": {"ok": True}, "b": {"ok": True}}
    assert [entry.step for entry in from_claim.undo_stack] == ["a", "b"]
    assert [p.step for p in from_claim.pending_compensation] == ["c"]
    assert from_claim.next_seq == 5
    assert from_claim.attempts_done == {"c": 2}


def plain_step_batch(name: str, seq: int, at: dt.datetime = NOW) -> JournalBatch:
    """A completed step as the executor writes it: its ``run`` entry has no data."""
    return JournalBatch(
        events=[Event(seq, "run", at, name, 1, 2.5)],
        step=StepWrite(
            step=name,
            status=StepStatus.COMPLETED,
            seq=seq,
            attempts=1,
            arguments={},
            secret_arguments=[],
            started_at=at,
            finished_at=at,
        ),
        current_step=name,
    )


def test_a_completed_steps_trace_entry_is_its_record(journal_path: Dialect) -> None:
    owned = new_run()
    journal = store.DatabaseJournal(owned, dialect=journal_path)
    journal.commit(plain_step_batch("a", 2))
    # No event row of its own: the record stands for it, and the trace reads as written.
    assert list(
        ExecutionEvent.objects.filter(execution_id=owned.execution_id).values_list(
            "kind", flat=True
        )
    ) == ["start"]
    record = StepRecord.objects.get(execution_id=owned.execution_id, step="a")
    assert (record.traced, record.duration_ms) == (True, 2.5)
    entries = [
        (e.seq, e.kind, e.step, e.attempt, e.at, e.duration_ms, e.data)
        for e in store.event_rows(owned.execution_id)
    ]
    assert entries == [
        (1, "start", "", 0, NOW, None, {}),
        (2, "run", "a", 1, NOW, 2.5, {}),
    ]
    assert store.last_seq(owned.execution_id) == 2


def test_a_step_checkpointed_twice_keeps_both_entries(journal_path: Dialect) -> None:
    owned = new_run()
    journal = store.DatabaseJournal(owned, dialect=journal_path)
    later = NOW + dt.timedelta(seconds=1)
    journal.commit(plain_step_batch("a", 2))
    journal.commit(plain_step_batch("a", 3, later))
    # The trace stays append-only: the first entry became an event row before the record
    # was replaced, so a step that ran twice shows twice.
    kinds = [(e.seq, e.kind, e.step, e.at) for e in store.event_rows(owned.execution_id)]
    assert kinds == [(1, "start", "", NOW), (2, "run", "a", NOW), (3, "run", "a", later)]
    assert ExecutionEvent.objects.filter(execution_id=owned.execution_id, kind="run").count() == 1


def test_a_step_entry_with_data_keeps_its_event_row(journal_path: Dialect) -> None:
    owned = new_run()
    store.DatabaseJournal(owned, dialect=journal_path).commit(step_batch("a", 2))
    assert not StepRecord.objects.get(execution_id=owned.execution_id, step="a").traced
    assert ExecutionEvent.objects.filter(execution_id=owned.execution_id, kind="run").count() == 1
    assert [e.seq for e in store.event_rows(owned.execution_id)] == [1, 2]
