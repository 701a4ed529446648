"""Time on PostgreSQL: delayed runs, durable sleeps, deadlines in every waiting state, "wake
now", heartbeats kept with the lease, and the ``reactor_clock`` fixture that moves time."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from django_reactor import (
    Reactor,
    Rescheduled,
    Scheduled,
    Step,
    arg,
    interrupt,
    services,
    sleep,
    step,
)
from django_reactor.exceptions import InvalidTransition, ReactorError
from django_reactor.models import Execution, Interrupt, StepRecord
from django_reactor.states import ExecutionStatus, InterruptStatus, StepStatus
from django_reactor.store.lease import LeaseKeeper, note_heartbeat
from django_reactor.store.rows import Owned
from tests.helpers import ledger

# A database server (PostgreSQL, and MariaDB in its pass), not SQLite.
pytestmark = [pytest.mark.postgres, pytest.mark.mariadb, pytest.mark.django_db(transaction=True)]


def pairs(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace if e.step]


class Ship(Reactor):
    """Charge, wait out a return window, pay the seller."""

    @step()
    def charge() -> str:
        ledger("run", "charge")
        return "charged"

    @charge.undo
    def refund(result: Any) -> None:
        ledger("undo", "charge")

    window = sleep(dt.timedelta(days=3), after=["charge"])

    @step(wait_for=["window"])
    def payout() -> str:
        ledger("run", "payout")
        return "paid"

    class Meta:
        returns = "payout"


def test_a_sleep_parks_the_run_and_the_clock_wakes_it(reactor_clock: Any) -> None:
    outcome = Ship.run({})
    assert isinstance(outcome, Rescheduled)
    assert outcome.reason == "sleep"
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.PENDING
    assert row.lease_owner is None  # nothing holds the run while it sleeps
    due = row.wake_at
    assert due > timezone.now() + dt.timedelta(days=2, hours=23)
    record = StepRecord.objects.get(execution_id=row.id, step="window")
    assert record.status == StepStatus.SLEEPING
    assert reactor_clock.advance(days=2) == []  # not yet
    assert ("run", "payout") not in ledger.calls
    finished = reactor_clock.advance(days=1)
    assert [o.status for o in finished] == [ExecutionStatus.COMPLETED]
    assert ledger.calls == [("run", "charge"), ("run", "payout")]
    assert pairs(row.id) == [
        ("run", "charge"),
        ("sleep", "window"),
        ("run", "window"),
        ("run", "payout"),
    ]


def test_the_sweep_ends_sleeps_that_are_over_and_the_worker_goes_on_from_there(
    reactor_clock: Any,
) -> None:
    over, later, deadline = Ship.run({}), Ship.run({}), Ship.run({}, deadline=dt.timedelta(days=1))
    StepRecord.objects.filter(
        execution_id__in=[later.execution_id, deadline.execution_id], step="window"
    ).update(
        result=(timezone.now() + dt.timedelta(days=10)).isoformat()
    )  # their sleeps wait longer than their wake-up times say: woken early
    reactor_clock.advance(days=3, run=False)
    report = services.sweep()
    assert (report.woken, report.slept) == (3, 1)
    records = {r.execution_id: r for r in StepRecord.objects.filter(step="window")}
    ended = records[over.execution_id]
    assert (ended.status, ended.attempts, ended.traced, ended.duration_ms) == (
        StepStatus.COMPLETED,
        1,
        True,
        0.0,
    )
    # Its run entry comes after the sleep entry, and the worker's entries after it.
    assert pairs(over.execution_id) == [("run", "charge"), ("sleep", "window"), ("run", "window")]
    # The deadline came before the sleep's time; the other run was woken early.
    assert records[deadline.execution_id].status == StepStatus.SLEEPING
    assert records[later.execution_id].status == StepStatus.SLEEPING
    assert services.sweep().slept == 0  # queued once
    outcome = services.resume(over.execution_id)
    assert outcome is not None
    assert outcome.status == ExecutionStatus.COMPLETED
    assert pairs(over.execution_id) == [
        ("run", "charge"),
        ("sleep", "window"),
        ("run", "window"),
        ("run", "payout"),
    ]
    seqs = [e.seq for e in services.find(over.execution_id).trace]
    assert seqs == sorted(set(seqs))
    assert services.resume(deadline.execution_id).status == ExecutionStatus.FAILED
    assert services.resume(later.execution_id).status == ExecutionStatus.PENDING
    assert ledger.calls.count(("run", "payout")) == 1


def test_a_sleep_whose_time_does_not_read_does_not_stop_the_sweep(
    reactor_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    broken, fine = Ship.run({}), Ship.run({})
    reactor_clock.advance(days=3, run=False)
    StepRecord.objects.filter(execution_id=broken.execution_id, step="window").update(
        result="the day after tomorrow"
    )
    report = services.sweep()
    assert (report.woken, report.slept) == (2, 1)
    assert "does not read" in caplog.text
    assert services.resume(fine.execution_id).status == ExecutionStatus.COMPLETED
    # The worker that takes the other run parks it for a person instead of guessing.
    assert services.resume(broken.execution_id).status == ExecutionStatus.NEEDS_ATTENTION


def test_wake_now_ends_a_sleep_at_once(reactor_clock: Any) -> None:
    outcome = Ship.run({})
    handle = services.wake(outcome.execution_id)
    assert handle.status == ExecutionStatus.PENDING
    finished = reactor_clock.tick()
    assert [o.status for o in finished] == [ExecutionStatus.COMPLETED]
    with pytest.raises(InvalidTransition, match="waits for no time"):
        services.wake(outcome.execution_id)


def test_a_run_scheduled_for_later_starts_at_its_time_once(reactor_clock: Any) -> None:
    class Later(Reactor):
        @step()
        def hello() -> str:
            ledger("run", "hello")
            return "hello"

    start = timezone.now() + dt.timedelta(hours=2)
    outcome = Later.run({}, at=start, idempotency_key="report-2026-12-03")
    assert isinstance(outcome, Scheduled)
    assert outcome.start_at == start
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.SCHEDULED
    assert row.wake_at == start
    assert services.resume(row.id) is None  # not due: a worker leaves it
    again = Later.run({}, at=start, idempotency_key="report-2026-12-03")
    assert again.execution_id == row.id
    assert again.idempotent_replay
    reactor_clock.advance(hours=2)
    assert Execution.objects.get(pk=row.id).status == ExecutionStatus.COMPLETED
    assert ledger.calls == [("run", "hello")]


def test_a_delay_is_the_same_as_a_time(reactor_clock: Any) -> None:
    class Later(Reactor):
        hello = step(lambda: "hello")

    outcome = Later.run({}, delay=dt.timedelta(minutes=30))
    assert isinstance(outcome, Scheduled)
    reactor_clock.advance(minutes=30)
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.COMPLETED


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"at": dt.datetime(2030, 1, 1)}, "a time without a time zone"),
        ({"delay": -5}, "cannot be negative"),
        ({"delay": "soon"}, "must be a timedelta or a number of seconds"),
        ({"at": timezone.now(), "delay": 5}, "takes at= or delay=, not both"),
        ({"deadline": dt.timedelta(0)}, "must be longer than zero"),
        ({"deadline": timezone.now() - dt.timedelta(hours=1)}, "is not after the run's start"),
    ],
)
def test_bad_times_are_refused_before_anything_is_written(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ReactorError, match=message):
        Ship.run({}, **options)
    assert Execution.objects.count() == 0


class Approval(Reactor):
    @step()
    def hold() -> str:
        ledger("run", "hold")
        return "held"

    @hold.undo
    def release(result: Any) -> None:
        ledger("undo", "hold")

    approval = interrupt(after=["hold"])
    settle = step(lambda decision: decision, decision=arg.result("approval"))

    class Meta:
        deadline = dt.timedelta(hours=2)


def test_a_deadline_stops_a_run_paused_at_an_interrupt(reactor_clock: Any) -> None:
    paused = Approval.run({})
    assert paused.status == ExecutionStatus.PAUSED
    row = Execution.objects.get(pk=paused.execution_id)
    assert row.deadline_at is not None
    reactor_clock.advance(hours=1)
    assert Execution.objects.get(pk=row.id).status == ExecutionStatus.PAUSED
    reactor_clock.advance(hours=1, minutes=1)
    row.refresh_from_db()
    assert row.status == ExecutionStatus.FAILED
    assert row.failure["kind"] == "deadline"
    assert ledger.calls == [("run", "hold"), ("undo", "hold")]
    assert Interrupt.objects.get(execution_id=row.id).status != InterruptStatus.WAITING
    assert pairs(row.id)[-2:] == [("deadline", "approval"), ("undo", "hold")]


def test_a_deadline_stops_a_sleeping_run_at_the_deadline_not_at_its_wake_up(
    reactor_clock: Any,
) -> None:
    outcome = Ship.run({}, deadline=dt.timedelta(hours=1))
    row = Execution.objects.get(pk=outcome.execution_id)
    # It wakes at its deadline, not in three days.
    assert abs(row.wake_at - row.deadline_at) < dt.timedelta(seconds=1)
    reactor_clock.advance(hours=1)
    row.refresh_from_db()
    assert row.status == ExecutionStatus.FAILED
    assert row.failure["kind"] == "deadline"
    assert ledger.calls == [("run", "charge"), ("undo", "charge")]


def test_a_deadline_passed_before_a_scheduled_start_fails_the_run_unstarted(
    reactor_clock: Any,
) -> None:
    start = timezone.now() + dt.timedelta(hours=3)
    outcome = Ship.run({}, at=start, deadline=start + dt.timedelta(minutes=1))
    reactor_clock.advance(hours=3, minutes=2)
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.FAILED
    assert row.failure["kind"] == "deadline"
    assert ledger.calls == []


def test_a_halting_deadline_stops_without_rollback(reactor_clock: Any) -> None:
    class Halts(Reactor):
        @step()
        def hold() -> str:
            ledger("run", "hold")
            return "held"

        nap = sleep(dt.timedelta(days=1), after=["hold"])
        after = step(lambda: "after", wait_for=["nap"])

        class Meta:
            deadline = dt.timedelta(hours=1)
            on_deadline = "halt"

    outcome = Halts.run({})
    reactor_clock.advance(hours=2)
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.HALTED
    assert "deadline" in row.result["reason"]
    assert ledger.calls == [("run", "hold")]


def test_composed_children_inherit_the_deadline() -> None:
    class Child(Reactor):
        a = step(lambda: "a")

    from django_reactor import compose

    class Parent(Reactor):
        child = compose(Child)

        class Meta:
            deadline = dt.timedelta(minutes=10)

    outcome = Parent.run({})
    assert outcome.ok
    parent = Execution.objects.get(pk=outcome.execution_id)
    child = Execution.objects.get(parent_id=parent.id)
    assert child.deadline_at == parent.deadline_at


def test_a_heartbeat_is_kept_with_the_next_lease_extension() -> None:
    class Beats(Reactor):
        a = step(lambda: "a")

    outcome = Beats.run({})
    row = Execution.objects.get(pk=outcome.execution_id)
    note_heartbeat(row.id, "a", {"rows": 500})
    LeaseKeeper(Owned(row.id, row.fence)).extend()
    row.refresh_from_db()
    assert row.heartbeat["step"] == "a"
    assert row.heartbeat["details"] == {"rows": 500}


def test_a_step_heartbeats_from_its_body() -> None:
    class Long(Step):
        def run(self) -> str:
            for done in (100, 200):
                self.context.heartbeat({"rows": done})
            return "done"

    class Beating(Reactor):
        long = step(Long, heartbeat_timeout=30)

    assert Beating.run({}).ok


def test_a_deadline_stops_a_run_waiting_for_a_lock(backend: Any, reactor_clock: Any) -> None:
    from django_reactor import Lock

    class Locked(Reactor):
        a = step(lambda: ledger("run", "a"))

        class Meta:
            coordination = [Lock("ledger", ttl=300)]
            deadline = dt.timedelta(minutes=5)
            background = "all"

    held = backend.acquire_lock("lock:ledger", owner="someone else", ttl=300)
    assert held is not None
    waiting = Locked.run({})
    reactor_clock.tick()  # a worker takes it, finds the lock held and reschedules it
    row = Execution.objects.get(pk=waiting.execution_id)
    assert row.status == ExecutionStatus.PENDING  # waits for the lock, holding nothing
    assert [e.data.get("reason") for e in services.find(row.id).trace if e.kind == "park"] == [
        "contention"
    ]
    reactor_clock.advance(minutes=6)
    row.refresh_from_db()
    assert row.status == ExecutionStatus.FAILED
    assert row.failure["kind"] == "deadline"
    assert ledger.calls == []
    backend.release_lock("lock:ledger", owner="someone else")


def test_a_scheduled_run_can_be_cancelled_before_it_starts(reactor_clock: Any) -> None:
    outcome = Ship.run({}, delay=dt.timedelta(hours=1))
    handle = services.cancel(outcome.execution_id, reason="no longer needed")
    assert handle.status == ExecutionStatus.CANCELLED
    reactor_clock.advance(hours=2)
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.CANCELLED
    assert ledger.calls == []


def test_runs_at_a_step_past_its_timeout_and_runs_whose_lease_expired_are_stuck() -> None:
    from io import StringIO

    from django.core.management import call_command

    from django_reactor.models import ExecutionEvent

    class Slow(Reactor):
        a = step(lambda: "a")
        slow = step(lambda: "slow", wait_for=["a"], timeout=60)

    stuck_run = Slow.run({}).execution_id
    expired_run = Slow.run({}).execution_id
    hour_ago = timezone.now() - dt.timedelta(hours=1)
    # As if a process had been running "slow" for an hour, its lease alive...
    Execution.objects.filter(pk=stuck_run).update(
        status=ExecutionStatus.RUNNING,
        current_step="slow",
        lease_owner="worker-1",
        lease_expires_at=timezone.now() + dt.timedelta(minutes=1),
        finished_at=None,
    )
    StepRecord.objects.filter(execution_id=stuck_run, step="slow").delete()
    StepRecord.objects.filter(execution_id=stuck_run).update(finished_at=hour_ago)
    ExecutionEvent.objects.filter(execution_id=stuck_run).update(at=hour_ago)
    # ... and another whose process died ten minutes ago.
    Execution.objects.filter(pk=expired_run).update(
        status=ExecutionStatus.RUNNING,
        current_step="slow",
        lease_owner="worker-2",
        lease_expires_at=timezone.now() - dt.timedelta(minutes=10),
        finished_at=None,
    )
    stuck = services.stuck_runs()
    assert [(s.execution_id, s.kind) for s in stuck] == [
        (expired_run, "lease_expired"),
        (stuck_run, "past_timeout"),
    ]
    assert stuck[1].timeout == 60
    out = StringIO()
    call_command("reactor_list", "--stuck", "--no-color", stdout=out)
    text = out.getvalue()
    assert str(stuck_run) in text
    assert "longer than its timeout (1 min 00 s)" in text
    assert "its lease expired 10 min " in text
    assert "ago (owner worker-2)" in text


def test_a_deadline_stops_a_run_waiting_for_its_map_and_its_unit(reactor_clock: Any) -> None:
    from django_reactor import async_step, map_over
    from django_reactor.models import MapRun

    class Waits(Reactor):
        unit = async_step(lambda: "unit")
        lines = map_over(arg.value([1, 2, 3]), lambda item: item, item=arg.element(), fan_out=True)

        @step(unit=arg.result("unit"), lines=arg.result("lines"))
        def total(unit: Any, lines: Any) -> str:
            return "total"

        class Meta:
            deadline = dt.timedelta(minutes=30)

    outcome = Waits.run({})  # no worker runs the unit or the map's elements: the run waits
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.PENDING
    assert row.wake_at <= row.deadline_at
    reactor_clock.advance(minutes=31)
    row.refresh_from_db()
    assert row.status in (ExecutionStatus.FAILED, ExecutionStatus.ROLLING_BACK)
    assert row.failure["kind"] == "deadline"
    found = MapRun.objects.get(execution_id=row.id)
    assert found.stop_reason == "cancelled"  # stopped: no element starts any more
    assert found.succeeded == 0
    assert "while the run waited for step 'lines'" in row.failure["message"]


def test_the_clock_makes_a_schedule_fire(reactor_clock: Any) -> None:
    from django_reactor.models import ScheduleFire

    class Nightly(Reactor):
        a = step(lambda: ledger("run", "nightly"))

    schedule = services.schedules.create(Nightly, cron="0 2 * * *", timezone="UTC")
    assert not ScheduleFire.objects.filter(schedule_id=schedule.id).exists()
    reactor_clock.advance(days=1)
    fires = list(ScheduleFire.objects.filter(schedule_id=schedule.id))
    assert len(fires) == 1
    assert ledger.calls == [("run", "nightly")]


def test_a_deadline_stops_a_run_waiting_for_a_retrys_backoff(reactor_clock: Any) -> None:
    from django_reactor import Retry

    class Flaky(Step):
        retry = Retry(attempts=5, delay=3600)

        def run(self) -> str:
            ledger("run", "flaky")
            raise RuntimeError("the partner is down")

        def compensate(self, error: Any) -> None:
            ledger("compensate", "flaky")

    class Backs(Reactor):
        flaky = step(Flaky)

        class Meta:
            background = "all"
            deadline = dt.timedelta(minutes=10)

    outcome = Backs.run({})
    reactor_clock.tick()  # a worker runs the first attempt; the retry waits an hour
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.PENDING
    assert row.wake_at <= row.deadline_at  # it wakes at the deadline, not in an hour
    reactor_clock.advance(minutes=11)
    row.refresh_from_db()
    assert row.status == ExecutionStatus.FAILED
    assert row.failure["kind"] == "deadline"
    # Its failed attempt had started its work: compensated.
    assert ledger.calls == [("run", "flaky"), ("compensate", "flaky")]
