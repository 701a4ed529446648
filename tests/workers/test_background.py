"""Background runs executed by real Celery workers."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import Dispatched, services
from django_reactor.models import Execution
from django_reactor.states import MOVING_STATUSES, ExecutionStatus
from testproject.example.models import BodyRun, Effect
from tests.workers.harness import wait_until
from tests.workers.reactors import Five, HandsOffAfterFirst, HandsOffBeforeCharge, Retrying


def finished(execution_id: Any) -> Execution | None:
    row = Execution.objects.get(pk=execution_id)
    return row if row.status not in MOVING_STATUSES else None


def body_runs(execution_id: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in BodyRun.objects.filter(execution_id=execution_id).values_list("step", flat=True):
        counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.mark.mariadb
@pytest.mark.behind_pgbouncer
def test_a_background_run_is_dispatched_and_completed_by_a_worker(start_worker: Any) -> None:
    start_worker()
    outcome = Five.run({})
    assert isinstance(outcome, Dispatched)
    assert outcome.status == ExecutionStatus.PENDING
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED
    assert body_runs(row.id) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1}
    assert Effect.objects.filter(execution_id=row.id).count() == 5
    handle = services.find(row.id)
    assert [(e.kind, e.step) for e in handle.trace] == [
        ("start", ""), ("resume", ""),
        ("run", "s1"), ("run", "s2"), ("run", "s3"), ("run", "s4"), ("run", "s5"),
        ("complete", ""),
    ]  # fmt: skip
    assert row.dispatches.get().sent_at is not None


def test_wait_returns_the_outcome_of_a_run_a_worker_finishes(start_worker: Any) -> None:
    from django_reactor import Completed

    outcome = Five.run({})
    handle = services.find(outcome.execution_id)
    assert handle.status == ExecutionStatus.PENDING
    start_worker()  # after the call: wait() is what sees the worker's progress
    ended = handle.wait(timeout=60)
    assert isinstance(ended, Completed)
    assert handle.status == ExecutionStatus.COMPLETED  # the handle shows the run as it ended
    assert [e.kind for e in handle.trace][-1] == "complete"
    assert body_runs(outcome.execution_id) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1}
    assert handle.wait(timeout=0).value == ended.value  # a finished run: at once


@pytest.mark.behind_pgbouncer
def test_retries_in_a_worker_are_rescheduled_not_slept(start_worker: Any) -> None:
    start_worker()
    outcome = Retrying.run({})
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED
    assert services.find(row.id).outcome.value == "third time lucky"
    kinds = [(e.kind, e.step, e.attempt) for e in services.find(row.id).trace if e.step]
    assert kinds == [
        ("run", "first", 1),
        ("retry", "flaky", 1),
        ("retry", "flaky", 2),
        ("run", "flaky", 3),
    ]
    # Each backoff released the worker: the run was picked up again three times in all.
    assert [e.kind for e in services.find(row.id).trace].count("resume") == 3
    assert body_runs(row.id) == {"first": 1, "flaky": 3}


def test_hand_off_after_a_step(start_worker: Any) -> None:
    start_worker()
    outcome = HandsOffAfterFirst.run({})
    assert isinstance(outcome, Dispatched)
    assert list(outcome.results) == ["h1"]
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED
    kinds = [e.kind for e in services.find(row.id).trace]
    assert kinds == ["start", "run", "handoff", "resume", "run", "run", "complete"]
    pids = dict(BodyRun.objects.filter(execution_id=row.id).values_list("step", "pid"))
    import os

    assert pids["h1"] == os.getpid()
    assert pids["h2"] != os.getpid()


def test_hand_off_before_a_step(start_worker: Any) -> None:
    start_worker()
    outcome = HandsOffBeforeCharge.run({})
    assert list(outcome.results) == ["b1"]
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED
    assert body_runs(row.id) == {"b1": 1, "charge": 1, "b3": 1}


def test_run_reactor_can_hand_its_run_to_real_workers(start_worker: Any) -> None:
    from django_reactor.testing import run_reactor

    start_worker()
    result = run_reactor(Five, background="workers", timeout=30)
    result.assert_completed().assert_ran("s1", "s2", "s3", "s4", "s5")
    assert ("resume", "") in result.trace  # a worker took it
