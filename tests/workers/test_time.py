"""Time on real workers: a sleep outlives a killed worker, a hung step times out and is retried
elsewhere, a run waiting for a lock stops at its deadline."""

from __future__ import annotations

import os
import signal
from typing import Any

from django_reactor.states import ExecutionStatus
from django_reactor.testing import ReactorClock
from tests.workers.harness import wait_until
from tests.workers.reactors import NapsOnWorker, TimesOutOnWorker
from tests.workers.test_background import body_runs
from tests.workers.test_crashes import effects, sweep_until_finished, trace


def sleeping(execution_id: Any) -> bool:
    from django_reactor.models import StepRecord

    return StepRecord.objects.filter(
        execution_id=execution_id, step="nap", status="sleeping"
    ).exists()


def test_a_sleep_outlives_a_killed_worker_and_resumes_on_another(start_worker: Any) -> None:
    worker = start_worker()
    outcome = NapsOnWorker.run({})
    wait_until(lambda: sleeping(outcome.execution_id), timeout=30, what="the run to sleep")
    # Nothing of the run is in the worker while it sleeps: kill the worker outright.
    for pid in worker.children():
        os.kill(pid, signal.SIGKILL)
    worker.stop()
    start_worker()
    ReactorClock().advance(days=1, run=False)  # the day passes; the sweeper wakes it
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED, row.failure
    assert row.recovery_attempts == 0  # it held no worker: nothing to recover
    assert effects(row.id) == ["first", "second"]
    assert body_runs(row.id) == {"first": 1, "second": 1}
    assert [k for k, s in trace(row.id) if s == "nap"] == ["sleep", "run"]


def test_a_hung_step_times_out_and_its_retry_runs_after_the_worker_let_it_go(
    start_worker: Any,
) -> None:
    start_worker()
    outcome = TimesOutOnWorker.run({})
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED, row.failure
    assert row.result == "attempt 2"
    attempts = [(e.kind, e.attempt, e.data) for e in _events(row.id) if e.step == "hang"]
    assert [(kind, attempt) for kind, attempt, _ in attempts] == [("retry", 1), ("run", 2)]
    assert attempts[0][2]["exception_class"] == "django_reactor.exceptions.StepTimedOut"
    assert body_runs(row.id) == {"hang": 2}


def _events(execution_id: Any) -> list[Any]:
    from django_reactor import services

    return list(services.find(execution_id).trace)


def test_cancelling_a_run_reaches_its_unit_and_its_map_in_flight(start_worker: Any) -> None:
    import uuid

    import redis
    from django.conf import settings

    from django_reactor import services
    from django_reactor.models import Execution, MapResult
    from tests.workers.reactors import CancelsATree

    ns = f"cancel-tree-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.set(f"{ns}:hold", "1")
    try:
        start_worker(concurrency=4)
        outcome = CancelsATree.run({"ns": ns, "redis_url": settings.REDIS_URL})

        def in_flight() -> bool:
            return bool(client.get(f"{ns}:wait")) and int(client.get(f"{ns}:element") or 0) >= 1

        wait_until(in_flight, timeout=60, what="the unit and the map's elements to start")
        handle = services.cancel(outcome.execution_id, reason="order withdrawn")
        assert handle.status == ExecutionStatus.CANCELLED  # it was parked, waiting for them
        unit = Execution.objects.get(parent_id=outcome.execution_id, parent_step="unit")
    finally:
        client.delete(f"{ns}:hold")  # what was in flight finishes its step

    def settled() -> Execution | None:
        row = Execution.objects.get(pk=unit.id)
        return row if row.status == ExecutionStatus.CANCELLED else None

    wait_until(settled, timeout=60, what="the unit to stop after its step in flight")
    assert client.get(f"{ns}:after") is None  # the unit's next step never started
    started = int(client.get(f"{ns}:element") or 0)
    assert started < 10  # the elements not started never started
    statuses = list(
        MapResult.objects.filter(map_run__execution_id=outcome.execution_id).values_list(
            "status", flat=True
        )
    )
    assert statuses.count("succeeded") <= started
    assert [k for k, s in trace(outcome.execution_id) if not s][-1] == "cancel"
    client.delete(*[k for k in client.scan_iter(f"{ns}:*")] or [f"{ns}:none"])
