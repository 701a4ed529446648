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
