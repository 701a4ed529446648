"""Schedules through ``services.schedules``: creating them, and what the sweeper's
``fire_due`` does with their ticks (catch-up, overlap, clock jumps, daylight saving time).

Time is simulated without sleeping: a schedule's next fire time is moved (the
``make_schedules_due`` helper) and ``fire_due(now=...)`` is told what time it is.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any
from unittest import mock
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from django_reactor import services, store
from django_reactor.exceptions import InvalidSchedule, ScheduleNotFound
from django_reactor.models import Execution, Schedule, ScheduleFire
from django_reactor.services.schedules import idempotency_key
from django_reactor.states import ExecutionStatus
from django_reactor.store import outbox
from django_reactor.testing import make_schedules_due
from tests.helpers import ledger
from tests.schedules import reactors
from tests.schedules.reactors import Held, NightlyReport

pytestmark = pytest.mark.django_db

UTC = dt.UTC
BERLIN = ZoneInfo("Europe/Berlin")
#: A tick of every hourly interval schedule (a multiple of one hour since the epoch).
T = dt.datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
LATE = dt.timedelta(seconds=5)  # how late a timely sweep comes


def hourly(**options: Any) -> Any:
    """An hourly schedule of NightlyReport whose next tick is ``T``."""
    options.setdefault("overlap", "allow")
    schedule = services.schedules.create(
        NightlyReport, every="1h", inputs={"region": "eu"}, **options
    )
    make_schedules_due(schedule, now=T)
    return services.schedules.get(schedule.id)


def fires(schedule: Any) -> list[tuple[dt.datetime, dt.datetime | None, str]]:
    rows = ScheduleFire.objects.filter(schedule_id=schedule.id).order_by("fire_at")
    return [(f.fire_at, f.until, f.outcome) for f in rows]


def runs(schedule: Any) -> list[Execution]:
    ids = ScheduleFire.objects.filter(schedule_id=schedule.id, execution__isnull=False)
    return list(Execution.objects.filter(pk__in=ids.values("execution_id")).order_by("created_at"))


# ---------------------------------------------------------------------------- creating


def test_a_schedule_is_created_with_its_next_fire_in_its_time_zone() -> None:
    schedule = services.schedules.create(
        "tests.schedules.reactors.NightlyReport",
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        inputs={"region": "us", "limit": 3},
        name="nightly-us",
    )
    assert (schedule.name, schedule.reactor, schedule.cron, schedule.every) == (
        "nightly-us",
        "tests.schedules.reactors.NightlyReport",
        "30 2 * * *",
        None,
    )
    assert (schedule.catch_up, schedule.overlap, schedule.enabled) == ("once", "skip", True)
    local = schedule.next_fire_at.astimezone(BERLIN)
    assert (local.hour, local.minute) in {(2, 30), (3, 0)}  # 03:00 on a spring-forward day
    assert schedule.last_fire_at is None
    assert [s.name for s in services.schedules.list()] == ["nightly-us"]
    assert services.schedules.get("nightly-us") == services.schedules.get(schedule.id)
    assert services.schedules.get(str(schedule.id)).name == "nightly-us"


def test_a_name_is_made_up_when_none_is_given() -> None:
    schedule = services.schedules.create(NightlyReport, every=60, inputs={"region": "eu"})
    assert schedule.name.startswith("NightlyReport-")
    assert schedule.every == dt.timedelta(minutes=1)
    assert schedule.timezone == "UTC"  # settings.TIME_ZONE


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"reactor": "no.such.Reactor", "cron": "0 2 * * *"}, "reactor", "no reactor named"),
        ({"cron": "0 25 * * *"}, "cron", "not a cron expression"),
        ({"cron": "0 2 * *"}, "cron", "has 4 fields"),
        ({"cron": "0 2 * * *", "timezone": "Europe/Atlantis"}, "timezone", "not a time zone"),
        ({}, "cron", "give a cron expression"),
        ({"cron": "0 2 * * *", "every": "1h"}, "every", "not both"),
        ({"every": "often"}, "every", "not an interval"),
        ({"every": "3000000d"}, "every", "an interval is 2.592e+11 s (about 8,214 years), longer"),
        ({"every": 1e15}, "every", "longer than a date can hold"),
        ({"every": float("inf")}, "every", "an interval cannot be infinite"),
        ({"every": dt.timedelta(days=999999999)}, "every", "longer than a date can hold"),
        ({"every": "1h", "inputs": {"region": "mars"}}, "inputs", "region:"),
        ({"every": "1h", "inputs": {"region": "eu", "limit": 0}}, "inputs", "limit:"),
        ({"every": "1h", "inputs": ["eu"]}, "inputs", "must be a JSON object"),
        ({"every": "1h", "catch_up": "sometimes"}, "catch_up", "not one of skip, once, all"),
        ({"every": "1h", "overlap": "never"}, "overlap", "not one of allow, skip, queue"),
        ({"every": "1h", "name": "42"}, "name", "not a number"),
    ],
)
def test_each_bad_field_is_refused_by_name_and_nothing_is_written(
    options: dict[str, Any], field: str, message: str
) -> None:
    options = {"reactor": NightlyReport, "inputs": {"region": "eu"}, **options}
    with pytest.raises(InvalidSchedule) as refused:
        services.schedules.create(options.pop("reactor"), **options)
    assert field in refused.value.errors
    assert message in " ".join(refused.value.errors[field])
    assert Schedule.objects.count() == 0


def test_several_bad_fields_are_reported_together() -> None:
    with pytest.raises(InvalidSchedule) as refused:
        services.schedules.create(
            NightlyReport, cron="nope", timezone="Nowhere/Town", inputs={"region": "mars"}
        )
    assert set(refused.value.errors) == {"cron", "timezone", "inputs"}


def test_a_name_is_unique() -> None:
    services.schedules.create(NightlyReport, every="1h", inputs={"region": "eu"}, name="n")
    with pytest.raises(InvalidSchedule, match="another schedule is named 'n'"):
        services.schedules.create(NightlyReport, every="2h", inputs={"region": "eu"}, name="n")


def test_an_unknown_schedule_is_not_found() -> None:
    with pytest.raises(ScheduleNotFound):
        services.schedules.get("nope")
    with pytest.raises(ScheduleNotFound):
        services.schedules.pause(12345)


# ---------------------------------------------------------------------------- firing


def test_a_due_tick_starts_one_background_run_keyed_by_the_tick() -> None:
    schedule = hourly()
    report = services.schedules.fire_due(now=T + LATE)
    assert report.as_dict() == {"started": 1, "queued": 0, "skipped": 0, "refused": 0}
    [fire] = ScheduleFire.objects.filter(schedule_id=schedule.id)
    assert (fire.fire_at, fire.outcome, fire.manual) == (T, "started", False)
    run = Execution.objects.get(pk=fire.execution_id)
    assert run.status == ExecutionStatus.PENDING  # a worker runs it
    assert run.idempotency_key == f"schedule:{schedule.id}:2030-01-07T09:00:00+00:00"
    assert run.idempotency_key == idempotency_key(schedule.id, T)
    assert run.inputs == {"region": "eu", "limit": 10}  # validated by the reactor
    assert run.dispatches.get().reason == "start"
    after = services.schedules.get(schedule.id)
    assert (after.next_fire_at, after.last_fire_at) == (T + HOUR, T)
    assert after.last_execution_id == run.id
    # The same moment again: nothing more is due.
    assert services.schedules.fire_due(now=T + LATE).as_dict()["started"] == 0
    assert services.schedules.fire_due(now=T + HOUR + LATE).started == 1
    assert [f[0] for f in fires(schedule)] == [T, T + HOUR]
    services.resume(run.id)
    assert ledger.calls == [("run", "report:eu")]


def test_the_sweep_fires_due_schedules() -> None:
    schedule = services.schedules.create(NightlyReport, every="1h", inputs={"region": "eu"})
    assert services.sweep().fired == 0  # its first tick is to come
    make_schedules_due(schedule)
    assert services.sweep().fired == 1
    assert services.sweep().fired == 0
    assert len(runs(schedule)) == 1


def test_a_paused_schedule_does_not_fire_and_resumes_from_the_next_tick() -> None:
    schedule = hourly()
    paused = services.schedules.pause(schedule)
    assert (paused.enabled, paused.next_fire_at) == (False, None)
    assert services.schedules.pause(schedule.id).enabled is False  # again: no change
    assert make_schedules_due(schedule, now=T) == 0  # paused schedules have no next tick
    assert services.schedules.fire_due(now=T + 3 * HOUR).as_dict()["started"] == 0
    resumed = services.schedules.resume(schedule.name)
    assert resumed.enabled
    assert resumed.next_fire_at > dt.datetime.now(UTC)  # from now on, nothing caught up
    assert fires(schedule) == []


def test_run_now_starts_a_run_at_once_paused_or_not() -> None:
    schedule = hourly()
    services.schedules.pause(schedule)
    first = services.schedules.run_now(schedule)
    second = services.schedules.run_now(schedule.name)
    assert (first.outcome, first.manual, second.outcome) == ("started", True, "started")
    assert first.execution_id != second.execution_id  # overlap does not apply to run now
    assert first.note == "run now"
    run = Execution.objects.get(pk=second.execution_id)
    assert run.idempotency_key == idempotency_key(schedule.id, second.fire_at)
    assert services.schedules.get(schedule.id).last_execution_id == second.execution_id


def test_inputs_the_reactor_refuses_at_fire_time_are_recorded_not_run() -> None:
    schedule = hourly()
    Schedule.objects.filter(pk=schedule.id).update(inputs={"region": "mars"})
    assert services.schedules.fire_due(now=T + LATE).refused == 1
    [fire] = ScheduleFire.objects.filter(schedule_id=schedule.id)
    assert (fire.outcome, fire.execution_id) == ("refused", None)
    assert "region" in fire.note
    assert Execution.objects.count() == 0
    assert services.schedules.get(schedule.id).next_fire_at == T + HOUR  # it goes on ticking


def test_a_reactor_gone_from_the_code_is_recorded_refused() -> None:
    schedule = hourly()
    Schedule.objects.filter(pk=schedule.id).update(reactor="gone.reactors.Vanished")
    services.schedules.fire_due(now=T + LATE)
    [fire] = ScheduleFire.objects.filter(schedule_id=schedule.id)
    assert fire.outcome == "refused"
    assert "gone.reactors.Vanished" in fire.note


def test_a_sweep_whose_time_is_up_handles_one_batch_of_fires(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "SWEEP_BATCH": 3}
    schedules = [hourly(name=f"s{i}") for i in range(5)]
    spent = store.Rounds(0)
    assert services.schedules.fire_due(now=T + LATE, rounds=spent).started == 3
    assert spent.cut_short
    assert services.schedules.fire_due(now=T + LATE).started == 2
    assert all(len(runs(s)) == 1 for s in schedules)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_full_batches_of_fires_go_on_at_once_each_published_once_it_commits(
    settings: Any,
) -> None:
    settings.REACTOR = {**settings.REACTOR, "SWEEP_BATCH": 3}
    schedules = [hourly(name=f"s{i}") for i in range(7)]
    # The most overdue first: s6's tick came a second before the others'.
    make_schedules_due(*schedules[:6], now=T + dt.timedelta(seconds=2))
    make_schedules_due(schedules[6], now=T + dt.timedelta(seconds=1))
    committed: list[int] = []

    class Capture:
        def publish(self, dispatches: Any) -> list[int]:
            # What is committed when a run's task goes out.
            committed.append(ScheduleFire.objects.filter(execution__isnull=False).count())
            return []

    previous = outbox.register_publisher(Capture())
    try:
        report = services.schedules.fire_due(now=T + LATE)
    finally:
        outbox.register_publisher(previous[0], after_commit=previous[1])
    assert report.started == 7
    assert report.next_due_at == T + HOUR
    # One transaction per batch of three schedules, its runs published once it committed,
    # before the next batch.
    assert committed == [3, 3, 3, 6, 6, 6, 7]
    first = ScheduleFire.objects.order_by("id")[:3]
    assert schedules[6].id in {f.schedule_id for f in first}
    assert all(len(runs(s)) == 1 for s in schedules)


def test_update_moves_the_next_fire_and_refuses_bad_values() -> None:
    schedule = hourly()
    with pytest.raises(InvalidSchedule):
        services.schedules.update(schedule, cron="0 3 * * *")  # and every: both
    changed = services.schedules.update(schedule, cron="0 3 * * *", every=None, timezone="UTC")
    assert (changed.cron, changed.every) == ("0 3 * * *", None)
    assert changed.next_fire_at.astimezone(UTC).hour == 3
    assert services.schedules.update(schedule, name="renamed").name == "renamed"
    assert services.schedules.get("renamed").next_fire_at == changed.next_fire_at


def test_remove_deletes_the_schedule_and_its_fires_but_not_its_runs() -> None:
    schedule = hourly(overlap="queue")
    services.schedules.fire_due(now=T + LATE)
    services.schedules.fire_due(now=T + HOUR + LATE)  # queued behind the first run
    assert services.schedules.get(schedule.id).queued_fire_id is not None
    services.schedules.remove(schedule.name)
    assert Schedule.objects.count() == ScheduleFire.objects.count() == 0
    assert Execution.objects.count() == 1
    with pytest.raises(ScheduleNotFound):
        services.schedules.remove(schedule.id)


def test_a_deleted_run_leaves_its_fire_recorded() -> None:
    schedule = hourly()
    services.schedules.fire_due(now=T + LATE)
    Execution.objects.all().delete()  # as reactor_prune does
    assert fires(schedule) == [(T, None, "started")]
    assert services.schedules.get(schedule.id).last_execution_id is None


# ---------------------------------------------------------------------------- catch-up


def test_catch_up_skip_records_the_missed_ticks_and_fires_only_the_timely_one() -> None:
    schedule = hourly(catch_up="skip")
    assert services.schedules.fire_due(now=T + 4 * HOUR + LATE).as_dict() == {
        "started": 1,
        "queued": 0,
        "skipped": 1,
        "refused": 0,
    }
    assert fires(schedule) == [(T, T + 3 * HOUR, "skipped"), (T + 4 * HOUR, None, "started")]
    skipped = ScheduleFire.objects.get(schedule_id=schedule.id, outcome="skipped")
    assert "catch-up: skip" in skipped.note
    assert services.schedules.get(schedule.id).next_fire_at == T + 5 * HOUR


def test_catch_up_skip_with_no_timely_tick_runs_nothing() -> None:
    schedule = hourly(catch_up="skip")
    services.schedules.fire_due(now=T + 2 * HOUR + dt.timedelta(minutes=30))
    assert fires(schedule) == [(T, T + 2 * HOUR, "skipped")]
    assert runs(schedule) == []
    # Only future ticks fire.
    services.schedules.fire_due(now=T + 3 * HOUR + LATE)
    assert fires(schedule)[-1] == (T + 3 * HOUR, None, "started")


def test_a_single_late_tick_is_skipped_by_skip_and_run_by_once() -> None:
    skip = hourly(catch_up="skip", name="skip")
    once = hourly(catch_up="once", name="once")
    services.schedules.fire_due(now=T + dt.timedelta(minutes=10))
    assert fires(skip) == [(T, None, "skipped")]
    assert fires(once) == [(T, None, "started")]


def test_catch_up_once_runs_once_for_all_missed_ticks_at_the_latest() -> None:
    schedule = hourly(catch_up="once")
    services.schedules.fire_due(now=T + 4 * HOUR + dt.timedelta(minutes=30))
    assert fires(schedule) == [(T, T + 3 * HOUR, "skipped"), (T + 4 * HOUR, None, "started")]
    [run] = runs(schedule)
    assert run.idempotency_key == idempotency_key(schedule.id, T + 4 * HOUR)


def test_catch_up_all_runs_every_missed_tick() -> None:
    schedule = hourly(catch_up="all")
    report = services.schedules.fire_due(now=T + 4 * HOUR + LATE)
    assert report.started == 5
    assert fires(schedule) == [(T + n * HOUR, None, "started") for n in range(5)]
    keys = {r.idempotency_key for r in runs(schedule)}
    assert keys == {idempotency_key(schedule.id, T + n * HOUR) for n in range(5)}


def test_catch_up_all_is_bounded_by_the_catch_up_limit(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "SCHEDULE_CATCH_UP_LIMIT": 3}
    schedule = hourly(catch_up="all")
    services.schedules.fire_due(now=T + 9 * HOUR + dt.timedelta(minutes=30))
    assert fires(schedule) == [
        (T, T + 6 * HOUR, "skipped"),
        (T + 7 * HOUR, None, "started"),
        (T + 8 * HOUR, None, "started"),
        (T + 9 * HOUR, None, "started"),
    ]
    assert "SCHEDULE_CATCH_UP_LIMIT" in ScheduleFire.objects.get(outcome="skipped").note


def test_a_clock_jump_forwards_is_a_catch_up() -> None:
    schedule = hourly(catch_up="once")
    services.schedules.fire_due(now=T + LATE)
    # The host's clock jumps a day ahead: 23 ticks were missed, one run covers them.
    services.schedules.fire_due(now=T + 24 * HOUR + dt.timedelta(minutes=20))
    assert fires(schedule) == [
        (T, None, "started"),
        (T + HOUR, T + 23 * HOUR, "skipped"),
        (T + 24 * HOUR, None, "started"),
    ]


def test_a_clock_jump_backwards_never_fires_a_tick_again() -> None:
    schedule = hourly()
    services.schedules.fire_due(now=T + LATE)
    # The clock goes back two hours: nothing is due.
    assert services.schedules.fire_due(now=T - 2 * HOUR).as_dict()["started"] == 0
    # Resumed while the clock is behind: the next fire stays after the latest tick handled.
    services.schedules.pause(schedule)
    with mock.patch("django.utils.timezone.now", return_value=T - 2 * HOUR):
        resumed = services.schedules.resume(schedule)
    assert resumed.next_fire_at == T + HOUR
    # A host whose clock is behind moves the next fire back onto the tick that fired.
    make_schedules_due(schedule, now=T)
    assert services.schedules.fire_due(now=T + LATE).as_dict()["started"] == 0
    assert fires(schedule) == [(T, None, "started")]
    assert len(runs(schedule)) == 1
    # The schedule is not stuck there: it moves on at the next tick.
    make_schedules_due(schedule, now=T)
    services.schedules.fire_due(now=T + HOUR + LATE)
    assert fires(schedule) == [(T, None, "started"), (T + HOUR, None, "started")]


# ---------------------------------------------------------------------------- overlap


def test_overlap_allow_starts_another_run_while_the_previous_one_is_pending() -> None:
    schedule = hourly(overlap="allow")
    services.schedules.fire_due(now=T + LATE)
    services.schedules.fire_due(now=T + HOUR + LATE)
    assert [f[2] for f in fires(schedule)] == ["started", "started"]


def test_overlap_skip_records_the_tick_skipped_until_the_previous_run_finishes() -> None:
    schedule = hourly(overlap="skip")
    services.schedules.fire_due(now=T + LATE)
    services.schedules.fire_due(now=T + HOUR + LATE)
    assert [f[2] for f in fires(schedule)] == ["started", "skipped"]
    assert "has not finished (overlap: skip)" in ScheduleFire.objects.get(outcome="skipped").note
    [first] = runs(schedule)
    assert services.resume(first.id).ok
    services.schedules.fire_due(now=T + 2 * HOUR + LATE)
    assert [f[2] for f in fires(schedule)] == ["started", "skipped", "started"]


def test_overlap_queue_keeps_one_tick_and_starts_it_when_the_previous_run_finishes() -> None:
    schedule = hourly(overlap="queue")
    services.schedules.fire_due(now=T + LATE)
    services.schedules.fire_due(now=T + HOUR + LATE)
    services.schedules.fire_due(now=T + 2 * HOUR + LATE)  # one is queued already
    assert [f[2] for f in fires(schedule)] == ["started", "queued", "skipped"]
    assert "overlap: queue keeps one" in fires_notes(schedule)[2]
    # Not before the previous run finished.
    assert services.schedules.fire_due(now=T + 2 * HOUR + LATE).started == 0
    [first] = runs(schedule)
    assert services.resume(first.id).ok
    report = services.schedules.fire_due(now=T + 2 * HOUR + LATE)
    assert report.started == 1
    assert [f[2] for f in fires(schedule)] == ["started", "started", "skipped"]
    second = ScheduleFire.objects.get(schedule_id=schedule.id, fire_at=T + HOUR)
    run = Execution.objects.get(pk=second.execution_id)
    assert run.idempotency_key == idempotency_key(schedule.id, T + HOUR)  # the queued tick's
    assert services.schedules.get(schedule.id).queued_fire_id is None


def test_pausing_drops_a_queued_tick() -> None:
    schedule = hourly(overlap="queue")
    services.schedules.fire_due(now=T + LATE)
    services.schedules.fire_due(now=T + HOUR + LATE)
    services.schedules.pause(schedule)
    assert [f[2] for f in fires(schedule)] == ["started", "skipped"]
    assert "paused" in fires_notes(schedule)[1]


def fires_notes(schedule: Any) -> list[str]:
    rows = ScheduleFire.objects.filter(schedule_id=schedule.id).order_by("fire_at")
    return [f.note for f in rows]


@pytest.fixture
def captured_publisher() -> Any:
    """Tasks go nowhere: the tests resume the runs themselves."""

    class Capture:
        def publish(self, dispatches: Any) -> list[int]:
            return []

    previous = outbox.register_publisher(Capture())
    yield
    outbox.register_publisher(previous[0], after_commit=previous[1])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("overlap", ["skip", "queue"])
def test_a_tick_while_the_previous_run_is_running_in_another_thread(
    overlap: str, captured_publisher: Any
) -> None:
    reactors.RELEASE.clear()
    reactors.STARTED.clear()
    schedule = services.schedules.create(Held, every="1h", overlap=overlap)
    make_schedules_due(schedule, now=T)
    services.schedules.fire_due(now=T + LATE)
    [first] = runs(schedule)
    outcomes: list[Any] = []

    def worker() -> None:
        try:
            outcomes.append(services.resume(first.id))
        finally:
            connections.close_all()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert reactors.STARTED.wait(timeout=30), "the first run never started"
        assert Execution.objects.get(pk=first.id).status == ExecutionStatus.RUNNING
        services.schedules.fire_due(now=T + HOUR + LATE)
        expected = "skipped" if overlap == "skip" else "queued"
        assert [f[2] for f in fires(schedule)] == ["started", expected]
        # Still running: a queued tick waits.
        assert services.schedules.fire_due(now=T + HOUR + LATE).started == 0
    finally:
        reactors.RELEASE.set()
        thread.join(timeout=60)
    assert outcomes
    assert outcomes[0].ok
    services.schedules.fire_due(now=T + HOUR + 2 * LATE)
    expected_after = ["started", "skipped"] if overlap == "skip" else ["started", "started"]
    assert [f[2] for f in fires(schedule)] == expected_after


# ---------------------------------------------------------------------------- DST


def fire_through(schedule: Any, days: int) -> list[dt.datetime]:
    """Sweep a few seconds after each of the schedule's next ``days`` ticks."""
    for _ in range(days):
        next_fire = services.schedules.get(schedule.id).next_fire_at
        services.schedules.fire_due(now=next_fire + LATE)
    return [f[0] for f in fires(schedule)]


def test_a_0230_berlin_schedule_across_the_spring_forward_day() -> None:
    schedule = services.schedules.create(
        NightlyReport,
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        inputs={"region": "eu"},
        overlap="allow",
    )
    make_schedules_due(schedule, now=dt.datetime(2025, 3, 29, 2, 30, tzinfo=BERLIN))
    fired = fire_through(schedule, 3)
    assert [t.astimezone(BERLIN).strftime("%d %H:%M %Z") for t in fired] == [
        "29 02:30 CET",
        "30 03:00 CEST",  # 02:30 does not exist that day: right after the jump
        "31 02:30 CEST",
    ]
    assert len(runs(schedule)) == 3


def test_a_0230_berlin_schedule_fires_once_on_the_fall_back_day() -> None:
    schedule = services.schedules.create(
        NightlyReport,
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        inputs={"region": "eu"},
        overlap="allow",
    )
    make_schedules_due(schedule, now=dt.datetime(2025, 10, 25, 2, 30, tzinfo=BERLIN))
    fired = fire_through(schedule, 3)
    assert [t.astimezone(BERLIN).strftime("%d %H:%M %Z") for t in fired] == [
        "25 02:30 CEST",
        "26 02:30 CEST",  # not again at 02:30 CET, an hour later
        "27 02:30 CET",
    ]


# ---------------------------------------------------------------------------- the query


@pytest.mark.postgres
def test_due_schedules_are_found_through_the_partial_index() -> None:
    hourly()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        with CaptureQueriesContext(connection) as queries:
            services.schedules.fire_due(now=T - HOUR)  # nothing due: one query
        [due] = [q["sql"] for q in queries.captured_queries if "next_fire_at" in q["sql"]][:1]
        cursor.execute("EXPLAIN " + due)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "reactor_schedule_due_idx" in plan, plan


def test_secret_inputs_are_masked_for_display_and_kept_through_an_edit() -> None:
    schedule = services.schedules.create(
        "testproject.example.reactors.RenewDueSubscriptions",
        cron="@daily",
        inputs={"due_by": "2030-01-01", "card_token": "tok_live_1"},
    )
    shown = services.schedules.shown_inputs(schedule)
    assert shown == {"due_by": "2030-01-01", "card_token": "[REDACTED]"}
    edited = {**shown, "due_by": "2030-02-01"}
    kept = services.schedules.keep_secrets(schedule, edited)
    assert kept == {"due_by": "2030-02-01", "card_token": "tok_live_1"}
    replaced = services.schedules.keep_secrets(schedule, {**edited, "card_token": "tok_2"})
    assert replaced["card_token"] == "tok_2"


def test_a_schedule_that_cannot_fire_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = hourly(name="broken")
    fine = hourly(name="fine")
    Schedule.objects.filter(pk=broken.id).update(cron="not a cron", every=None)
    assert services.schedules.fire_due(now=T + LATE).started == 1
    assert fires(broken) == []
    assert fires(fine) == [(T, None, "started")]
    assert "schedule" in caplog.text
    assert "cannot fire" in caplog.text


def test_an_inputs_serializer_that_raises_is_recorded_refused() -> None:
    schedule = hourly()
    with mock.patch(
        "django_reactor.services.runs.validated_inputs", side_effect=RuntimeError("boom")
    ):
        assert services.schedules.fire_due(now=T + LATE).refused == 1
    [fire] = ScheduleFire.objects.filter(schedule_id=schedule.id)
    assert fire.note == "the Inputs serializer raised RuntimeError: boom"


@pytest.mark.django_db(transaction=True)
def test_a_fire_and_its_run_commit_together_or_not_at_all(captured_publisher: Any) -> None:
    schedule = hourly()

    def broken_insert(**fields: Any) -> Any:
        raise RuntimeError("the database refused the run")

    with (
        mock.patch("django_reactor.store.create_execution", side_effect=broken_insert),
        pytest.raises(RuntimeError, match="refused the run"),
    ):
        services.schedules.fire_due(now=T + LATE)
    # Nothing of the tick stayed: no fire, no run, and the tick is still due.
    assert ScheduleFire.objects.count() == 0
    assert Execution.objects.count() == 0
    assert services.schedules.get(schedule.id).next_fire_at == T
    assert services.schedules.fire_due(now=T + LATE).started == 1
    assert fires(schedule) == [(T, None, "started")]


# ---------------------------------------------------------------------------- upcoming fires


def test_upcoming_lists_the_next_fires_as_the_sweeper_will_fire_them() -> None:
    schedule = hourly()
    assert services.schedules.upcoming(schedule, 4) == (T, T + HOUR, T + 2 * HOUR, T + 3 * HOUR)
    # The first is the next fire itself, and the sweeper fires exactly those ticks.
    services.schedules.fire_due(now=T + LATE)
    after = services.schedules.get(schedule.id)
    assert services.schedules.upcoming(after, 2) == (T + HOUR, T + 2 * HOUR)


def test_upcoming_fires_of_a_cron_schedule_follow_daylight_saving_time() -> None:
    nightly = services.schedules.create(
        NightlyReport, cron="30 2 * * *", timezone="Europe/Berlin", inputs={"region": "eu"}
    )
    spring = dt.datetime(2030, 3, 29, 12, 0, tzinfo=BERLIN).astimezone(UTC)  # before the jump
    Schedule.objects.filter(pk=nightly.id).update(
        next_fire_at=dt.datetime(2030, 3, 30, 2, 30, tzinfo=BERLIN).astimezone(UTC)
    )
    fired = services.schedules.upcoming(nightly.id, 3)
    local = [moment.astimezone(BERLIN).strftime("%m-%d %H:%M") for moment in fired]
    # 2030-03-31: 02:30 does not exist in Berlin; it fires at 03:00, once.
    assert local == ["03-30 02:30", "03-31 03:00", "04-01 02:30"]
    assert fired[0] > spring


def test_a_paused_schedule_has_no_upcoming_fires() -> None:
    schedule = hourly()
    services.schedules.pause(schedule)
    assert services.schedules.upcoming(schedule.id) == ()
