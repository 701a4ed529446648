"""Anchor of ``background_throughput.py``: a DBOS ``Queue`` and a 10-step workflow on workers.

What a DBOS user writes for durable 10-step background runs, following DBOS's "queue worker"
pattern (docs.dbos.dev, Python, examples/queue-worker): the caller enqueues with a
``DBOSClient`` and never executes workflows; separate worker processes each ``DBOS.launch()``
against the same system database, declare the queue, and dequeue and run what it holds.

* the workflow: ``run10``, ten ``@DBOS.step()`` no-op steps (``DBOS`` checkpoints each step's
  output in ``dbos.operation_outputs``, and the workflow's status and result in
  ``dbos.workflow_status``);
* the queue: ``DBOS.register_queue(QUEUE, worker_concurrency=..., polling_interval_sec=...)``,
  registered by every worker at start (``on_conflict="always_update"``). Each worker has one
  queue thread per queue that polls the system database every ``polling_interval_sec``
  (DBOS's default is 1 s; DBOS does not wake a worker on enqueue) and claims what its
  ``worker_concurrency`` leaves room for, with ``FOR UPDATE SKIP LOCKED``; the claimed
  workflows run on that process's thread pool;
* the workers: ``python benchmarks/dbos_queue_anchor.py worker --name NAME``, one process
  each, a distinct ``executor_id`` each (the DBOS docs require one per process when
  ``worker_concurrency`` is set). ``background_throughput.py`` starts two, as many as the
  prefork processes of the Celery workers it compares with;
* the caller: ``DBOSClient(system_database_url=..., application_name=APP).enqueue(...)``
  writes the workflow's ``ENQUEUED`` row; completion is read from ``dbos.workflow_status``.

The system database is ``dbos_queue_bench`` on the benchmark server (``BENCH_PG``); the first
worker's launch creates DBOS's tables in it, and :func:`empty` empties its workflow tables.
Run on its own, this module measures one burst and the sequential latency::

    .venv/bin/python benchmarks/dbos_queue_anchor.py [--burst 200] [--latency 50]
        [--processes 2] [--worker-concurrency 0] [--poll 0.01]

Defaults (:data:`WORKER_CONCURRENCY`, :data:`POLL_INTERVAL`), as ``background_throughput.py``
uses them: no per-worker concurrency limit (DBOS's default: a poll claims every runnable
workflow and runs them on the process's threads; a limit of 8 per process measured the same,
1 per process, like a prefork child, about half), and a 10 ms polling interval rather than
DBOS's default 1 s, so that polling does not bound DBOS's latency (at 1 s the median latency
is about 0.6 s) or a burst's throughput.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, ensure_database, percentile
from benchmarks.workers import BenchmarkError, Service

DATABASE = "dbos_queue_bench"
DSN = f"{PG_SERVER}/{DATABASE}"
APP = "reactor_bench_dbos_queue"
QUEUE = "bench_runs"
WORKFLOW = "run10"
STEPS = 10
WORKER_CONCURRENCY: int | None = None  # workflows at a time per worker process: no limit
POLL_INTERVAL = 0.01  # s between two polls of the queue by a worker
WAIT_LIMIT = 60.0  # s: the longest a burst (or one run) may take before it is abandoned


def config(executor_id: str | None = None) -> dict[str, Any]:
    """The ``DBOSConfig`` of the workers (and of nothing else: the caller is a client)."""
    got: dict[str, Any] = {"name": APP, "system_database_url": DSN, "log_level": "WARNING"}
    if executor_id is not None:
        got["executor_id"] = executor_id
    return got


# ---------------------------------------------------------------------------- the worker


def serve(name: str, *, concurrency: int | None, poll: float) -> None:
    """One worker process: launch DBOS, register the queue, run what it holds until SIGTERM."""
    import logging

    from dbos import DBOS

    DBOS(config=config(name))  # type: ignore[arg-type]  # a TypedDict built as a dict

    @DBOS.step()
    def noop(value: int) -> int:
        return value

    @DBOS.workflow(name=WORKFLOW)
    def run10(value: int) -> int:
        for _ in range(STEPS):
            value = noop(value)
        return value

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    DBOS.launch()
    for logger in ("dbos", "sqlalchemy"):
        logging.getLogger(logger).setLevel(logging.WARNING)
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=concurrency,
        polling_interval_sec=poll,
        on_conflict="always_update",
    )
    print("ready.", flush=True)  # what benchmarks.workers.Service waits for
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=5)


def worker(
    name: str, logs: Path, *, concurrency: int | None, poll: float, env: dict[str, str]
) -> Service:
    """One DBOS worker process (:func:`serve`), started and stopped like a Celery worker."""
    command = [
        sys.executable, str(Path(__file__).resolve()), "worker", "--name", name,
        "--worker-concurrency", str(concurrency or 0), "--poll", str(poll),
    ]  # fmt: skip
    return Service(name, command, env, logs)


@contextlib.contextmanager
def workers(
    logs: Path, *, processes: int, concurrency: int | None, poll: float, prefix: str = "dbos"
) -> Iterator[list[Service]]:
    """``processes`` DBOS workers on the system database, stopped on the way out."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    started: list[Service] = []
    try:
        for i in range(processes):
            one = worker(f"{prefix}-{i + 1}", logs, concurrency=concurrency, poll=poll, env=env)
            started.append(one)
            one.start()
        yield started
    finally:
        for one in started:
            one.stop()


# ---------------------------------------------------------------------------- the caller


def empty() -> None:
    """Empty the system database's workflow tables (the queue's configuration stays).

    Call it once a worker has started: the first launch creates DBOS's tables.
    """
    import psycopg

    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("TRUNCATE dbos.workflow_status CASCADE")


class Caller:
    """This process's side of the anchor: a ``DBOSClient`` and one connection to poll with.

    Both open on first use and again after :meth:`close`. ``polls[DATABASE]`` counts the
    read-only transactions of the polls (a benchmark takes them off the ``pg_stat`` commits).
    """

    def __init__(self, polls: dict[str, int] | None = None) -> None:
        self.polls = polls if polls is not None else {}
        self.polls.setdefault(DATABASE, 0)
        self._client: Any = None
        self._conn: Any = None

    def client(self) -> Any:
        from dbos import DBOSClient

        if self._client is None:
            self._client = DBOSClient(system_database_url=DSN, application_name=APP)
        return self._client

    def connection(self) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(DSN, autocommit=True)
        return self._conn

    def close(self) -> None:
        if self._client is not None:
            self._client.destroy()
            self._client = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def submit(self, count: int) -> tuple[list[str], float]:
        """Enqueue ``count`` runs as fast as possible; return their ids and the start time."""
        enqueue = self.client().enqueue
        options: Any = {"queue_name": QUEUE, "workflow_name": WORKFLOW}
        started = time.perf_counter()
        return [enqueue(options, i).workflow_id for i in range(count)], started

    def wait(self, ids: list[str], *, pause: float, limit: float = WAIT_LIMIT) -> float:
        """Poll ``dbos.workflow_status`` until every run in ``ids`` succeeded; return when."""
        conn = self.connection()
        deadline = time.perf_counter() + limit
        while True:
            self.polls[DATABASE] += 1
            done, failed = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), "
                "count(*) FILTER (WHERE status IN ('ERROR', 'CANCELLED', "
                "'MAX_RECOVERY_ATTEMPTS_EXCEEDED')) "
                "FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s)",
                (ids,),
            ).fetchone()
            now = time.perf_counter()
            if done == len(ids):
                return now
            if failed:
                raise BenchmarkError(f"{failed} DBOS workflow(s) ended without succeeding")
            if now > deadline:
                raise BenchmarkError(f"only {done}/{len(ids)} DBOS runs done after {limit:.0f} s")
            time.sleep(pause)

    def burst(self, count: int, *, pause: float) -> float:
        """Enqueue ``count`` runs at once; return runs/s until the last one succeeded."""
        ids, started = self.submit(count)
        return count / (self.wait(ids, pause=pause) - started)

    def latency(self, samples: int) -> list[float]:
        """Seconds from the enqueue to the row reading ``SUCCESS``, one run at a time."""
        times: list[float] = []
        for _ in range(samples):
            t0 = time.perf_counter()
            ids, _ = self.submit(1)
            times.append(self.wait(ids, pause=0.001, limit=30.0) - t0)
        return times


# ---------------------------------------------------------------------------- on its own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="bench", choices=["bench", "worker"])
    parser.add_argument("--name", default="dbos-worker", help="worker: its executor id")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (2)")
    parser.add_argument(
        "--worker-concurrency",
        type=int,
        default=WORKER_CONCURRENCY or 0,
        help="workflows at a time per worker process, 0 for no limit (0)",
    )
    parser.add_argument(
        "--poll",
        type=float,
        default=POLL_INTERVAL,
        help=f"queue polling interval, s ({POLL_INTERVAL})",
    )
    parser.add_argument("--burst", type=int, default=200, help="runs per burst (200)")
    parser.add_argument("--latency", type=int, default=50, help="sequential latency runs (50)")
    args = parser.parse_args(argv)
    concurrency = args.worker_concurrency or None
    if args.role == "worker":
        serve(args.name, concurrency=concurrency, poll=args.poll)
        return 0
    ensure_database(DATABASE)
    with (
        tempfile.TemporaryDirectory(prefix="reactor-bench-dbos-") as logs,
        workers(Path(logs), processes=args.processes, concurrency=concurrency, poll=args.poll),
    ):
        empty()
        caller = Caller()
        try:
            caller.wait(caller.submit(20)[0], pause=0.02)  # warm-up
            rate = caller.burst(args.burst, pause=0.02)
            ms = [t * 1000 for t in caller.latency(args.latency)]
        finally:
            caller.close()
    print(
        f"DBOS queue: {args.burst} runs of {STEPS} steps on {args.processes} worker process(es), "
        f"worker_concurrency={concurrency}, polling every {args.poll} s"
    )
    print(f"  runs/s: {rate:.1f}")
    print(
        f"  latency enqueue -> SUCCESS ({len(ms)} sequential runs): "
        f"median {statistics.median(ms):.2f} ms, p99 {percentile(ms, 0.99):.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
