"""An interrupt inside a composed child, on real Celery workers.

``WithPausingChild`` runs on a worker, its child ``PausingChild`` pauses at ``approval``, and
the root pauses with it. The payload is delivered by path (``child.approval``); the interrupt
resumes in the background, so a worker continues the child, then the root. The crash test
kills that worker inside the child's next step, after the claim: the sweeper hands the root to
another worker, which continues the child where it stopped, and nothing runs twice that was
checkpointed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from django_reactor import Dispatched, services
from django_reactor.models import Execution, Interrupt
from django_reactor.states import ExecutionStatus, InterruptStatus
from tests.workers.harness import wait_until
from tests.workers.reactors import WithPausingChild
from tests.workers.test_background import body_runs, finished
from tests.workers.test_crashes import effects, sweep_until_finished, trace


def paused_on_a_worker() -> tuple[Any, Any]:
    """Start the run (a worker runs it) and wait until it paused at its child's interrupt."""
    outcome = WithPausingChild.run({})
    assert isinstance(outcome, Dispatched)
    root = wait_until(
        lambda: Execution.objects.filter(
            pk=outcome.execution_id, status=ExecutionStatus.PAUSED
        ).first(),
        what="the root to pause at its child's interrupt",
    )
    child = Execution.objects.get(parent_id=root.pk, parent_step="child")
    assert child.status == ExecutionStatus.PAUSED
    assert [i.step for i in services.find(root.pk).interrupts] == ["child.approval"]
    return root.pk, child.pk


@pytest.mark.behind_pgbouncer
def test_a_nested_interrupt_resumed_in_the_background_is_finished_by_a_worker(
    start_worker: Callable[..., Any],
) -> None:
    start_worker()
    root_id, child_id = paused_on_a_worker()

    outcome = services.resume_interrupt(root_id, step="child.approval", payload={"approved": True})

    assert isinstance(outcome, Dispatched)
    assert outcome.execution_id == root_id
    row = wait_until(lambda: finished(root_id), what="a worker to finish the root")
    assert row.status == ExecutionStatus.COMPLETED
    assert Execution.objects.get(pk=child_id).status == ExecutionStatus.COMPLETED
    assert Interrupt.objects.get(execution_id=child_id).status == InterruptStatus.RESUMED
    assert trace(root_id) == [
        ("start", ""), ("resume", ""), ("run", "p1"), ("interrupt", "child.approval"),
        ("pause", ""), ("steer", ""), ("resume", ""), ("payload", "child.approval"),
        ("run", "child"), ("run", "p2"), ("complete", ""),
    ]  # fmt: skip
    assert trace(child_id) == [
        ("start", ""), ("run", "c1"), ("interrupt", "approval"), ("pause", ""),
        ("payload", "approval"), ("run", "c2"), ("complete", ""),
    ]  # fmt: skip
    assert body_runs(root_id) == {"p1": 1, "p2": 1}
    assert body_runs(child_id) == {"c1": 1, "c2": 1}


def test_a_worker_killed_in_the_child_after_the_claim_finishes_once(
    start_worker: Callable[..., Any],
) -> None:
    start_worker(faults="before_step_commit@c2=kill:once")
    root_id, child_id = paused_on_a_worker()

    outcome = services.resume_interrupt(root_id, step="child.approval", payload={"approved": True})

    assert isinstance(outcome, Dispatched)
    row = sweep_until_finished(root_id)
    assert row.status == ExecutionStatus.COMPLETED
    assert row.recovery_attempts == 1
    assert Execution.objects.get(pk=child_id).status == ExecutionStatus.COMPLETED
    # c2's body ran twice (it was in flight when the worker died); its effect happened once,
    # and nothing checkpointed before the crash ran again.
    assert effects(child_id) == ["c1", "c2"]
    assert effects(root_id) == ["p1", "p2"]
    assert body_runs(child_id) == {"c1": 1, "c2": 2}
    assert body_runs(root_id) == {"p1": 1, "p2": 1}
    child_trace = trace(child_id)
    assert child_trace.count(("payload", "approval")) == 1
    assert child_trace.count(("run", "c2")) == 1
    assert trace(root_id).count(("run", "child")) == 1
