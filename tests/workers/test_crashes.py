"""Workers killed, stopped and cut off at named points (reliability.md b1 and b3 #27).

Each test asserts that the run finishes, that a step whose checkpoint committed never runs
again, and that every external effect happened exactly once (``Effect`` is keyed by the step's
idempotency key, as a payment provider would be).
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections, transaction

from django_reactor import services
from django_reactor.models import Dispatch, Execution
from django_reactor.states import ExecutionStatus
from testproject.example.models import Effect
from tests.workers.harness import Worker, process_state, wait_until
from tests.workers.reactors import FailsAtFour, Five, HandsOffAfterFirst
from tests.workers.test_background import body_runs, finished


def sweep_until_finished(execution_id: Any, timeout: float = 60.0) -> Execution:
    """Run the sweeper (as beat would) until the run is finished."""

    def check() -> Execution | None:
        services.sweep()
        return finished(execution_id)

    return wait_until(check, timeout=timeout, what=f"execution {execution_id} to finish")


def effects(execution_id: Any) -> list[str]:
    return sorted(Effect.objects.filter(execution_id=execution_id).values_list("step", flat=True))


def trace(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace]


FIVE_EFFECTS = ["s1", "s2", "s3", "s4", "s5"]


@pytest.mark.mariadb
@pytest.mark.behind_pgbouncer
def test_1_killed_after_a_step_commits_resumes_at_the_next_step(start_worker: Any) -> None:
    start_worker(faults="after_step_commit@s3=kill:once")
    outcome = Five.run({})
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED
    assert body_runs(row.id) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1}
    assert effects(row.id) == FIVE_EFFECTS
    assert row.recovery_attempts == 1
    steps = [(k, s) for k, s in trace(row.id) if s]
    assert steps == [("run", f"s{i}") for i in range(1, 6)]


@pytest.mark.mariadb
def test_2_killed_inside_a_step_after_its_effect_runs_it_again_effect_once(
    start_worker: Any,
) -> None:
    start_worker(faults="after_effect@s4=kill:once")
    outcome = Five.run({})
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED
    assert body_runs(row.id) == {"s1": 1, "s2": 1, "s3": 1, "s4": 2, "s5": 1}
    assert effects(row.id) == FIVE_EFFECTS


@pytest.mark.behind_pgbouncer
def test_3_crash_between_hand_off_commit_and_publish_is_recovered_by_the_sweeper(
    start_worker: Any, run_in_subprocess: Callable[..., int]
) -> None:
    start_worker()
    code = (
        "from tests.workers.reactors import HandsOffAfterFirst\n"
        "HandsOffAfterFirst.run({}, idempotency_key='handoff-crash')\n"
    )
    assert run_in_subprocess(code, faults="before_publish=kill") == -signal.SIGKILL
    row = Execution.objects.get(idempotency_key="handoff-crash")
    assert row.status == ExecutionStatus.PENDING
    assert Dispatch.objects.get(execution=row).sent_at is None  # committed, never published
    row = sweep_until_finished(row.id)
    assert row.status == ExecutionStatus.COMPLETED
    assert body_runs(row.id) == {"h1": 1, "h2": 1, "h3": 1}
    assert HandsOffAfterFirst.run({}, idempotency_key="handoff-crash").execution_id == row.id


def test_4_web_process_dies_after_commit_before_enqueue(
    start_worker: Any, run_in_subprocess: Callable[..., int]
) -> None:
    code = "from tests.workers.reactors import Five\nFive.run({}, idempotency_key='order-9')\n"
    assert run_in_subprocess(code, faults="before_publish=kill") == -signal.SIGKILL
    row = Execution.objects.get(idempotency_key="order-9")
    assert row.status == ExecutionStatus.PENDING
    # The client retries with the same key: same execution, nothing new.
    again = Five.run({}, idempotency_key="order-9")
    assert again.execution_id == row.id
    assert again.idempotent_replay
    assert Execution.objects.count() == 1
    start_worker()
    row = sweep_until_finished(row.id)
    assert row.status == ExecutionStatus.COMPLETED
    assert effects(row.id) == FIVE_EFFECTS


def test_5_a_background_run_inside_a_rolled_back_transaction_never_happens(
    start_worker: Any,
) -> None:
    start_worker()

    class Rollback(Exception):
        pass

    def start_then_fail() -> None:
        with transaction.atomic():
            Five.run({})
            raise Rollback

    with pytest.raises(Rollback):
        start_then_fail()
    assert not Execution.objects.exists()
    assert not Dispatch.objects.exists()
    with transaction.atomic():
        outcome = Five.run({})
        # Not published before the commit: the worker could not see the row yet.
        assert Dispatch.objects.get().sent_at is None
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED


@pytest.mark.mariadb
def test_6_two_deliveries_at_once_run_the_steps_once(start_worker: Any) -> None:
    from django_reactor.celery.tasks import resume

    start_worker()
    outcome = Five.run({})
    for _ in range(3):  # the same message delivered again, as after a visibility timeout
        resume.apply_async(args=[str(outcome.execution_id)], queue=_queue())
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED
    assert body_runs(row.id) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1}
    assert [k for k, _ in trace(row.id)].count("resume") == 1


def test_6_concurrent_resumers_in_threads_one_wins() -> None:
    pass_through: list[Any] = []
    outcome = Five.run({})  # pending, not published to any worker in this test
    barrier = threading.Barrier(4, timeout=20)

    def resume() -> None:
        try:
            barrier.wait()
            pass_through.append(services.resume(outcome.execution_id))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=resume) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    winners = [o for o in pass_through if o is not None]
    assert len(winners) == 1
    assert winners[0].ok
    assert body_runs(outcome.execution_id) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1}


test_6_concurrent_resumers_in_threads_one_wins = pytest.mark.django_db(transaction=True)(
    test_6_concurrent_resumers_in_threads_one_wins
)


@pytest.mark.mariadb
@pytest.mark.behind_pgbouncer
def test_9_a_stopped_worker_is_fenced_out_when_it_wakes(start_worker: Any) -> None:
    worker: Worker = start_worker(faults="after_effect@s3=stop:once")
    outcome = Five.run({})
    stopped = wait_until(
        lambda: [p for p in worker.children() if process_state(p) == "T"],
        what="a worker process to stop inside s3",
    )[0]
    row = sweep_until_finished(outcome.execution_id)  # the other process takes over
    assert row.status == ExecutionStatus.COMPLETED
    events_before = len(trace(row.id))
    fence_before = row.fence
    os.kill(stopped, signal.SIGCONT)
    wait_until(
        lambda: "was taken over by another process" in worker.log(),
        what="the zombie to find its lease gone",
    )
    row.refresh_from_db()
    assert row.status == ExecutionStatus.COMPLETED
    assert row.fence == fence_before
    assert len(trace(row.id)) == events_before  # the zombie wrote nothing
    assert body_runs(row.id) == {"s1": 1, "s2": 1, "s3": 2, "s4": 1, "s5": 1}
    assert effects(row.id) == FIVE_EFFECTS


@pytest.mark.mariadb
def test_11_a_step_that_kills_its_worker_every_time_is_parked(start_worker: Any) -> None:
    start_worker(faults="after_effect@s2=kill")
    outcome = Five.run({})
    row = sweep_until_finished(outcome.execution_id, timeout=90)
    assert row.status == ExecutionStatus.NEEDS_ATTENTION
    assert row.failure["kind"] == "recovery_limit"
    assert row.failure["step"] == "s2"
    assert "lost its worker 3 times" in row.failure["message"]
    assert body_runs(row.id) == {"s1": 1, "s2": 3}
    assert effects(row.id) == ["s1", "s2"]
    assert trace(row.id)[-1] == ("attention", "")


def test_16_a_rollback_cut_off_by_a_crash_continues_without_repeating_undos(
    start_worker: Any,
) -> None:
    start_worker(faults="before_undo@f2=kill:once")
    outcome = FailsAtFour.run({})
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.FAILED
    assert row.failure["step"] == "f4"
    steps = [(k, s) for k, s in trace(row.id) if s]
    assert steps == [
        ("run", "f1"), ("run", "f2"), ("run", "f3"), ("fail", "f4"),
        ("compensate", "f4"), ("undo", "f3"), ("undo", "f2"), ("undo", "f1"),
    ]  # fmt: skip
    assert effects(row.id) == sorted(
        ["f1", "f2", "f3", "f4", "compensate:f4", "undo:f3", "undo:f2", "undo:f1"]
    )
    assert body_runs(row.id)["undo:f3"] == 1


@pytest.mark.behind_pgbouncer
def test_27_connection_killed_during_the_step_commit(start_worker: Any) -> None:
    worker = start_worker(faults="before_step_commit@s3=db_kill:once")
    outcome = Five.run({})
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to finish")
    assert row.status == ExecutionStatus.COMPLETED
    assert "database connection lost while running execution" in worker.log()
    assert body_runs(row.id) == {"s1": 1, "s2": 1, "s3": 2, "s4": 1, "s5": 1}
    assert effects(row.id) == FIVE_EFFECTS
    assert row.recovery_attempts == 0


def test_unknown_execution_ids_are_ignored(start_worker: Any) -> None:
    from django_reactor.celery.tasks import resume

    worker = start_worker()
    missing = uuid.uuid4()
    resume.apply_async(args=[str(missing)], queue=_queue())
    wait_until(lambda: f"unknown execution {missing}" in worker.log(), what="the log line")


def _queue() -> str:
    from django.conf import settings

    return str(settings.REACTOR["CELERY_QUEUE"])


def test_a_worker_killed_inside_a_composed_child_continues_the_child(start_worker: Any) -> None:
    from tests.workers.reactors import WithChild

    start_worker(faults="after_step_commit@c2=kill:once")
    outcome = WithChild.run({})
    row = sweep_until_finished(outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED
    child = services.find(row.id).child("child")
    assert child.status == ExecutionStatus.COMPLETED
    assert body_runs(row.id) == {"p1": 1, "p2": 1}
    assert body_runs(child.id) == {"c1": 1, "c2": 1, "c3": 1}
    assert Execution.objects.filter(parent=row.id).count() == 1


def test_12_sigterm_during_a_step_lets_it_finish_or_hands_it_on(start_worker: Any) -> None:
    Effect.objects.create(key="slow-flag", execution_id=uuid.uuid4(), step="slow-s3")
    worker: Worker = start_worker()
    outcome = Five.run({})
    wait_until(
        lambda: Effect.objects.filter(execution_id=outcome.execution_id, step="s3").exists(),
        what="the worker to be inside s3",
    )
    assert worker.process is not None
    os.kill(worker.process.pid, signal.SIGTERM)  # warm shutdown, as a deploy does
    worker.process.wait(timeout=60)
    row = Execution.objects.get(pk=outcome.execution_id)
    if row.status != ExecutionStatus.COMPLETED:  # requeued: another worker finishes it
        start_worker()
        row = sweep_until_finished(row.id)
    assert row.status == ExecutionStatus.COMPLETED
    assert effects(row.id) == FIVE_EFFECTS
    runs = body_runs(row.id)
    assert runs["s1"] == runs["s2"] == 1
    assert runs["s4"] == runs["s5"] == 1
