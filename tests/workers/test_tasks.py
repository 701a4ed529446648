"""Tasks of Django's tasks framework through ``ReactorBackend`` on real Celery workers: what the
framework asks of a backend (results, statuses, errors, retries, ``run_after``, ``on_commit``),
and a worker killed in the middle of a task."""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from django_reactor import services
from django_reactor.models import Dispatch
from django_reactor.tasks.compat import TaskResult, TaskResultStatus
from tests.tasks import functions
from tests.workers.harness import wait_until


def finished(result: TaskResult[Any]) -> TaskResult[Any] | None:
    result.refresh()
    return result if result.is_finished else None


def test_tasks_run_on_workers_with_their_results_errors_and_retries(start_worker: Any) -> None:
    start_worker()
    later = timezone.now() + dt.timedelta(seconds=2)
    results = {
        "add": functions.add.enqueue(2, 3),
        "explode": functions.explode.enqueue("boom"),
        "fails_twice": functions.fails_twice.enqueue("v"),
        "async": functions.add_async.enqueue(20, 22),
        "deferred": functions.add.using(run_after=later).enqueue(1, 1),
    }
    results["deferred"].refresh()
    assert results["deferred"].status == TaskResultStatus.READY  # its time has not come
    for result in results.values():
        wait_until(lambda r=result: finished(r), timeout=60, what=f"task {result.id}")

    assert results["add"].status == TaskResultStatus.SUCCESSFUL
    assert results["add"].return_value == 5
    assert results["add"].attempts == 1

    failed = results["explode"]
    assert failed.status == TaskResultStatus.FAILED
    [error] = failed.errors
    assert error.exception_class is ValueError
    assert "boom" in error.traceback

    retried = results["fails_twice"]
    assert retried.status == TaskResultStatus.SUCCESSFUL
    assert retried.return_value == {"value": "v", "attempt": 3}
    assert retried.attempts == 3
    assert len(retried.errors) == 2

    assert results["async"].return_value == 42

    deferred = results["deferred"]
    assert deferred.return_value == 2
    assert deferred.started_at is not None
    assert deferred.started_at >= later  # not before its run_after


def test_enqueue_in_a_transaction_is_published_when_it_commits(start_worker: Any) -> None:
    start_worker()
    committed = threading.Event()
    enqueued: list[TaskResult[Any]] = []

    def view() -> None:
        with transaction.atomic():
            enqueued.append(functions.add.enqueue(1, 2))
            committed.wait(timeout=30)
        transaction.get_connection().close()

    caller = threading.Thread(target=view)
    caller.start()
    wait_until(lambda: enqueued, timeout=30, what="the enqueue")
    [result] = enqueued
    # Before the commit nobody else sees the run: no worker can take it, none is published.
    assert not Dispatch.objects.filter(execution_id=result.id).exists()
    committed.set()
    caller.join(timeout=30)
    wait_until(lambda: finished(result), timeout=60, what="the task to run after the commit")
    assert result.return_value == 3
    assert Dispatch.objects.get(execution_id=result.id).sent_at is not None


def test_a_worker_killed_mid_task_runs_it_again_and_records_its_result_once(
    start_worker: Any, tmp_path: Path
) -> None:
    worker = start_worker()
    result = functions.stays_until_killed.enqueue(str(tmp_path))
    pids = tmp_path / "pids"
    wait_until(pids.exists, timeout=60, what="the task to start")
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    [pid] = [int(p) for p in pids.read_text().split()]
    assert pid in worker.children()  # the process of the worker this test started
    os.kill(pid, signal.SIGKILL)

    def recovered() -> TaskResult[Any] | None:
        services.sweep()  # as beat would: the dead worker's lease expires
        return finished(result)

    wait_until(recovered, timeout=60, what="the task to run again")
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"runs": 2}
    handle = services.find(result.id)
    trace = [(e.kind, e.step) for e in handle.trace]
    assert trace.count(("run", "call")) == 1
    assert trace.count(("complete", "")) == 1
    assert [s.status for s in handle.steps] == ["completed"]
