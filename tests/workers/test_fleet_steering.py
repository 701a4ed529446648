"""Forks and bulk operations on real Celery workers, with workers killed under them."""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from typing import Any

from django.utils import timezone

from django_reactor import Dispatched, services
from django_reactor.models import BulkOperation, Execution
from django_reactor.states import MOVING_STATUSES, ExecutionStatus
from testproject.example.models import BodyRun, Effect
from tests.workers.harness import wait_until
from tests.workers.reactors import Checkout, EightSteps
from tests.workers.test_crashes import sweep_until_finished

#: Runs the bulk test retries (REACTOR_WORKER_BULK_RUNS raises it: 10,000 on a quiet machine).
BULK_RUNS = int(os.environ.get("REACTOR_WORKER_BULK_RUNS", "40"))


def ended(execution_id: Any) -> Execution | None:
    row = Execution.objects.get(pk=execution_id)
    return row if row.status not in MOVING_STATUSES else None


def bodies(*execution_ids: Any) -> Counter[str]:
    return Counter(
        BodyRun.objects.filter(execution_id__in=execution_ids).values_list("step", flat=True)
    )


def test_a_fork_runs_the_fixed_steps_only_and_survives_a_worker_kill(start_worker: Any) -> None:
    Effect.objects.create(key="broken-s5", execution_id=uuid.uuid4(), step="broken-s5")
    start_worker(faults="after_step_commit@s6=kill:once")
    original = EightSteps.run({}).execution_id
    row = wait_until(lambda: ended(original), timeout=60, what="the run to fail")
    assert row.status == ExecutionStatus.FAILED
    assert bodies(original) == Counter({"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1})

    Effect.objects.filter(key="broken-s5").delete()  # the fix is deployed
    outcome = services.fork(original, "s5")
    assert isinstance(outcome, Dispatched)
    # The worker is killed after s6's checkpoint; the sweeper (as beat would) hands the run to
    # a worker again once its lease has run out.
    fork = sweep_until_finished(outcome.execution_id, timeout=90)
    assert fork.status == ExecutionStatus.COMPLETED
    # Steps 1-4 did not run again; 5-8 ran once each in the fork (s5 failed once before).
    assert bodies(original, fork.pk) == Counter(
        {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 2, "s6": 1, "s7": 1, "s8": 1}
    )
    effects = Counter(Effect.objects.filter(execution_id=fork.pk).values_list("step", flat=True))
    assert effects == Counter({"s5": 1, "s6": 1, "s7": 1, "s8": 1})
    assert services.find(fork.pk).retry_of == original


def test_a_bulk_retry_whose_worker_is_killed_retries_each_run_once(start_worker: Any) -> None:
    Effect.objects.create(key="broken-c2", execution_id=uuid.uuid4(), step="broken-c2")
    worker = start_worker()
    failed = [Checkout.run({}).execution_id for _ in range(BULK_RUNS)]
    wait_until(
        lambda: not Execution.objects.filter(pk__in=failed, status__in=MOVING_STATUSES).exists(),
        timeout=60 + BULK_RUNS / 5,
        what="the runs to fail",
    )
    Effect.objects.filter(key="broken-c2").delete()
    run_filter = services.RunFilter.parse(
        {"reactor": "tests.workers.reactors.Checkout", "status": "failed"}
    )
    preview = services.preview_bulk("retry", run_filter)
    assert preview.count == BULK_RUNS
    assert not BulkOperation.objects.exists()  # the dry run wrote nothing

    started = services.start_bulk("retry", run_filter, reason="c2 fixed")
    # Killed (the whole worker) a while into the operation.
    wait_until(
        lambda: BulkOperation.objects.get(pk=started.id).done >= BULK_RUNS // 4,
        timeout=60 + BULK_RUNS / 5,
        what="a quarter of the runs retried",
    )
    assert worker.process is not None
    os.killpg(worker.process.pid, signal.SIGKILL)
    start_worker()
    # Its lease runs out; the sweeper hands the operation to the new worker.
    wait_until(
        lambda: (
            services.sweep() is not None
            and BulkOperation.objects.get(pk=started.id).status == "done"
        ),
        timeout=120 + BULK_RUNS / 5,
        what="the operation to finish on the new worker",
    )
    operation = BulkOperation.objects.get(pk=started.id)
    assert operation.done + operation.skipped == BULK_RUNS
    assert operation.failed == 0
    retried = Counter(
        Execution.objects.filter(retry_of__in=failed).values_list("retry_of", flat=True)
    )
    assert set(retried) == set(failed)
    assert set(retried.values()) == {1}  # each failed run retried exactly once
    new_runs = Execution.objects.filter(retry_of__in=failed).values_list("pk", flat=True)
    # Retries the killed worker had taken are recovered by the sweeper, as beat would.
    wait_until(
        lambda: (
            services.sweep() is not None
            and not Execution.objects.filter(pk__in=new_runs, status__in=MOVING_STATUSES).exists()
        ),
        timeout=60 + BULK_RUNS / 5,
        what="the retries to finish",
    )
    assert set(Execution.objects.filter(pk__in=new_runs).values_list("status", flat=True)) == {
        ExecutionStatus.COMPLETED
    }
    assert timezone.now() >= operation.finished_at
