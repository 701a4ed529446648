"""The broker's Redis killed mid-run and restarted: a worker may exit (kombu gives up on a
dead connection), and its supervisor starts it again; every run still completes, each
checkpointed step ran once and every effect happened once. And a publish the broker refuses
is one WARNING line: the run is safe, its task left for the sweeper.

The broker is a ``redis-server`` of the test's own; the suite's Redis is never touched.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings

from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from testproject.example.models import Effect
from tests.private_redis import PrivateRedis, free_port
from tests.workers.conftest import _process_env
from tests.workers.harness import ROOT, Worker, start_sweeper, stop_process, wait_until
from tests.workers.test_background import body_runs

RUNS = 6
CREATE_ONE = """
import json
from tests.workers.reactors import Five
print(json.dumps(str(Five.run({}).execution_id)))
"""
CREATE_RUNS = f"""
import json
from tests.workers.reactors import Five
print(json.dumps([str(Five.run({{}}).execution_id) for _ in range({RUNS})]))
"""


def test_runs_complete_across_a_broker_outage_and_a_worker_restart(
    transactional_db: Any, tmp_path: Path
) -> None:
    # Each run spends 2 s in s3, so runs are in flight and queued when the broker dies (its
    # queued messages die with it: it keeps nothing on disk, and the sweeper dispatches again).
    Effect.objects.create(key="slow-flag", execution_id=uuid.uuid4(), step="slow-s3")
    broker = PrivateRedis(tmp_path).start()
    env = {**_process_env(tmp_path), "CELERY_BROKER_URL": broker.url, "PYTHONUNBUFFERED": "1"}
    queue = settings.REACTOR["CELERY_QUEUE"]
    workers = [Worker(env=env, queue=queue, log_dir=tmp_path).start()]
    sweeper = start_sweeper(env, tmp_path / "sweeper.log")
    try:
        created = subprocess.run(
            [sys.executable, "-c", "import django\ndjango.setup()\n" + CREATE_RUNS],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        ids = json.loads(created.stdout.strip().splitlines()[-1])
        wait_until(
            lambda: Effect.objects.filter(execution_id__in=ids, step="s3").exists(),
            timeout=60,
            what="a run to be inside s3",
        )
        broker.kill()
        time.sleep(2.0)  # the outage itself (the fault's length, not a synchronisation)
        broker.start()
        # A supervisor (systemd, Kubernetes) starts a worker that exited; so does this test.
        for index, worker in enumerate(workers):
            if worker.process is not None and worker.process.poll() is not None:
                workers[index] = Worker(env=env, queue=queue, log_dir=tmp_path).start()

        def all_finished() -> bool:
            statuses = set(Execution.objects.filter(pk__in=ids).values_list("status", flat=True))
            return statuses == {ExecutionStatus.COMPLETED}

        wait_until(all_finished, timeout=120, what="every run to complete after the outage")
        for execution_id in ids:
            effects = Effect.objects.filter(execution_id=execution_id)
            steps = sorted(effects.values_list("step", flat=True))
            assert steps == ["s1", "s2", "s3", "s4", "s5"], (execution_id, steps)
            runs = body_runs(execution_id)
            assert set(runs) == {"s1", "s2", "s3", "s4", "s5"}
            # A step whose checkpoint committed never ran again; at most the one in flight did.
            assert sum(count - 1 for count in runs.values()) <= 1, runs
    finally:
        stop_process(sweeper, signal.SIGINT)
        for worker in workers:
            worker.stop()
        broker.kill()


def test_a_publish_the_broker_refuses_is_one_warning_and_the_run_is_kept(
    transactional_db: Any, tmp_path: Path
) -> None:
    """A web process whose broker is down: the run is written and its task unsent; the log has
    one WARNING line saying so (the traceback only at DEBUG), not kombu's chained traceback."""
    env = {**_process_env(tmp_path), "CELERY_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"}
    created = subprocess.run(
        [sys.executable, "-c", "import django\ndjango.setup()\n" + CREATE_ONE],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    execution_id = json.loads(created.stdout.strip().splitlines()[-1])
    logged = created.stderr.strip().splitlines()
    (line,) = logged
    assert line.startswith(f"could not publish the task for execution {execution_id} (")
    assert "the run is safe in the database and the sweeper will publish it again" in line
    assert "Traceback" not in created.stderr
    row = Execution.objects.get(pk=execution_id)
    assert row.status == ExecutionStatus.PENDING
    assert row.dispatches.get().sent_at is None  # the sweeper publishes it again
