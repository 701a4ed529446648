"""Django's tasks framework: tasks through ``ReactorBackend`` beside django-tasks-db's worker,
on the same PostgreSQL database, in the same run.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379; ``pip install -e '.[bench]'`` for django-tasks-db)::

    .venv/bin/python benchmarks/tasks_backend.py [--rounds 2] [--burst 500] [--latency 50]

What it measures
----------------
The same no-op task (``benchmarks.tasks_functions``: ``echo(value)`` returns its argument),
enqueued with ``.enqueue(i)`` from this process, one autocommit transaction each (as a view
would), on two backends of one project (``benchmarks.tasks_settings``), database
``reactor_bench_tasks`` (created and migrated if missing):

* **ours**: ``django_reactor.tasks.ReactorBackend``. Each task is a one-step background run,
  published on Celery (Redis db 11, its own queue) and run by one Celery worker with two
  prefork processes (``celery -A testproject worker -P prefork -c 2``).
* **anchor**: ``django_tasks_db.DatabaseBackend`` and two ``manage.py db_worker --backend db``
  processes (as many as the prefork children), polling every ``--db-interval`` seconds
  (0.01: the polling interval does not bound it; its default is 1 s).

Per phase: ``--warmup`` untimed tasks, then a burst of ``--burst`` tasks enqueued as fast as
this process can: throughput = burst / (last finish - first enqueue, from the rows' own
timestamps), the time ``enqueue()`` took a task here, and each task's latency (its finish -
its enqueue) as p50 and p95. Then ``--latency`` tasks one at a time, each timed here from
``enqueue()`` until its row reads successful (polled every ~1 ms): p50 and p99. Phases
alternate for ``--rounds`` rounds (the order flips every round); the medians over rounds are
compared as ratios ours / anchor (throughput: higher is better; the others: lower is better).

Workers are always stopped, even on errors; ``--logs DIR`` keeps their logs. Override the
servers with ``BENCH_PG`` and ``BENCH_REDIS``. The exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, ensure_database, percentile
from benchmarks.workers import BenchmarkError, Service, Worker

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
DATABASE = "reactor_bench_tasks"
REDIS_DB = 11
QUEUE = "django_reactor_bench_tasks"
WORKER_PROCESSES = 2
WAIT_LIMIT = 120.0  # seconds: the longest a burst (or one task) may take

os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.tasks_settings"
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"
os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{REDIS_DB}"
os.environ["REACTOR_BENCH_QUEUE"] = QUEUE


@dataclass
class Figures:
    """One backend's figures, a list per measure (one entry per round)."""

    throughput: list[float] = field(default_factory=list)
    enqueue_ms: list[float] = field(default_factory=list)
    burst_p50: list[float] = field(default_factory=list)
    burst_p95: list[float] = field(default_factory=list)
    latency_p50: list[float] = field(default_factory=list)
    latency_p99: list[float] = field(default_factory=list)


class Backend:
    """How the benchmark drives one backend: its workers, enqueue, and its finished rows."""

    name = ""

    def start(self, logs: Path) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def enqueue(self, value: int) -> str:
        raise NotImplementedError

    def finished(self, ids: list[str]) -> list[tuple[Any, Any]]:
        """(enqueued, finished) of the tasks among ``ids`` that finished successfully."""
        raise NotImplementedError


class Ours(Backend):
    name = "ReactorBackend"

    def __init__(self) -> None:
        self.worker: Worker | None = None

    def start(self, logs: Path) -> None:
        self.worker = Worker(
            "tasks-ours", "testproject", QUEUE, dict(os.environ), logs, processes=WORKER_PROCESSES
        )
        self.worker.start()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    def enqueue(self, value: int) -> str:
        from benchmarks.tasks_functions import echo

        return echo.enqueue(value).id

    def finished(self, ids: list[str]) -> list[tuple[Any, Any]]:
        from django_reactor.models import Execution

        return list(
            Execution.objects.filter(id__in=ids, status="completed").values_list(
                "created_at", "finished_at"
            )
        )


class Anchor(Backend):
    name = "django-tasks-db"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.workers: list[Service] = []

    def start(self, logs: Path) -> None:
        for n in range(WORKER_PROCESSES):
            command = [
                sys.executable, "manage.py", "db_worker", "--backend", "db", "--interval",
                str(self.interval), "--no-startup-delay", "--no-reload",
                # bg_settings leave coordination on Redis without a URL (E010 for the example's
                # reactors); the workers of background_throughput.py skip it too.
                "--skip-checks",
            ]  # fmt: skip
            worker = Service(f"tasks-db-{n}", command, dict(os.environ), logs)
            self.workers.append(worker)
            with worker.log_path.open("wb") as log:
                import subprocess

                worker.process = subprocess.Popen(
                    command, env=worker.env, cwd=REPO_ROOT, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            wait(lambda w=worker: started(w), f"db_worker {n} to start")

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []

    def enqueue(self, value: int) -> str:
        from benchmarks.tasks_functions import echo_db

        return str(echo_db.enqueue(value).id)

    def finished(self, ids: list[str]) -> list[tuple[Any, Any]]:
        from django_tasks_db.models import DBTaskResult

        return list(
            DBTaskResult.objects.filter(id__in=ids, status="SUCCESSFUL").values_list(
                "enqueued_at", "finished_at"
            )
        )


def started(worker: Service) -> bool:
    """Whether db_worker ``worker`` serves (BenchmarkError when it exited)."""
    assert worker.process is not None
    if worker.process.poll() is not None:
        raise BenchmarkError(f"{worker.name} exited at start:\n{worker.log()[-3000:]}")
    return "Starting worker" in worker.log()


def wait(condition: Callable[[], Any], what: str, pause: float = 0.02) -> Any:
    deadline = time.monotonic() + WAIT_LIMIT
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out after {WAIT_LIMIT:.0f} s waiting for {what}")
        time.sleep(pause)
    return found


def setup() -> None:
    import django
    import redis
    from django.core.management import call_command

    ensure_database(DATABASE)
    django.setup()
    call_command("migrate", verbosity=0)
    from django.db import connection
    from django_tasks_db.models import DBTaskResult

    from django_reactor.models import Execution

    with connection.cursor() as cursor:  # a clean start: earlier runs' rows and messages
        cursor.execute(f"TRUNCATE {DBTaskResult._meta.db_table}")
        cursor.execute(f"TRUNCATE {Execution._meta.db_table} CASCADE")
    redis.Redis.from_url(f"{REDIS_SERVER}/{REDIS_DB}").flushdb()


def phase(backend: Backend, args: argparse.Namespace, logs: Path, figures: Figures) -> None:
    backend.start(logs)
    try:
        warm = [backend.enqueue(i) for i in range(args.warmup)]
        wait(lambda: len(backend.finished(warm)) == len(warm), f"{backend.name}'s warm-up")

        enqueuing = time.perf_counter()
        ids = [backend.enqueue(i) for i in range(args.burst)]
        figures.enqueue_ms.append((time.perf_counter() - enqueuing) * 1000 / len(ids))
        rows = wait(
            lambda: (found := backend.finished(ids)) and len(found) == len(ids) and found,
            f"{backend.name}'s burst",
        )
        first = min(enqueued for enqueued, _ in rows)
        last = max(done for _, done in rows)
        figures.throughput.append(len(ids) / (last - first).total_seconds())
        latencies = [(done - enqueued).total_seconds() * 1000 for enqueued, done in rows]
        figures.burst_p50.append(percentile(latencies, 0.5))
        figures.burst_p95.append(percentile(latencies, 0.95))

        timed = []
        for i in range(args.latency):
            started = time.perf_counter()
            one = [backend.enqueue(i)]
            wait(lambda one=one: backend.finished(one), f"{backend.name}'s task", pause=0.001)
            timed.append((time.perf_counter() - started) * 1000)
        figures.latency_p50.append(percentile(timed, 0.5))
        figures.latency_p99.append(percentile(timed, 0.99))
    finally:
        backend.stop()


def report(args: argparse.Namespace, ours: Figures, anchor: Figures) -> None:
    print(
        f"\n{args.rounds} round(s): burst {args.burst}, latency {args.latency} tasks, "
        f"{WORKER_PROCESSES} worker processes each; db_worker --interval {args.db_interval}"
    )
    rows = [
        ("throughput, tasks/s", "throughput", True),
        ("enqueue, ms a task", "enqueue_ms", False),
        ("burst latency p50, ms", "burst_p50", False),
        ("burst latency p95, ms", "burst_p95", False),
        ("one at a time p50, ms", "latency_p50", False),
        ("one at a time p99, ms", "latency_p99", False),
    ]
    print(f"{'':<24}{'ReactorBackend':>16}{'django-tasks-db':>17}{'ratio':>8}  better")
    for label, name, higher in rows:
        a = statistics.median(getattr(ours, name))
        b = statistics.median(getattr(anchor, name))
        print(f"{label:<24}{a:>16.1f}{b:>17.1f}{a / b:>7.2f}x  {'higher' if higher else 'lower'}")
    for label, figures in (("ReactorBackend", ours), ("django-tasks-db", anchor)):
        rounds = ", ".join(f"{t:.1f}" for t in figures.throughput)
        print(f"  {label} tasks/s by round: {rounds}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (2)")
    parser.add_argument("--burst", type=int, default=500, help="tasks per burst (500)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed tasks per phase (20)")
    parser.add_argument("--latency", type=int, default=50, help="tasks one at a time (50)")
    parser.add_argument(
        "--db-interval", type=float, default=0.01, help="db_worker's polling interval (0.01 s)"
    )
    parser.add_argument("--logs", type=Path, default=None, help="keep the workers' logs here")
    args = parser.parse_args(argv)
    setup()
    ours, anchor = Figures(), Figures()
    backends: list[tuple[Backend, Figures]] = [(Ours(), ours), (Anchor(args.db_interval), anchor)]
    with contextlib.ExitStack() as stack:
        logs = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        logs.mkdir(parents=True, exist_ok=True)
        for number in range(args.rounds):
            order = backends if number % 2 == 0 else backends[::-1]
            for backend, figures in order:
                started = time.monotonic()
                phase(backend, args, logs, figures)
                print(
                    f"round {number + 1}: {backend.name}: {figures.throughput[-1]:.1f} tasks/s, "
                    f"one at a time p50 {figures.latency_p50[-1]:.1f} ms "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    report(args, ours, anchor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
