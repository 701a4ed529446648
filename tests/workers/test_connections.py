"""Database connections cut under running processes (a PostgreSQL restart, a failover, an
idle-session timeout, a pooler reconnect, an operator's ``pg_terminate_backend``): workers and
the sweeper loop reconnect and carry on; no run is lost and no task sink is left behind.

Only backends of this test's own database are terminated, never the shared server's others.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_reactor import services
from django_reactor.models import Dispatch, Execution
from django_reactor.states import ExecutionStatus
from testproject.example.models import Effect
from tests.workers.conftest import _process_env
from tests.workers.harness import Worker, start_sweeper, stop_process, wait_until
from tests.workers.reactors import Five
from tests.workers.test_background import body_runs, finished

# What Celery logs for a task that raised.
TASK_FAILURE = re.compile(r"Task django_reactor\.\S+\[[^\]]+\] raised unexpected")


def terminate_other_backends() -> int:
    """End every other session on the test database (the workers', the sweeper's); returns
    how many were ended."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return int(cursor.fetchone()[0])


def all_completed(ids: list[Any]) -> bool:
    rows = [finished(i) for i in ids]
    return all(r is not None for r in rows)


def test_a_worker_whose_connections_were_terminated_runs_the_next_runs(
    start_worker: Any,
) -> None:
    worker: Worker = start_worker(concurrency=2)
    warm = [Five.run({}).execution_id for _ in range(4)]  # both pool children connect
    wait_until(lambda: all_completed(warm), timeout=60, what="the first runs")
    killed = terminate_other_backends()
    assert killed >= 1
    after = [Five.run({}).execution_id for _ in range(3)]
    wait_until(lambda: all_completed(after), timeout=60, what="the runs after the termination")
    for execution_id in after:
        row = Execution.objects.get(pk=execution_id)
        assert row.status == ExecutionStatus.COMPLETED, (row.status, row.failure)
        assert row.recovery_attempts == 0
        steps = sorted(
            Effect.objects.filter(execution_id=execution_id).values_list("step", flat=True)
        )
        assert steps == ["s1", "s2", "s3", "s4", "s5"]
    failures = TASK_FAILURE.findall(worker.log())
    assert len(failures) <= killed, worker.log()[-4000:]
    assert "the connection is closed" not in worker.log()


def test_the_sweeper_loop_outlives_terminated_connections(
    transactional_db: Any, tmp_path: Path
) -> None:
    log_path = tmp_path / "sweeper.log"
    sweeper = start_sweeper(_process_env(tmp_path), log_path, interval=0.2)
    try:

        def sweeps() -> int:
            return log_path.read_text(errors="replace").count("sweep: ")

        wait_until(lambda: sweeps() >= 2, timeout=60, what="the sweeper to sweep")
        for _ in range(5):
            seen = sweeps()
            wait_until(terminate_other_backends, timeout=30, what="the sweeper's session")
            wait_until(lambda s=seen: sweeps() > s + 1, timeout=30, what="sweeps after the cut")
            assert sweeper.poll() is None, log_path.read_text(errors="replace")
        # A run whose task was lost is still picked up: the loop really works after the cuts.
        outcome = Five.run({})
        Dispatch.objects.filter(execution_id=outcome.execution_id).delete()
        wait_until(
            lambda: Dispatch.objects.filter(execution_id=outcome.execution_id).exists(),
            timeout=30,
            what="the sweeper to dispatch the run again",
        )
    finally:
        stop_process(sweeper, signal.SIGINT)
    assert "Traceback" not in log_path.read_text(errors="replace").split("sweep failed")[0]


@pytest.mark.parametrize("action", ["sysexit", "keyboard"])
def test_a_worker_interrupted_mid_step_hands_the_run_back(start_worker: Any, action: str) -> None:
    start_worker(faults=f"after_effect@s3={action}:once")
    outcome = Five.run({})
    row = wait_until(lambda: finished(outcome.execution_id), timeout=90, what="the run")
    assert row.status == ExecutionStatus.COMPLETED, (row.status, row.failure)
    assert body_runs(row.id) == {"s1": 1, "s2": 1, "s3": 2, "s4": 1, "s5": 1}
    kinds = [e.kind for e in services.find(row.id).trace]
    assert "hand_back" in kinds
    assert "abort" not in kinds
    assert row.recovery_attempts == 1
