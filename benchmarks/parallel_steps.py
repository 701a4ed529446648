"""Eight independent 100 ms I/O steps with ``Meta.max_concurrency = 8``, inline and on a worker.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/parallel_steps.py [--runs 20]

What it measures
----------------
The wall time of one run of ``IoSideBySide`` (``benchmarks/bg_reactors.py``): eight steps that
each wait 100 ms on I/O (``time.sleep``, as a call to a partner's API would), none reading
another's result, with ``Meta.max_concurrency = 8``:

* **inline**: ``IoSideBySide.run({})`` in this process, durable on PostgreSQL (database
  ``reactor_bench_par``), from the call until it returns; median and p90 of ``--runs`` runs
  after two warm-up runs. For contrast, the same steps one after another (``IoOneByOne``,
  ``max_concurrency = 1``), and the floor: 100 ms, the longest step.
* **on a worker**: ``IoSideBySideOnWorker.run({})`` (``Meta.background = "all"``) handed to one
  Celery worker (``-P prefork -c 1``, started by the script with
  ``DJANGO_SETTINGS_MODULE=benchmarks.bg_settings``, broker Redis db 11), from the call until a
  poll of the run's row (every 2 ms) reads ``completed``; median and p90 of ``--runs`` runs,
  one at a time, after two warm-up runs.

Target (issue 16): both medians under 0.25 s. The exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, ensure_database, percentile
from benchmarks.workers import BenchmarkError, Worker

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
DATABASE = "reactor_bench_par"
BROKER_DB = 11
QUEUE = "django_reactor_bench_par"
TARGET_SECONDS = 0.25
POLL = 0.002

os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bg_settings"
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"
os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{BROKER_DB}"
os.environ["REACTOR_BENCH_QUEUE"] = QUEUE


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def timed(run_once: Callable[[], None], runs: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        run_once()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run_once()
        times.append(time.perf_counter() - started)
    return times


def inline(reactor: type) -> Callable[[], None]:
    def run_once() -> None:
        outcome = reactor.run({})  # type: ignore[attr-defined]
        if not outcome.ok:
            raise BenchmarkError(f"{reactor.__name__} did not complete: {outcome!r}")

    return run_once


def on_worker() -> Callable[[], None]:
    from benchmarks.bg_reactors import IoSideBySideOnWorker
    from django_reactor import Dispatched
    from django_reactor.models import Execution

    def run_once() -> None:
        outcome = IoSideBySideOnWorker.run({})
        if not isinstance(outcome, Dispatched):
            raise BenchmarkError(f"run() did not dispatch the run: {outcome!r}")
        deadline = time.monotonic() + 30
        rows = Execution.objects.filter(pk=outcome.execution_id).values_list("status", flat=True)
        while (status := rows.first()) != "completed":
            if status in ("failed", "needs_attention") or time.monotonic() > deadline:
                raise BenchmarkError(f"the run on the worker ended {status}")
            time.sleep(POLL)

    return run_once


def line(name: str, times: list[float]) -> str:
    median = statistics.median(times)
    verdict = "PASS" if median < TARGET_SECONDS else "MISS"
    return (
        f"{name:34}{median:>9.3f}{percentile(times, 0.9):>9.3f}{min(times):>9.3f}"
        f"   {verdict if 'one by one' not in name else ''}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per figure (20)")
    args = parser.parse_args(argv)
    ensure_database(DATABASE)
    setup_django()
    from benchmarks.bg_reactors import IO_SECONDS, IO_STEPS, IoOneByOne, IoSideBySide

    side_by_side = timed(inline(IoSideBySide), args.runs)
    one_by_one = timed(inline(IoOneByOne), max(3, args.runs // 4))
    with tempfile.TemporaryDirectory() as logs:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        worker = Worker("parallel-steps", "testproject", QUEUE, env, Path(logs), processes=1)
        worker.start()
        try:
            from django.db import connection

            connection.close()  # the polls start on a fresh connection, like the worker's
            worker_times = timed(on_worker(), args.runs)
        finally:
            worker.stop()
    print(
        f"{IO_STEPS} independent steps of {IO_SECONDS * 1000:.0f} ms I/O each, "
        f"Meta.max_concurrency = {IO_STEPS}; seconds from run() to completed, {args.runs} runs"
    )
    print(f"{'':34}{'median':>9}{'p90':>9}{'min':>9}   target < {TARGET_SECONDS} s")
    print(line("inline, side by side", side_by_side))
    print(line("on a worker (-c 1), side by side", worker_times))
    print(line("inline, one by one (contrast)", one_by_one))
    print(f"floor: {IO_SECONDS:.3f} s (the longest step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
