"""A real Celery worker reports heartbeats: its row appears when it is ready, is renewed every
HEARTBEAT_INTERVAL with the tasks it took, and goes when it stops cleanly."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from django_reactor import services
from django_reactor.models import ProcessHeartbeat
from django_reactor.states import ExecutionStatus
from tests.workers import conftest
from tests.workers.harness import start_sweeper, stop_process, wait_until
from tests.workers.reactors import Five
from tests.workers.test_background import finished

INTERVAL = 0.5


def test_a_worker_reports_heartbeats_until_it_stops(
    start_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(conftest.WORKER_REACTOR_SETTINGS, "HEARTBEAT_INTERVAL", INTERVAL)
    worker = start_worker(concurrency=2)
    assert worker.process is not None
    row = wait_until(
        lambda: ProcessHeartbeat.objects.filter(role="worker").first(),
        timeout=30,
        what="the worker's heartbeat row",
    )
    assert row.pid == worker.process.pid  # the main process beats, not the pool's
    assert row.name.startswith(f"{worker.name}@")
    assert row.queues == [settings.REACTOR["CELERY_QUEUE"]]
    assert row.concurrency == 2
    assert row.interval == INTERVAL

    outcome = Five.run({})
    done = wait_until(lambda: finished(outcome.execution_id), timeout=60, what="the run")
    assert done.status == ExecutionStatus.COMPLETED
    renewed = wait_until(
        lambda: ProcessHeartbeat.objects.filter(
            pk=row.pk, last_seen_at__gt=row.last_seen_at, tasks_done__gte=1
        ).first(),
        timeout=30,
        what="a later heartbeat counting the task",
    )
    assert renewed.started_at == row.started_at
    report = services.fleet_health()
    assert report.workers_alive == 1
    assert report.workers[0].pid == worker.process.pid

    worker.stop()
    assert not ProcessHeartbeat.objects.filter(role="worker").exists()


def test_a_stopped_sweeper_loop_is_reported_gone_within_three_intervals(
    worker_database: Any, tmp_path: Path
) -> None:
    sweeper = start_sweeper(
        conftest._process_env(tmp_path, "", worker_database), tmp_path / "sweeper.log", 0.5
    )
    try:
        row = wait_until(
            lambda: ProcessHeartbeat.objects.filter(role="sweeper", pid=sweeper.pid).first(),
            timeout=60,
            what="the sweeper's heartbeat row",
        )
        assert row.interval == 0.5  # the loop's --interval
        assert set(row.last_sweep) >= {"republished", "woken", "recovered", "fired"}
        assert services.fleet_health().sweeper_ok
    finally:
        stop_process(sweeper)
    stopped = time.monotonic()
    wait_until(lambda: not services.fleet_health().sweeper_ok, timeout=30, what="the sweeper gone")
    # Three of the longer of its interval and SWEEP_INTERVAL, and the time a sweep takes.
    assert time.monotonic() - stopped <= 3 * settings.REACTOR["SWEEP_INTERVAL"] + 2
    [problem, *_] = services.fleet_health().problems
    assert problem.startswith("no sweeper has run for ")
