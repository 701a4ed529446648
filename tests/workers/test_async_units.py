"""async_step and async_reactor on real workers: dispatch, waiting, parking and wake-up."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from django_reactor import services
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from testproject.example.models import Effect
from tests.workers.harness import wait_until
from tests.workers.reactors import InlineWithUnit, WithAsyncChild, WithUnit
from tests.workers.test_background import body_runs, finished


@pytest.mark.behind_pgbouncer
def test_an_async_step_runs_in_its_own_task_and_its_reader_gets_the_value(
    start_worker: Any,
) -> None:
    start_worker()
    outcome = WithUnit.run({})
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED
    assert services.find(row.id).outcome.value == {"doubled": 42}
    unit = Execution.objects.get(parent=row.id, parent_step="unit")
    assert unit.detached
    assert unit.status == ExecutionStatus.COMPLETED
    kinds = [(e.kind, e.step) for e in services.find(row.id).trace if e.step]
    assert kinds[:3] == [("run", "first"), ("dispatch", "unit"), ("run", "sibling")]
    assert kinds[-1] == ("run", "reader")
    assert body_runs(unit.id) == {"double": 1}


def test_a_failed_unit_compensates_itself_once_and_the_reader_decides(start_worker: Any) -> None:
    Effect.objects.create(key="flag", execution_id=uuid.uuid4(), step="make-unit-fail")
    start_worker()
    outcome = WithUnit.run({})
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED  # the reader chose to carry on
    assert services.find(row.id).outcome.value == {"unit_failed": "the unit failed"}
    unit = Execution.objects.get(parent=row.id, parent_step="unit")
    assert unit.status == ExecutionStatus.FAILED
    assert Effect.objects.filter(execution_id=unit.id, step="compensate:double").count() == 1
    # The parent never undoes its units.
    assert not [e for e in services.find(row.id).trace if e.kind == "undo"]


def test_an_inline_caller_waits_for_the_unit_a_worker_runs(start_worker: Any) -> None:
    start_worker()
    outcome = InlineWithUnit.run({})
    assert outcome.ok
    assert outcome.value == 10


def test_an_async_reactor_is_an_independent_execution(start_worker: Any) -> None:
    start_worker()
    outcome = WithAsyncChild.run({})
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED
    child = Execution.objects.get(parent=row.id, parent_step="child")
    assert child.detached
    assert child.status == ExecutionStatus.COMPLETED
    assert body_runs(child.id) == {"c1": 1, "c2": 1, "c3": 1}
    assert services.find(row.id).outcome.value == {
        "c1": {"step": "c1"}, "c2": {"step": "c2"}, "c3": {"step": "c3"},
    }  # fmt: skip


def test_a_composed_child_retrying_on_a_worker_parks_with_its_parent(start_worker: Any) -> None:
    from tests.workers.reactors import ParentOfFlaky

    start_worker()
    outcome = ParentOfFlaky.run({})
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED
    trace = [(e.kind, e.step, e.data.get("reason")) for e in services.find(row.id).trace]
    assert trace.count(("park", "child", "retry")) == 2  # the worker was freed twice
    child = services.find(row.id).child("child")
    assert child.status == ExecutionStatus.COMPLETED
    assert body_runs(child.id) == {"k1": 1, "flaky": 3}
    assert body_runs(row.id) == {"before": 1, "after": 1}


def test_a_composed_child_waiting_for_a_unit_parks_and_is_woken(start_worker: Any) -> None:
    from tests.workers.reactors import ParentOfReader

    start_worker()
    outcome = ParentOfReader.run({})
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED
    assert services.find(row.id).outcome.value == {"read": 8}
    parks = [e.data for e in services.find(row.id).trace if e.kind == "park"]
    assert parks
    assert parks[0] == {"child_step": "read", "reason": "park"}
