"""Steps side by side (``Meta.max_concurrency``) on real workers: overlap, retries that park
the run, a killed worker, rollback order and a run-level lock.
"""

from __future__ import annotations

import signal
import uuid
from typing import Any

import pytest

from django_reactor.exceptions import ExecutionBusy
from django_reactor.models import StepRecord
from django_reactor.states import ExecutionStatus
from tests.workers.reactors import (
    EightSideBySide,
    FailsSideBySide,
    FourSideBySide,
    RetriesSideBySide,
)
from tests.workers.test_background import body_runs, finished
from tests.workers.test_crashes import effects, sweep_until_finished, trace


def launches(execution_id: Any) -> list[dict[str, Any]]:
    from django_reactor import services

    return [e.data for e in services.find(execution_id).trace if e.kind == "launch"]


def test_eight_steps_run_side_by_side_in_one_worker(start_worker: Any) -> None:
    start_worker(concurrency=1)
    outcome = EightSideBySide.run({})
    row = sweep_until_finished(outcome.execution_id)
    # Each step waited at a barrier of eight in the worker process: they ran at the same time.
    assert row.status == ExecutionStatus.COMPLETED, row.failure
    names = [f"s{i}" for i in range(1, 9)]
    assert launches(row.id) == [{"steps": names}]
    assert body_runs(row.id) == dict.fromkeys(names, 1)
    assert effects(row.id) == names


@pytest.mark.behind_pgbouncer
def test_retries_side_by_side_park_the_run_once_and_keep_their_attempts(
    start_worker: Any,
) -> None:
    start_worker()
    outcome = RetriesSideBySide.run({})
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED, row.failure
    steps = [(kind, step, attempt) for kind, step, attempt in _trace(row.id) if step]
    for name in ("a", "b"):
        # The first attempt failed, the run parked, the second (not a new first) succeeded.
        assert [(k, a) for k, s, a in steps if s == name and k in ("retry", "run")] == [
            ("retry", 1),
            ("run", 2),
        ]
    parks = [e.data for e in _events(row.id) if e.kind == "park"]
    assert len(parks) == 1
    assert sorted(parks[0]["steps"]) == ["a", "b"]
    assert body_runs(row.id) == {"a": 2, "b": 2, "c": 1, "total": 1}  # one body a attempt
    assert effects(row.id) == ["a", "b", "c", "total"]


@pytest.mark.behind_pgbouncer
def test_a_worker_killed_with_steps_in_flight_reruns_only_those_not_recorded(
    start_worker: Any,
) -> None:
    start_worker(faults="after_step_commit@s2=kill:once")
    outcome = FourSideBySide.run({})
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED, row.failure
    assert row.recovery_attempts == 1
    runs = body_runs(row.id)
    assert runs["s2"] == 1  # its checkpoint committed before the kill: never again
    assert runs["last"] == 1
    assert all(1 <= runs[name] <= 2 for name in ("s1", "s3", "s4"))
    assert effects(row.id) == ["last", "s1", "s2", "s3", "s4"]  # each effect once


def test_a_failure_side_by_side_rolls_back_in_reverse_completion_order(
    start_worker: Any,
) -> None:
    start_worker()
    outcome = FailsSideBySide.run({})
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.FAILED
    assert row.failure["step"] == "f4"
    pairs = [(kind, step) for kind, step in trace(row.id) if step]
    completed = [step for kind, step in pairs if kind == "run"]
    undone = [step for kind, step in pairs if kind == "undo"]
    assert sorted(completed) == ["s1", "s2"]
    assert undone == completed[::-1]
    assert pairs.index(("fail", "f4")) < pairs.index(("compensate", "f4"))
    assert pairs.index(("compensate", "f4")) < pairs.index(("undo", undone[0]))
    assert ("run", "last") not in pairs
    records = {r.step: r for r in StepRecord.objects.filter(execution_id=row.id)}
    assert set(records) == {"s1", "s2", "f4"}


def _events(execution_id: Any) -> list[Any]:
    from django_reactor import services

    return list(services.find(execution_id).trace)


def _trace(execution_id: Any) -> list[tuple[str, str, int]]:
    return [(e.kind, e.step, e.attempt) for e in _events(execution_id)]


assert finished  # re-exported helpers the tests above rely on


def test_undo_of_a_run_abandoned_with_steps_in_flight_compensates_each_of_them(
    run_in_subprocess: Any,
) -> None:
    from django_reactor import services
    from django_reactor.models import Execution
    from testproject.example.models import Effect
    from tests.workers.harness import wait_until

    for name in ("s2", "s3"):  # two seconds each: in flight when s1's commit kills the process
        Effect.objects.create(key=f"slow-{name}", execution_id=uuid.uuid4(), step=f"slow-{name}")
    code = (
        "from tests.workers.reactors import InlineSideBySide\n"
        "InlineSideBySide.run({}, idempotency_key='abandoned')\n"
    )
    assert run_in_subprocess(code, faults="after_step_commit@s1=kill") == -signal.SIGKILL
    row = Execution.objects.get(idempotency_key="abandoned")
    assert row.status == ExecutionStatus.RUNNING

    def lease_expired() -> bool:
        handle = services.find(row.id)
        try:
            handle.undo()
        except ExecutionBusy:
            return False
        return True

    wait_until(lease_expired, timeout=30, what="the abandoned run's lease to expire")
    pairs = [(kind, step) for kind, step in trace(row.id) if step]
    assert ("run", "s1") in pairs
    # s2 and s3 were launched and never recorded: each is compensated; s1 is undone.
    assert ("compensate", "s2") in pairs
    assert ("compensate", "s3") in pairs
    assert pairs[-1] == ("undo", "s1")
    # Nothing failed: the run was rolled back on request, as a serial run abandoned mid-step.
    assert Execution.objects.get(pk=row.id).status == ExecutionStatus.CANCELLED
