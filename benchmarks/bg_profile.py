"""Where a worker's time goes for one background run of ``Chain10`` (profiling aid).

Run from the repository root, with the same servers as ``background_throughput.py``::

    .venv/bin/python benchmarks/bg_profile.py [--runs 100] [--cprofile]

It starts ``--runs`` background runs (their Celery messages go to a scratch queue that nothing
consumes and that is deleted at the end), then executes each one in this process exactly as the
worker task does (``django_reactor.services.resume(execution_id)``), and reports per run:

* the median wall time of ``run()`` on the caller's side, and of ``resume()`` in two settings:
  with a new database connection for every run (what a Celery worker does with the project's
  settings: Celery's Django fixup closes the connection before and after every task) and with
  one connection reused;
* the time spent in each stage of ``resume()`` (claim, reads, checkpoints...);
* the statements, transactions and connections each run costs, counted at the driver (psycopg)
  level, so the checkpoint statements that bypass Django's cursor are counted too;
* with ``--cprofile``, the function calls a run and the top functions by own time over runs
  on a reused connection.

It uses the benchmark database ``reactor_bench_bg`` (emptied first, like the benchmark does).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import os
import pstats
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import background_throughput as bench
from benchmarks.driver_counts import Counters

SCRATCH_QUEUE = f"{bench.REACTOR_QUEUE}_profile"
os.environ["REACTOR_BENCH_QUEUE"] = SCRATCH_QUEUE  # nothing consumes it


class Stages:
    """Wall time spent in named functions of django_reactor, per call site."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = collections.defaultdict(list)

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        times = self.times[label]

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                times.append(time.perf_counter() - t0)

        setattr(owner, name, timed)

    def clear(self) -> None:
        for values in self.times.values():
            values.clear()


def install_stages() -> Stages:
    from django_reactor import services, store
    from django_reactor.engine.executor import Executor

    stages = Stages()
    for name in ("claim_for_worker", "get_row", "step_records_done", "run_records"):
        if hasattr(store, name):  # the resume path changes; time what exists
            stages.wrap(store, name, f"store.{name}")
    stages.wrap(store.LeaseKeeper, "__enter__", "LeaseKeeper enter (shared heartbeat)")
    stages.wrap(store.LeaseKeeper, "__exit__", "LeaseKeeper exit")
    stages.wrap(store.DatabaseJournal, "commit", "checkpoints (DatabaseJournal.commit)")
    stages.wrap(Executor, "_run_step", "  steps incl. their checkpoint (_run_step)")
    stages.wrap(services, "resume", "resume() total")
    return stages


def submit(count: int) -> tuple[list[uuid.UUID], list[float]]:
    from benchmarks.bg_reactors import Chain10

    ids: list[uuid.UUID] = []
    times: list[float] = []
    for _ in range(count):
        t0 = time.perf_counter()
        ids.append(Chain10.run({}).execution_id)
        times.append(time.perf_counter() - t0)
    return ids, times


def resume_all(ids: list[uuid.UUID], *, fresh_connection: bool) -> list[float]:
    from django.db import connections

    from django_reactor import services

    connect_times: list[float] = []
    for execution_id in ids:
        if fresh_connection:  # as Celery's Django fixup does around every task
            connections.close_all()
            t0 = time.perf_counter()
            connections["default"].ensure_connection()
            connect_times.append(time.perf_counter() - t0)
        services.resume(execution_id)
    return connect_times


def ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else 0.0


def per_run(values: list[float], runs: int) -> float:
    return sum(values) / runs * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs measured per setting (100)")
    parser.add_argument("--cprofile", action="store_true", help="print the top functions")
    args = parser.parse_args(argv)
    runs: int = max(1, args.runs)

    bench.ensure_database(bench.REACTOR_DB)
    bench.setup_django()
    import testproject  # noqa: F401  (the project's Celery app)

    counters = Counters()
    counters.install()
    stages = install_stages()
    try:
        ids, _ = submit(10)
        resume_all(ids, fresh_connection=True)  # warm-up
        with counters.counting():
            ids, submit_times = submit(runs)
        submit_counts = (sum(counters.statements.values()), counters.commits)
        results: dict[bool, tuple[list[float], dict[str, list[float]]]] = {}
        counted: dict[bool, Counters] = {}
        cpu: dict[bool, bench.CpuSample] = {}
        for fresh in (True, False):
            stages.clear()
            ids, _ = submit(runs)
            local = Counters()
            with counters.counting():
                before = bench.CpuSample.take()
                connect = resume_all(ids, fresh_connection=fresh)
                cpu[fresh] = before.until(bench.CpuSample.take())
            local.statements = collections.Counter(counters.statements)
            local.commits, local.connects = counters.commits, counters.connects
            counted[fresh] = local
            results[fresh] = (connect, {k: list(v) for k, v in stages.times.items()})
        if args.cprofile:  # a separate pass: the profiler inflates the timings above
            # With the connection reused, as a worker with the recommended settings runs
            # (with a fresh one, connecting dominates the profile).
            ids, _ = submit(runs)
            profile = cProfile.Profile()
            profile.enable()
            resume_all(ids, fresh_connection=False)
            profile.disable()
            stats = pstats.Stats(profile)
            print(
                f"cProfile, {runs} resume() calls on a reused connection "
                f"({stats.total_calls / runs:.0f} function calls a run), by own time:"
            )
            stats.sort_stats("tottime").print_stats(15)
    finally:
        _drop_scratch_queue()

    print(f"{runs} background runs of Chain10 (10 no-op steps), resumed in this process")
    print(
        f"caller: run() median {ms(submit_times):.2f} ms, "
        f"{submit_counts[0] / runs:.1f} statements and {submit_counts[1] / runs:.1f} commits a run"
    )
    print()
    print(f"{'per run (ms; stage = total time / runs)':52}{'fresh conn':>12}{'reused conn':>12}")
    fresh_connect = results[True][0]
    print(
        f"{'connect (Django ensure_connection)':52}{per_run(fresh_connect, runs):>12.3f}{'-':>12}"
    )
    labels = list(results[True][1])
    for label in labels:
        cells = []
        for fresh in (True, False):
            times = results[fresh][1].get(label, [])
            cells.append(f"{per_run(times, runs):>12.3f}" if times else f"{'not called':>12}")
        print(f"{label:52}{''.join(cells)}")
    for title, attr in (("CPU of this process", "ours"), ("CPU of PostgreSQL", "postgres")):
        a, b = (getattr(cpu[fresh], attr) / runs * 1000 for fresh in (True, False))
        print(f"{title:52}{a:>12.3f}{b:>12.3f}")
    print()
    for fresh in (True, False):
        c = counted[fresh]
        total = sum(c.statements.values())
        print(
            f"{'fresh' if fresh else 'reused'} connection: {total / runs:.1f} statements, "
            f"{c.commits / runs:.1f} commits, {c.connects / runs:.1f} connections per run"
        )
        for kind, n in c.statements.most_common():
            print(f"    {n / runs:5.1f}  {kind}")
    return 0


def _drop_scratch_queue() -> None:
    import redis

    client = redis.Redis.from_url(f"{bench.REDIS_SERVER}/{bench.REACTOR_REDIS_DB}")
    try:
        keys = [SCRATCH_QUEUE, *client.scan_iter(match=f"_kombu.binding*.{SCRATCH_QUEUE}")]
        client.delete(*keys)
    finally:
        client.close()


if __name__ == "__main__":
    main()
    sys.exit(0)
