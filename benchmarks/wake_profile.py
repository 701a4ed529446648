"""What resuming a woken run costs a worker and PostgreSQL (profiling aid for
``sleeping_runs.py``).

Run from the repository root, with the same servers as ``sleeping_runs.py``::

    .venv/bin/python benchmarks/wake_profile.py [--runs 2000] [--rounds 2]

It starts ``--runs`` runs of ``NapsUntil`` inline (each sleeps an hour), moves their times so
that they are due, sweeps once in this process (the sweep's messages go to a queue nobody
consumes, emptied at the end), then resumes them in this process exactly as the worker's
``django_reactor.resume_many`` task does, 50 runs a message, once claiming each run on its turn
(as before ``store.claim_ahead``) and once claiming ahead; it alternates the two over
``--rounds`` rounds, new runs each time, and prints per run: wall time, this process's CPU,
the CPU of the PostgreSQL backend serving it (from ``/proc``), and statements sent.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import sleeping_runs  # sets the settings module and the database
from benchmarks.common import backend_cpu
from benchmarks.driver_counts import Counters

SCRATCH_QUEUE = f"{sleeping_runs.QUEUE}_profile"
os.environ["REACTOR_BENCH_QUEUE"] = SCRATCH_QUEUE  # nothing consumes it
COUNTERS = Counters()


def cpu_of_backend() -> float:
    """CPU seconds the PostgreSQL backend serving this process used so far."""
    from django.db import connection

    connection.ensure_connection()
    return backend_cpu(connection.connection.info.backend_pid) or 0.0


def woken_runs(count: int, sweeps: list[dict[str, float]]) -> list[Any]:
    """``count`` runs asleep, then due and woken by the sweep (their sleeps ended); what the
    sweep cost a run goes to ``sweeps``."""
    from django.utils import timezone

    from benchmarks.bg_reactors import NapsUntil
    from django_reactor import services
    from django_reactor.store import time_in_tests

    wake = timezone.now() + dt.timedelta(hours=1)
    ids = [NapsUntil.run({"at": wake.isoformat()}).execution_id for _ in range(count)]
    time_in_tests.shift_due_times(dt.timedelta(hours=1, seconds=1))
    cpu, backend, wall = time.process_time(), cpu_of_backend(), time.perf_counter()
    while services.sweep().woken:
        pass
    sweeps.append(
        {
            "sweep wall": (time.perf_counter() - wall) / count * 1000,
            "sweep cpu": (time.process_time() - cpu) / count * 1000,
            "sweep backend": (cpu_of_backend() - backend) / count * 1000,
        }
    )
    return ids


def resume_all(ids: list[Any], *, ahead: bool) -> dict[str, float]:
    """Resume ``ids`` 50 a message; per run: wall ms, process CPU ms, backend CPU ms,
    statements."""
    from django_reactor import services, store
    from django_reactor.celery.router import BATCH

    original = store.claim_ahead
    if not ahead:
        store.claim_ahead = lambda execution_ids, owner: {}  # type: ignore[assignment]
    try:
        with COUNTERS.counting():
            cpu, backend, wall = time.process_time(), cpu_of_backend(), time.perf_counter()
            for start in range(0, len(ids), BATCH):
                services.resume_many(ids[start : start + BATCH])
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
            backend = cpu_of_backend() - backend
    finally:
        store.claim_ahead = original  # type: ignore[assignment]
    n = len(ids)
    return {
        "wall": wall / n * 1000,
        "cpu": cpu / n * 1000,
        "backend": backend / n * 1000,
        "statements": sum(COUNTERS.statements.values()) / n,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    sleeping_runs.ensure_database(sleeping_runs.DATABASE)
    sleeping_runs.setup_django()
    COUNTERS.install()
    from django.db import connection

    from django_reactor.models import Execution

    figures: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    sweeps: list[dict[str, float]] = []
    try:
        for round_ in range(args.rounds):
            for ahead in (False, True) if round_ % 2 == 0 else (True, False):
                ids = woken_runs(args.runs, sweeps)
                figures[ahead].append(resume_all(ids, ahead=ahead))
                done = Execution.objects.filter(pk__in=ids, status="completed").count()
                if done != len(ids):
                    raise SystemExit(f"only {done} of {len(ids)} runs completed")
    finally:
        connection.close()
        sleeping_runs.empty_queue_named(SCRATCH_QUEUE)
    print(f"{args.runs} woken runs of NapsUntil resumed in this process, 50 a message, per run")
    print(f"{'':34}{'each on its turn':>18}{'claimed ahead':>16}")
    for key, label in (
        ("wall", "wall ms"),
        ("cpu", "CPU of this process ms"),
        ("backend", "CPU of its PostgreSQL backend ms"),
        ("statements", "statements"),
    ):
        row = [statistics.median(f[key] for f in figures[ahead]) for ahead in (False, True)]
        print(f"{label:34}{row[0]:>18.3f}{row[1]:>16.3f}")
    print("the sweep that woke them, per run (in this process, publishing to a scratch queue)")
    for key, label in (
        ("sweep wall", "wall ms"),
        ("sweep cpu", "CPU of this process ms"),
        ("sweep backend", "CPU of its PostgreSQL backend ms"),
    ):
        print(f"{label:34}{statistics.median(s[key] for s in sweeps):>18.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
