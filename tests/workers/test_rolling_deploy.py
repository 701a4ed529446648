"""A rolling deploy on real workers: an old-code worker (version 1) and a new-code worker
(version 2, version 1 kept) on one queue, runs of both versions in flight, workers killed and
replaced: every run completes, every step of it run by code of its own version."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from django_reactor.models import Execution, ExecutionEvent, StepRecord
from django_reactor.states import EventKind, ExecutionStatus
from tests.workers.conftest import WorkerDatabase, _process_env
from tests.workers.harness import ROOT, Worker, start_sweeper, stop_process, wait_until

REACTOR = "tests.workers.versioned_reactors.Checkout"
MODULE = "tests.workers.versioned_reactors"


def code_env(tmp_path: Path, database: WorkerDatabase, code: str) -> dict[str, str]:
    """The environment of a process of one deploy (``old`` or ``new``)."""
    env = _process_env(tmp_path, database=database)
    reactor = json.loads(env["REACTOR_SETTINGS_JSON"])
    reactor.update(HEARTBEAT_INTERVAL=1.0, HAND_BACK_AFTER=0.5, MAX_RECOVERY_ATTEMPTS=5)
    env["REACTOR_SETTINGS_JSON"] = json.dumps(reactor)
    env["REACTOR_TEST_CODE"] = code
    return env


def web_starts(env: dict[str, str], count: int) -> None:
    """A web process of the deploy ``env`` is on starts ``count`` background runs."""
    script = (
        "import django\ndjango.setup()\n"
        "from django_reactor import services\n"
        f"from {MODULE} import Checkout\n"
        f"for _ in range({count}):\n"
        "    services.run_in_background(Checkout, {})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, timeout=120, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()


def worker(env: dict[str, str], tmp_path: Path, started: list[Worker]) -> Worker:
    """A worker of the deploy ``env`` is on, importing the reactors when it starts (as a
    project's ``reactors`` modules are), so that its heartbeats say which versions it has."""
    process = Worker(env=env, queue=settings.REACTOR["CELERY_QUEUE"], log_dir=tmp_path)
    process.command += ["-I", MODULE]
    started.append(process)
    return process.start()


def kill(process: Worker) -> None:
    """SIGKILL the worker and its pool: whatever steps it was running are lost mid-flight."""
    assert process.process is not None
    os.killpg(os.getpgid(process.process.pid), signal.SIGKILL)
    process.process.wait(timeout=10)


def steps_done(version: str) -> int:
    return StepRecord.objects.filter(
        execution__reactor=REACTOR, execution__version=version, status="completed"
    ).count()


def test_every_run_completes_on_code_of_its_own_version(
    tmp_path: Path, worker_database: WorkerDatabase
) -> None:
    old, new = (
        code_env(tmp_path, worker_database, "old"),
        code_env(tmp_path, worker_database, "new"),
    )
    started: list[Worker] = []
    sweeper = start_sweeper(new, tmp_path / "sweeper.log", interval=0.3)
    try:
        # The web processes deployed first: both versions' runs wait before any worker has
        # version 2.
        web_starts(old, 6)
        web_starts(new, 6)
        first_old = worker(old, tmp_path, started)
        newer = Execution.objects.filter(reactor=REACTOR, version="2")
        wait_until(
            lambda: (
                ExecutionEvent.objects.filter(execution__in=newer, kind=EventKind.HAND_BACK)
                .values("execution")
                .distinct()
                .count()
                >= 1
            ),
            timeout=60,
            what="the old worker to hand back a version 2 run",
        )
        wait_until(lambda: steps_done("1") >= 3, timeout=60, what="version 1 steps")
        assert steps_done("2") == 0  # the old worker ran none of version 2's

        # New workers come up; old ones are killed and restarted mid-flight; more runs of
        # both versions start; then the new worker is killed too, and the old ones retire.
        first_new = worker(new, tmp_path, started)
        wait_until(lambda: steps_done("2") >= 2, timeout=60, what="version 2 steps")
        kill(first_old)
        second_old = worker(old, tmp_path, started)
        web_starts(old, 4)
        web_starts(new, 4)
        wait_until(lambda: steps_done("2") >= 8, timeout=90, what="more version 2 steps")
        kill(first_new)
        worker(new, tmp_path, started)
        wait_until(lambda: steps_done("1") >= 12, timeout=90, what="more version 1 steps")
        second_old.stop()

        runs = Execution.objects.filter(reactor=REACTOR)

        def all_ended() -> bool:
            return not runs.exclude(status=ExecutionStatus.COMPLETED).exists()

        wait_until(all_ended, timeout=180, what="every run to complete")
    finally:
        for process in started:
            process.stop()
        stop_process(sweeper)

    rows = list(runs)
    assert len(rows) == 20
    assert sorted(r.version for r in rows) == ["1"] * 10 + ["2"] * 10
    ran: dict[str, set[str]] = {"1": set(), "2": set()}
    for row in rows:
        records = {r.step: r.result for r in StepRecord.objects.filter(execution=row)}
        expected = ["reserve", "charge", "ship"] + (["tax"] if row.version == "2" else [])
        assert sorted(records) == sorted(expected), row.id
        for result in records.values():
            version, _, code = result.partition("@")
            assert version == row.version, (row.id, records)
            ran[version].add(code)
        if row.version == "2":
            assert {r.partition("@")[2] for r in records.values()} == {"new"}
    # Version 1 ran on both deploys' workers; version 2 only on the new one's.
    assert ran == {"1": {"old", "new"}, "2": {"new"}}
    # A run handed back says why; handed back again for the same reason, it keeps one entry.
    backs = ExecutionEvent.objects.filter(execution__version="2", kind=EventKind.HAND_BACK)
    assert backs.exists()
    assert all("this worker lacks version '2'" in e.data["error"] for e in backs)
    for row in rows:
        kinds = [e.kind for e in ExecutionEvent.objects.filter(execution=row)]
        assert kinds.count(EventKind.HAND_BACK) <= 4, row.id
