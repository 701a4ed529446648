"""services.resume (the worker task's body) and the sweeper, without a worker process."""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_reactor import Dispatched, Reactor, Retry, services, step, store
from django_reactor.models import Dispatch, Execution
from django_reactor.states import ExecutionStatus, StepStatus
from tests.integration.reactors import Tracked, ledger
from tests.shapes import give_shape

pytestmark = pytest.mark.django_db


class InBackground(Reactor):
    one = step(Tracked)
    two = step(Tracked, wait_for=["one"])

    class Meta:
        background = "all"


def test_run_in_the_background_writes_a_pending_run_and_its_dispatch() -> None:
    outcome = InBackground.run({})
    assert isinstance(outcome, Dispatched)
    row = Execution.objects.get(pk=outcome.execution_id)
    assert (row.status, row.lease_owner, row.handed_off) == (ExecutionStatus.PENDING, None, True)
    assert store.stored_shape(row)["two"]["depends_on"] == ["one"]
    assert Dispatch.objects.get(execution=row).reason == "start"
    assert ledger.calls == []
    assert services.find(row.id).outcome == Dispatched(
        execution_id=row.id, status=ExecutionStatus.PENDING
    )


def test_resume_runs_a_pending_run_and_a_second_delivery_does_nothing() -> None:
    outcome = InBackground.run({})
    result = services.resume(outcome.execution_id)
    assert result is not None
    assert result.ok
    assert ledger.calls == [("run", "one"), ("run", "two")]
    assert services.resume(outcome.execution_id) is None
    assert ledger.calls == [("run", "one"), ("run", "two")]


def test_resume_ignores_unknown_and_malformed_ids(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="django_reactor")
    missing = uuid.uuid4()
    assert services.resume(missing) is None
    assert services.resume("not-a-uuid") is None
    assert f"unknown execution {missing}" in caplog.text
    assert "'not-a-uuid', which is not an execution id" in caplog.text


def test_a_reactor_that_no_longer_imports_parks_the_run_once() -> None:
    outcome = InBackground.run({})
    Execution.objects.filter(pk=outcome.execution_id).update(reactor="gone.module.Reactor")
    result = services.resume(outcome.execution_id)
    assert result is not None
    assert result.status == ExecutionStatus.NEEDS_ATTENTION
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.NEEDS_ATTENTION
    assert row.failure["kind"] == "reactor_missing"
    assert "gone.module.Reactor" in row.failure["message"]
    assert services.resume(outcome.execution_id) is None  # parked: not taken again
    assert ledger.calls == []


def test_a_changed_definition_under_a_run_is_refused() -> None:
    outcome = InBackground.run({})
    services.resume(outcome.execution_id)
    # Pretend the run stopped after "one", and the deployed "one" now differs.
    Execution.objects.filter(pk=outcome.execution_id).update(status=ExecutionStatus.PENDING)
    give_shape(
        outcome.execution_id,
        {
            "one": {"impl": "somewhere.Else", "depends_on": []},
            "two": {"impl": "x", "depends_on": ["one"]},
        },
    )
    ledger.clear()
    result = services.resume(outcome.execution_id)
    assert result is not None
    assert result.status == ExecutionStatus.NEEDS_ATTENTION
    message = Execution.objects.get(pk=outcome.execution_id).failure["message"]
    assert "step 'one' ran but its implementation or inputs changed" in message
    assert ledger.calls == []


def test_steps_not_reached_yet_may_change() -> None:
    outcome = InBackground.run({})
    give_shape(
        outcome.execution_id,
        {"one": InBackground.definition.shape["one"], "two": {"impl": "old"}},
    )
    assert services.resume(outcome.execution_id).ok


def test_a_retry_not_due_yet_is_not_taken() -> None:
    outcome = InBackground.run({})
    Execution.objects.filter(pk=outcome.execution_id).update(
        wake_at=timezone.now() + dt.timedelta(hours=1)
    )
    assert services.resume(outcome.execution_id) is None
    assert ledger.calls == []


def test_the_sweeper_recovers_a_dead_run_and_releases_due_wake_ups(settings: Any) -> None:
    dead = InBackground.run({})
    Execution.objects.filter(pk=dead.execution_id).update(
        status=ExecutionStatus.RUNNING, lease_owner="gone:1",
        lease_expires_at=timezone.now() - dt.timedelta(seconds=5),
    )  # fmt: skip
    woken = InBackground.run({})
    Execution.objects.filter(pk=woken.execution_id).update(
        wake_at=timezone.now() - dt.timedelta(seconds=1)
    )
    live = InBackground.run({})
    Execution.objects.filter(pk=live.execution_id).update(
        status=ExecutionStatus.RUNNING, lease_owner="alive:1",
        lease_expires_at=timezone.now() + dt.timedelta(minutes=5),
    )  # fmt: skip
    # Their first tasks went out a while ago.
    Dispatch.objects.update(sent_at=timezone.now() - dt.timedelta(minutes=1))
    report = services.sweep()
    assert (report.recovered, report.woken) == (1, 1)
    reasons = dict(Dispatch.objects.filter(sent_at__isnull=True).values_list("execution", "reason"))
    assert reasons == {dead.execution_id: "recover", woken.execution_id: "wake"}
    # A second sweep right away queues nothing more: those dispatches are on their way.
    assert services.sweep().as_dict() == {
        "republished": 0, "recovered": 0, "woken": 0, "slept": 0, "redispatched": 0, "deleted": 0,
        "expired": 0, "fired": 0, "events": 0,
        "maps": 0,
        "deadlines": 0,
    }  # fmt: skip


def test_the_sweeper_redispatches_a_run_whose_message_was_lost() -> None:
    outcome = InBackground.run({})
    long_ago = timezone.now() - dt.timedelta(minutes=10)
    Dispatch.objects.update(sent_at=long_ago)
    assert services.sweep().redispatched == 1
    assert Dispatch.objects.filter(execution_id=outcome.execution_id).count() == 2


def test_reactor_sweep_command_prints_the_report() -> None:
    out = StringIO()
    call_command("reactor_sweep", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {
        "republished": 0, "recovered": 0, "woken": 0, "slept": 0, "redispatched": 0, "deleted": 0,
        "expired": 0, "fired": 0, "events": 0,
        "maps": 0,
        "deadlines": 0,
    }  # fmt: skip


def test_reactor_sweep_rejects_a_bad_interval() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="above 0"):
        call_command("reactor_sweep", "--loop", "--interval", "0")


def test_background_all_may_start_inside_a_transaction() -> None:
    from django.db import transaction

    with transaction.atomic():
        outcome = InBackground.run({})
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.PENDING


def test_the_store_refuses_to_claim_a_finished_run() -> None:
    outcome = InBackground.run({})
    services.resume(outcome.execution_id)
    assert store.claim_for_worker(outcome.execution_id, "me") is None


class SlowRetry(Reactor):
    @step(retry=Retry(attempts=2, backoff="fixed", delay=0.2))
    def flaky() -> str:
        from django_reactor import step_context

        ledger("run", "flaky")
        if step_context().attempt == 1:
            raise TimeoutError("first attempt times out")
        return "ok"

    class Meta:
        background = "all"


def test_a_long_backoff_becomes_a_wake_up_time_for_the_sweeper(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "RETRY_COUNTDOWN_LIMIT": 0.1}
    outcome = SlowRetry.run({})
    result = services.resume(outcome.execution_id)
    assert result is not None
    assert result.status == ExecutionStatus.PENDING  # parked for its backoff
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.wake_at is not None
    assert row.current_attempt == 1
    assert row.lease_owner is None
    # No Celery countdown for a long wait: only the first (start) dispatch exists.
    assert list(Dispatch.objects.filter(execution=row).values_list("reason", flat=True)) == [
        "start"
    ]
    Dispatch.objects.update(sent_at=timezone.now() - dt.timedelta(minutes=1))
    assert services.sweep().woken == 0  # not due yet
    Execution.objects.filter(pk=row.pk).update(wake_at=timezone.now() - dt.timedelta(seconds=1))
    assert services.sweep().woken == 1
    assert services.resume(outcome.execution_id).ok
    assert ledger.calls == [("run", "flaky"), ("run", "flaky")]


@pytest.mark.postgres
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_sweepers_on_many_hosts_dispatch_each_run_once() -> None:
    runs = [InBackground.run({}).execution_id for _ in range(30)]
    Execution.objects.filter(pk__in=runs).update(
        status=ExecutionStatus.RUNNING, lease_owner="gone:1",
        lease_expires_at=timezone.now() - dt.timedelta(seconds=5),
    )  # fmt: skip
    Dispatch.objects.update(sent_at=timezone.now() - dt.timedelta(minutes=1))
    reports = sweep_together(4)
    assert sum(r.recovered for r in reports) == 30
    recover = Dispatch.objects.filter(reason="recover")
    assert recover.count() == 30
    assert set(recover.values_list("execution_id", flat=True)) == set(runs)


def sweep_together(count: int) -> list[store.SweepReport]:
    """``count`` sweeps at once, each in a thread with its own connection, started together;
    their reports (an error in one fails the test)."""
    import threading

    from django.db import connections

    barrier = threading.Barrier(count, timeout=20)
    reports: list[store.SweepReport] = []
    errors: list[BaseException] = []

    def sweep() -> None:
        try:
            barrier.wait()
            reports.append(services.sweep())
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweep) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert not any(thread.is_alive() for thread in threads)
    return reports


class Compensated(Reactor):
    one = step(Tracked)
    two = step(Tracked, wait_for=["one"])

    class Meta:
        background = "all"


def test_undo_of_a_run_parked_after_killing_its_workers_compensates_that_step(
    settings: Any,
) -> None:
    settings.REACTOR = {**settings.REACTOR, "MAX_RECOVERY_ATTEMPTS": 1}
    outcome = Compensated.run({})
    # As a worker leaves it when killed inside "two" twice: "one" recorded, "two" not.
    services.resume(outcome.execution_id)
    from django_reactor.models import StepRecord

    StepRecord.objects.filter(execution_id=outcome.execution_id, step="two").delete()
    Execution.objects.filter(pk=outcome.execution_id).update(
        status=ExecutionStatus.RUNNING, current_step="two", recovery_attempts=1,
        lease_owner="dead:1", lease_expires_at=timezone.now() - dt.timedelta(seconds=1),
        finished_at=None,
    )  # fmt: skip
    parked = services.resume(outcome.execution_id)
    assert parked.status == ExecutionStatus.NEEDS_ATTENTION
    ledger.clear()
    services.undo(outcome.execution_id)
    assert ledger.calls == [("compensate", "two"), ("undo", "one")]


def test_undo_after_cancelling_a_retry_wait_compensates_the_retrying_step(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "RETRY_COUNTDOWN_LIMIT": 0.1}
    outcome = SlowRetry.run({})
    services.resume(outcome.execution_id)  # first attempt fails; the run waits for its backoff
    services.cancel(outcome.execution_id, reason="giving up")
    ledger.clear()
    handle = services.undo(outcome.execution_id)
    steps = [(e.kind, e.step) for e in handle.trace if e.step]
    assert steps[-2:] == [("fail", "flaky"), ("compensate_skipped", "flaky")]


def test_cancel_refuses_a_live_rollback() -> None:
    from django_reactor.exceptions import ExecutionBusy

    outcome = Compensated.run({})
    Execution.objects.filter(pk=outcome.execution_id).update(
        status=ExecutionStatus.ROLLING_BACK, lease_owner="busy:1",
        lease_expires_at=timezone.now() + dt.timedelta(minutes=1),
    )  # fmt: skip
    with pytest.raises(ExecutionBusy, match="busy:1 is rolling it back"):
        services.cancel(outcome.execution_id)


def test_the_sweeper_forgets_old_dispatches() -> None:
    InBackground.run({})
    InBackground.run({})
    Dispatch.objects.update(sent_at=timezone.now() - dt.timedelta(days=2))
    Execution.objects.update(status=ExecutionStatus.COMPLETED)
    assert services.sweep().deleted == 2
    assert not Dispatch.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_claim_that_waited_for_a_stalled_owners_commit_sees_what_it_committed() -> None:
    """A worker stalled past its lease commits a step (an atomic step's transaction) while
    another worker's claim waits for its row lock: the claim must not take the run with a
    picture of its steps from before that commit (it would run the step again)."""
    import threading

    from django.db import connection, connections, transaction

    from django_reactor.engine.journal import JournalBatch, StepWrite
    from django_reactor.exceptions import LeaseLost
    from django_reactor.models import StepRecord

    run_id = InBackground.run({}).execution_id
    stalled = store.claim_for_worker(run_id, "stalled:1")
    assert stalled is not None
    Execution.objects.filter(pk=run_id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=5)
    )
    written, commit = threading.Event(), threading.Event()
    claims: list[Any] = []

    def owner_commits_step_one() -> None:
        try:
            now = timezone.now()
            with transaction.atomic():
                store.DatabaseJournal(stalled.owned).commit(
                    JournalBatch(
                        step=StepWrite(
                            step="one", status="completed", seq=2, attempts=1, arguments={},
                            secret_arguments=[], started_at=now, finished_at=now, result=1,
                        ),
                        current_step="two",
                    )
                )  # fmt: skip
                written.set()
                assert commit.wait(timeout=20)
        finally:
            connections.close_all()

    def another_worker_claims() -> None:
        try:
            claims.append(store.claim_for_worker(run_id, "taker:2"))
        finally:
            connections.close_all()

    owner = threading.Thread(target=owner_commits_step_one)
    owner.start()
    assert written.wait(timeout=20)
    taker = threading.Thread(target=another_worker_claims)
    taker.start()
    with connection.cursor() as cursor:  # bounded: until the claim waits for the row lock
        for _ in range(400):
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                break
            taker.join(timeout=0.05)
        else:
            pytest.fail("the second claim never waited for the owner's row lock")
    commit.set()
    owner.join(timeout=20)
    taker.join(timeout=20)
    assert not owner.is_alive()
    assert not taker.is_alive()
    assert StepRecord.objects.filter(execution_id=run_id, step="one").exists()
    # The lease had expired: the run is taken over, knowing that step one is done.
    (taken,) = claims
    assert taken is not None
    assert taken.owned.fence == stalled.owned.fence + 1
    assert {r.step for r in taken.records.steps if r.status == StepStatus.COMPLETED} == {"one"}
    with pytest.raises(LeaseLost):  # the stalled owner's next checkpoint writes nothing
        store.DatabaseJournal(stalled.owned).commit(JournalBatch(current_step="two"))


# ---------------------------------------------------------------------------- sweeps in batches


def asleep(count: int, *, due: dt.datetime | None = None) -> list[uuid.UUID]:
    """``count`` background runs nobody owns whose wake-up time came (``due``: one second ago,
    the first the most overdue), their start tasks sent long ago."""
    due = due or timezone.now() - dt.timedelta(seconds=1)
    runs = [InBackground.run({}).execution_id for _ in range(count)]
    for index, run in enumerate(runs):
        Execution.objects.filter(pk=run).update(wake_at=due - dt.timedelta(seconds=count - index))
    Dispatch.objects.update(sent_at=timezone.now() - dt.timedelta(minutes=10))
    return runs


class Published:
    """A publisher that records each publish: the runs, and how many wake-up dispatches were
    committed when it was called (after the commit of its batch)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[uuid.UUID], int]] = []

    def publish(self, dispatches: Any) -> list[int]:
        from django.db import connections

        with connections["default"].cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {Dispatch._meta.db_table} WHERE reason = 'wake'")
            committed = cursor.fetchone()[0]
        self.calls.append(([d.execution_id for d in dispatches], committed))
        return [d.dispatch_id for d in dispatches]


@pytest.fixture
def published() -> Any:
    from django_reactor.store import outbox

    capture = Published()
    previous = outbox.register_publisher(capture)  # after each commit, as in production
    yield capture
    outbox.register_publisher(previous[0], after_commit=previous[1])


def test_a_sweep_whose_batch_comes_back_full_goes_again_at_once(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "SWEEP_BATCH": 3}
    runs = asleep(7)
    report = services.sweep()
    assert report.woken == 7
    assert not report.cut_short
    wakes = Dispatch.objects.filter(reason="wake")
    assert sorted(wakes.values_list("execution_id", flat=True)) == sorted(runs)
    assert services.sweep().woken == 0  # each woken once


def test_a_sweep_out_of_time_stops_after_one_full_batch_and_says_so(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "SWEEP_BATCH": 3, "SWEEP_BUDGET": 1e-9}
    runs = asleep(7)
    report = services.sweep()
    assert (report.woken, report.cut_short) == (3, True)
    assert services.next_sweep_in(report, 15.0) == 0.0  # the loop sweeps again at once
    # The most overdue first.
    woken = set(Dispatch.objects.filter(reason="wake").values_list("execution_id", flat=True))
    assert woken == set(runs[:3])


def test_the_next_sweep_comes_at_the_next_wake_up_when_that_is_sooner() -> None:
    later = timezone.now() + dt.timedelta(seconds=5)
    [run] = asleep(1, due=later + dt.timedelta(seconds=1))  # wakes at ``later``
    report = services.sweep()
    assert report.woken == 0
    assert report.next_due_at == Execution.objects.get(pk=run).wake_at == later
    assert 0 < services.next_sweep_in(report, 15.0) <= 5.0
    assert services.next_sweep_in(report, 2.0) == 2.0


@pytest.mark.postgres
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_each_batch_is_committed_and_published_before_the_next_in_due_order(
    settings: Any, published: Published
) -> None:
    settings.REACTOR = {**settings.REACTOR, "SWEEP_BATCH": 3}
    runs = asleep(7)
    published.calls.clear()  # their start tasks
    report = services.sweep()
    assert report.woken == 7
    # Three transactions, each published once it committed (workers start on it while the
    # sweep goes on), oldest wake-up time first across them.
    assert [(len(ids), committed) for ids, committed in published.calls] == [
        (3, 3),
        (3, 6),
        (1, 7),
    ]
    assert [run for ids, _ in published.calls for run in ids] == runs
    # Published: marked sent, not published again by the next sweep.
    assert not Dispatch.objects.filter(reason="wake", sent_at__isnull=True).exists()
    assert services.sweep().woken == 0


@pytest.mark.postgres
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_sweepers_racing_through_batches_wake_each_run_once(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "SWEEP_BATCH": 4}
    runs = asleep(40)
    reports = sweep_together(3)
    assert sum(r.woken for r in reports) == 40
    wakes = list(Dispatch.objects.filter(reason="wake").values_list("execution_id", flat=True))
    assert sorted(wakes) == sorted(runs)


def scripted_sweeps(monkeypatch: pytest.MonkeyPatch, *reports: store.SweepReport) -> None:
    """``services.sweep()`` returns ``reports`` in turn, then the loop is interrupted."""
    script = iter(reports)

    def sweep() -> store.SweepReport:
        try:
            return next(script)
        except StopIteration:
            raise KeyboardInterrupt from None

    monkeypatch.setattr(services, "sweep", sweep)


def test_the_sweep_loop_waits_for_nothing_after_a_cut_short_sweep_and_for_the_next_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    soon = timezone.now() + dt.timedelta(seconds=3)
    scripted_sweeps(
        monkeypatch,
        store.SweepReport(woken=500, cut_short=True),
        store.SweepReport(woken=20, next_due_at=soon),
        store.SweepReport(),
    )
    pauses: list[float] = []

    def wait(self: threading.Event, timeout: float | None = None) -> bool:
        assert timeout is not None
        pauses.append(timeout)
        return False

    monkeypatch.setattr(threading.Event, "wait", wait)
    call_command("reactor_sweep", "--loop", "--interval", "15", stdout=StringIO())
    assert pauses[0] == 0.0
    assert 0.0 < pauses[1] <= 3.0
    assert pauses[2] == 15.0
    assert len(pauses) == 3


@pytest.mark.parametrize(
    ("report", "follow", "queued"),
    [
        (store.SweepReport(cut_short=True), True, [({"follow": True}, None)]),
        (store.SweepReport(cut_short=True), False, [({"follow": False}, None)]),
        (store.SweepReport(), True, []),
        (store.SweepReport(), False, []),
    ],
)
def test_the_beat_task_queues_the_next_sweep_when_cut_short(
    monkeypatch: pytest.MonkeyPatch,
    report: store.SweepReport,
    follow: bool,
    queued: list[Any],
) -> None:
    from django_reactor.celery import tasks

    scripted_sweeps(monkeypatch, report)
    calls: list[tuple[Any, Any]] = []
    monkeypatch.setattr(
        tasks.sweep,
        "apply_async",
        lambda **options: calls.append((options["kwargs"], options.get("countdown"))),
    )
    tasks.sweep(follow=follow)
    assert calls == queued


def test_the_beat_task_queues_one_sweep_for_a_wake_up_before_its_next_tick(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from django_reactor.celery import tasks

    settings.REACTOR = {**settings.REACTOR, "SWEEP_INTERVAL": 15.0}
    soon = timezone.now() + dt.timedelta(seconds=3)
    calls: list[tuple[Any, Any]] = []
    monkeypatch.setattr(
        tasks.sweep,
        "apply_async",
        lambda **options: calls.append((options["kwargs"], options.get("countdown"))),
    )
    scripted_sweeps(monkeypatch, store.SweepReport(next_due_at=soon))
    tasks.sweep()
    [(kwargs, countdown)] = calls
    assert kwargs == {"follow": False}  # which queues none for its own next wake-up
    assert 0 < countdown <= 3.0
    scripted_sweeps(monkeypatch, store.SweepReport(next_due_at=soon))
    tasks.sweep(follow=False)
    assert len(calls) == 1
