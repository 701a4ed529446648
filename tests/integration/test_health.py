"""The fleet's health: workers' and sweepers' heartbeats written and read, a stopped sweeper or
worker noticed within three intervals, overdue wake-ups, dispatches not taken, and each
reactor's last hour."""

from __future__ import annotations

import datetime as dt
import os
import socket
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_reactor import Reactor, Rescheduled, services, sleep, step
from django_reactor.conf import reactor_settings
from django_reactor.models import Dispatch, Execution, ProcessHeartbeat
from django_reactor.services.health import beat_worker as record_beat
from django_reactor.services.health import forget_worker, sweeping_every, waiting_warnings
from django_reactor.states import ExecutionStatus
from django_reactor.store import SweepReport
from tests.shapes import keep_shape

# A database server (PostgreSQL, and MariaDB in its pass), not SQLite.
pytestmark = [pytest.mark.postgres, pytest.mark.mariadb, pytest.mark.django_db(transaction=True)]

HOST, PID = socket.gethostname(), os.getpid()


class Nap(Reactor):
    """One step, then a long sleep."""

    @step()
    def first() -> str:
        return "done"

    nap = sleep(dt.timedelta(hours=1), after=["first"])


def beat_worker(**fields: Any) -> None:
    record_beat(
        name=fields.pop("name", "w1@host"),
        queues=fields.pop("queues", ["reactor"]),
        concurrency=fields.pop("concurrency", 4),
        tasks_done=fields.pop("tasks_done", 7),
        started_at=fields.pop("started_at", timezone.now()),
    )


def age(role: str, seconds: float) -> None:
    """Make the process's last heartbeat ``seconds`` old (the process stopped then)."""
    moved = ProcessHeartbeat.objects.filter(role=role).update(
        last_seen_at=timezone.now() - dt.timedelta(seconds=seconds)
    )
    assert moved == 1


def test_a_sweep_records_its_heartbeat_with_what_it_did() -> None:
    first = services.sweep()
    row = ProcessHeartbeat.objects.get()
    assert (row.role, row.host, row.pid) == ("sweeper", HOST, PID)
    assert row.last_sweep == first.as_dict()
    assert set(row.last_sweep) == set(SweepReport().as_dict())
    assert row.last_sweep_seconds is not None
    assert 0 <= row.last_sweep_seconds < 60
    assert row.interval == reactor_settings.SWEEP_INTERVAL
    assert row.last_sweep_at == row.last_seen_at

    with sweeping_every(7.5):  # reactor_sweep --loop --interval 7.5
        services.sweep()
    again = ProcessHeartbeat.objects.get()  # one row per process, updated
    assert again.pk == row.pk
    assert again.started_at == row.started_at
    assert again.last_seen_at > row.last_seen_at
    assert again.interval == 7.5


def test_a_sweep_whose_heartbeat_cannot_be_written_still_sweeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(**kwargs: Any) -> None:
        raise RuntimeError("database refused the heartbeat")

    monkeypatch.setattr("django_reactor.store.health.beat", refuse)
    assert isinstance(services.sweep(), SweepReport)
    assert not ProcessHeartbeat.objects.exists()


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the statement is PostgreSQL's INSERT ... ON CONFLICT"
)
def test_a_worker_heartbeat_is_one_statement_and_is_read_back() -> None:
    with CaptureQueriesContext(connection) as queries:
        beat_worker(tasks_done=3)
    statements = [q["sql"] for q in queries.captured_queries]
    assert [s for s in statements if s not in ("BEGIN", "COMMIT")] == [statements[-2]]
    assert statements[-2].startswith("INSERT INTO")
    assert "ON CONFLICT" in statements[-2]
    beat_worker(tasks_done=11)
    [worker] = services.fleet_health().workers
    assert (worker.host, worker.pid, worker.name) == (HOST, PID, "w1@host")
    assert worker.queues == ["reactor"]
    assert worker.concurrency == 4
    assert worker.tasks_done == 11
    assert worker.alive
    assert worker.stale_after == 3 * reactor_settings.HEARTBEAT_INTERVAL
    forget_worker()
    assert services.fleet_health().workers == []


def test_a_fleet_with_a_fresh_worker_and_sweeper_and_no_late_work_is_healthy() -> None:
    beat_worker()
    services.sweep()
    report = services.fleet_health()
    assert report.problems == []
    assert report.healthy
    assert report.workers_alive == 1
    assert report.sweeper_ok
    data = report.as_dict()
    assert data["healthy"] is True
    assert data["workers_alive"] == 1
    assert data["sweepers"][0]["last_sweep"] == SweepReport().as_dict()


def test_a_stopped_sweeper_turns_unhealthy_past_three_intervals() -> None:
    beat_worker()
    services.sweep()
    interval = reactor_settings.SWEEP_INTERVAL
    age("sweeper", 2.5 * interval)
    assert services.fleet_health().sweeper_ok  # late, within three intervals

    age("sweeper", 3 * interval + 5)
    report = services.fleet_health()
    assert not report.sweeper_ok
    assert not report.healthy
    assert report.sweeper is not None
    assert not report.sweeper.alive
    [problem] = report.problems
    assert problem.startswith("no sweeper has run for ")
    assert f"(the last on {HOST}, pid {PID})" in problem
    assert "start `python manage.py reactor_sweep --loop` or Celery beat" in problem


def test_no_sweeper_at_all_is_unhealthy() -> None:
    beat_worker()
    report = services.fleet_health()
    assert report.sweeper is None
    assert report.problems == [
        "no sweeper has run in the last day: start `python manage.py reactor_sweep --loop` "
        "or Celery beat"
    ]


def test_a_worker_unseen_for_three_heartbeat_intervals_is_gone() -> None:
    services.sweep()
    beat_worker()
    interval = reactor_settings.HEARTBEAT_INTERVAL
    age("worker", 2 * interval)
    assert services.fleet_health().workers_alive == 1

    age("worker", 3 * interval + 5)
    report = services.fleet_health()
    assert report.workers_alive == 0
    [problem] = report.problems
    assert problem.startswith("no worker is alive: the last one (w1@host, pid ")
    assert "start a Celery worker" in problem


def test_overdue_wake_ups_are_counted_past_two_sweep_intervals() -> None:
    beat_worker()
    services.sweep()
    late, early = Nap.run({}), Nap.run({})
    assert isinstance(late, Rescheduled)
    assert isinstance(early, Rescheduled)
    assert services.fleet_health().overdue.value == 0  # their wake-ups are an hour away

    now = timezone.now()
    interval = reactor_settings.SWEEP_INTERVAL
    Execution.objects.filter(pk=late.execution_id).update(wake_at=now - dt.timedelta(minutes=5))
    # Due, but by less than two sweep intervals: the next sweep takes it.
    Execution.objects.filter(pk=early.execution_id).update(
        wake_at=now - dt.timedelta(seconds=interval / 2)
    )
    age("sweeper", 0)  # the sweeper is alive: the late wake-up alone is the problem
    report = services.fleet_health()
    assert report.overdue.value == 1
    assert report.overdue.exact
    assert report.overdue_since is not None
    assert abs((report.overdue_since - (now - dt.timedelta(minutes=5))).total_seconds()) < 1
    [problem] = report.problems
    assert problem.startswith("1 wake-ups are overdue by more than 2.0 s (the oldest was due 5 min")

    services.sweep()  # the sweeper releases it
    assert services.fleet_health().overdue.value == 0


def test_dispatches_no_worker_took_are_counted() -> None:
    keep_shape(Nap.definition)
    run = Execution.objects.create(
        reactor=Nap.definition.name,
        definition_hash=Nap.definition.definition_hash,
        status=ExecutionStatus.PENDING,
        inputs={},
    )
    old, fresh, later = (
        Dispatch.objects.create(execution=run, reason=Dispatch.Reason.START) for _ in range(3)
    )
    now = timezone.now()
    Dispatch.objects.filter(pk=old.pk).update(created_at=now - dt.timedelta(minutes=2))
    # Written long ago but held back by a backoff until now: not late.
    Dispatch.objects.filter(pk=later.pk).update(
        created_at=now - dt.timedelta(minutes=2), not_before=now + dt.timedelta(minutes=1)
    )
    report = services.fleet_health()
    assert report.not_taken.value == 1
    assert any(p.startswith("1 dispatches were not taken by a worker") for p in report.problems)
    Dispatch.objects.filter(pk=old.pk).update(sent_at=now)
    assert services.fleet_health().not_taken.value == 0
    assert fresh.sent_at is None


def run_row(status: str, *, took: float | None = None, ago: float = 60.0) -> Execution:
    keep_shape(Nap.definition)
    now = timezone.now()
    fields: dict[str, Any] = {}
    if took is not None:
        fields["finished_at"] = now - dt.timedelta(seconds=ago)
        fields["started_at"] = fields["finished_at"] - dt.timedelta(seconds=took)
    return Execution.objects.create(
        reactor=Nap.definition.name,
        definition_hash=Nap.definition.definition_hash,
        status=status,
        inputs={},
        **fields,
    )


def test_each_reactors_last_hour() -> None:
    for took in (1.0, 2.0, 10.0):
        run_row(ExecutionStatus.COMPLETED, took=took)
    run_row(ExecutionStatus.FAILED, took=0.5)
    run_row(ExecutionStatus.NEEDS_ATTENTION, took=0.5)
    run_row(ExecutionStatus.RUNNING)
    run_row(ExecutionStatus.PENDING)
    old = run_row(ExecutionStatus.COMPLETED, took=100.0, ago=7200)  # ended two hours ago
    Execution.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(hours=3))

    report = services.fleet_health()
    [row] = report.reactors
    assert row.reactor == Nap.definition.name
    assert (row.started, row.completed, row.failed, row.in_flight) == (7, 3, 2, 2)
    assert (row.p50, row.p95) == pytest.approx((2.0, 10.0), abs=0.01)
    assert report.reactors_complete
    assert services.fleet_health(reactors=False).reactors == []


def test_rows_of_processes_unseen_for_a_day_are_pruned_by_the_sweeper() -> None:
    beat_worker()
    age("worker", 2 * 86400)
    assert services.fleet_health().workers == []  # not shown: older than a day
    services.sweep()
    assert list(ProcessHeartbeat.objects.values_list("role", flat=True)) == ["sweeper"]


def test_a_waiting_run_is_told_why_it_may_not_move() -> None:
    warnings = waiting_warnings(ExecutionStatus.PENDING, wakes=True)
    assert [w.split(":")[0] for w in warnings] == [
        "no sweeper has run in the last day",
        "no worker has reported in the last day",
    ]
    assert warnings[0].endswith("; until then this run is not woken")
    assert waiting_warnings(ExecutionStatus.COMPLETED, wakes=False) == []
    beat_worker()
    services.sweep()
    assert waiting_warnings(ExecutionStatus.PENDING, wakes=True) == []


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="MariaDB has no partial indexes (docs: MariaDB)"
)
def test_the_late_work_is_read_through_the_partial_indexes() -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        with CaptureQueriesContext(connection) as queries:
            services.fleet_health(reactors=False)
        statements = [q["sql"] for q in queries.captured_queries]
        plans = {}
        counts = [s for s in statements if "COUNT" in s.upper()]
        for name, marker in (("overdue", '"wake_at" <'), ("not taken", '"created_at" <')):
            [sql, *_] = [s for s in counts if marker in s]
            cursor.execute("EXPLAIN " + sql)
            plans[name] = "\n".join(row[0] for row in cursor.fetchall())
    # With seq scans off, a plan that still scans a table has no index that serves it (which
    # index the planner takes depends on the statistics of the tables other tests left).
    for name, plan in plans.items():
        assert "Seq Scan" not in plan, (name, plan)
        assert "Index" in plan, (name, plan)
