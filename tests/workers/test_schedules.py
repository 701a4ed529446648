"""A schedule on real processes: Celery beat sends the sweeper's task, a Celery worker sweeps
(firing the schedule's due tick) and runs the run the tick started."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_reactor import services
from django_reactor.models import Execution, ScheduleFire
from django_reactor.states import ExecutionStatus
from django_reactor.testing import make_schedules_due
from testproject.example.models import BodyRun
from tests.workers.conftest import WorkerDatabase, _process_env
from tests.workers.harness import ROOT, stop_process, wait_until
from tests.workers.reactors import Five

#: Seconds between the sweeps beat asks for.
BEAT_INTERVAL = 0.5


@pytest.fixture
def start_beat(
    transactional_db: Any, tmp_path: Path, worker_database: WorkerDatabase
) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start ``celery beat`` with ``beat_schedule(BEAT_INTERVAL)`` on the tests' queue."""
    started: list[subprocess.Popen[bytes]] = []
    log_path = tmp_path / "beat.log"

    def start() -> subprocess.Popen[bytes]:
        env = {
            **_process_env(tmp_path, "", worker_database),
            "REACTOR_BEAT_INTERVAL": str(BEAT_INTERVAL),
        }
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "testproject", "beat",
                 "-s", str(tmp_path / "beat-schedule"), "--max-interval", "1", "-l", "INFO"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        started.append(process)
        return process

    yield start
    for process in started:
        stop_process(process)


def finished_runs(schedule_id: int, count: int) -> list[Execution] | None:
    fires = ScheduleFire.objects.filter(schedule_id=schedule_id, execution__isnull=False)
    runs = list(Execution.objects.filter(pk__in=fires.values("execution_id")))
    if len(runs) < count or any(r.status != ExecutionStatus.COMPLETED for r in runs):
        return None
    return runs


def test_beat_and_a_worker_fire_a_schedule_whose_runs_complete(
    start_worker: Any, start_beat: Any, tmp_path: Path
) -> None:
    start_worker()
    beat = start_beat()
    schedule = services.schedules.create(Five, every="1h", overlap="allow", name="five")
    for count in (1, 2):  # two ticks, one after the other
        make_schedules_due(schedule)
        runs = wait_until(
            lambda n=count: finished_runs(schedule.id, n),
            timeout=60,
            what=f"{count} run(s) of the schedule to complete",
        )
    assert beat.poll() is None, "beat exited"
    assert "Sending due task django-reactor-sweep" in (tmp_path / "beat.log").read_text()
    assert len(runs) == 2
    fires = list(ScheduleFire.objects.filter(schedule_id=schedule.id).order_by("fire_at"))
    assert [f.outcome for f in fires] == ["started", "started"]
    for fire, run in zip(fires, sorted(runs, key=lambda r: r.created_at), strict=True):
        assert run.id == fire.execution_id
        assert run.idempotency_key == services.schedules.idempotency_key(schedule.id, fire.fire_at)
        steps = list(BodyRun.objects.filter(execution_id=run.id).values_list("step", flat=True))
        assert sorted(steps) == ["s1", "s2", "s3", "s4", "s5"]  # each step once
