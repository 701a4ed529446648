"""Throughput and latency of background reactors on one Celery worker, beside two anchors.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/background_throughput.py [--rounds 3] [--burst 200]

It takes about two minutes. Run it on an otherwise idle machine: it prints how many CPU seconds
other processes used meanwhile, and warns when they skewed the figures.

What it measures
----------------
* **django_reactor**: ``Chain10.run({})`` (``benchmarks.bg_reactors``: 10 chained no-op function
  steps, ``Meta.background = "all"``) returns a ``Dispatched`` outcome at once; one Celery worker
  (``celery -A testproject worker -P prefork -c 2``, its own queue on Redis db 12) runs the
  reactors against PostgreSQL (database ``reactor_bench_bg``, created and migrated if missing,
  emptied at start). A burst of ``--burst`` reactors is submitted as fast as this process can;
  throughput = burst / (time from the first submit until polling the execution table sees every
  one of them ``completed``).
* **Anchor**: a plain Celery ``chain`` of 10 trivial tasks (``benchmarks/chain_anchor.py``, as
  ``/work/shared/anchors/celery_chain_anchor.py``: Redis broker db 13, Redis result backend
  db 14, ``task_acks_late``, prefetch 1), its own worker with the same 2 prefork processes. A
  burst of ``--burst`` chains is submitted at once; throughput = burst / (time until every
  result is in).
* **Durable anchor** (the fair one, issue 15): a hand-written durable Celery task
  (``benchmarks/durable_task_anchor.py``: one task per run, a fenced claim, one fenced
  checkpoint statement per step, a finish; 13 commits per run; database
  ``reactor_bench_durable``, Redis broker db 15), its own worker with the same flags. A burst
  of ``--burst`` runs is submitted as fast as this process can; throughput = burst / (time until
  polling its run table sees every one completed).
* **DBOS queue anchor** (the one users compare with, issue 28): a DBOS ``Queue`` and a 10-step
  ``@DBOS.workflow`` (``benchmarks/dbos_queue_anchor.py``: DBOS's queue-worker pattern, the
  caller enqueues with a ``DBOSClient``; two DBOS worker processes, as many as the prefork
  children, on the same PostgreSQL, system database ``dbos_queue_bench``; no per-worker
  concurrency limit, DBOS's default; queues polled every 10 ms, not DBOS's default 1 s, so
  that polling does not bound it). A burst of ``--burst`` runs is enqueued as fast as this
  process can; throughput = burst / (time until polling ``dbos.workflow_status`` sees every
  one ``SUCCESS``). ``--no-dbos`` leaves it out.
* **Latency**: with the django_reactor worker, ``--latency`` sequential runs, each timed from
  ``run()`` until the execution row reads ``completed`` (polled every ~1 ms); median and p99.
  Measured in the last round, after its burst. The same for the DBOS queue anchor (enqueue
  until its status row reads ``SUCCESS``), in its last round.

The systems never run at the same time: each phase starts its own worker, warms it up
(``--warmup`` runs), measures and stops it. Phases alternate for ``--rounds`` rounds (the order
flips every round); the medians of the rounds' throughputs are compared. Targets (issue 15):
reactors/s is at least 3.0 times chains/s and at least 0.9 times the durable anchor's runs/s;
(issue 28) at least the DBOS queue's runs/s, at a latency no higher than its.

``pg_stat`` figures per run (``benchmarks/pgstats.py``), for django_reactor and the durable
and DBOS queue anchors, from the last round: after the warm-up the probe waits until the
worker's idle connections have flushed their statistics (about 10 s), snapshots the database,
and snapshots it again once the worker has stopped and this process closed its connections; the
window's figures are divided by the runs it held (the burst, plus the latency runs for
django_reactor and the DBOS queue).
Columns: commits (``pg_stat_database.xact_commit``, less this process's polls), WAL commit
records, WAL records and bytes (``pg_walinspect``, that database's records only; else
``pg_stat_wal``, server-wide), HOT share of the run table's updates (``pg_stat_user_tables``).
Statements are not known for workers without ``pg_stat_statements`` (``n/a``).

Redis queues used here are emptied at start (stale messages of an aborted run would skew it).
Workers and their children are always stopped, even on errors.

The django_reactor worker runs with the example project's Celery settings, under which Celery's
Django fixup closes the database connection before and after every task: every background run
opens a new PostgreSQL connection. ``--db-reuse-max N`` sets ``CELERY_DB_REUSE_MAX`` on that
worker to measure workers that keep their connection. ``--logs DIR`` keeps the workers' logs.
``benchmarks/bg_profile.py`` shows where a worker's time goes for one run.

Override the servers with ``BENCH_PG`` (default ``postgresql://postgres@127.0.0.1:5432``) and
``BENCH_REDIS`` (default ``redis://127.0.0.1:6379``). The exit code is 0 whatever the figures:
this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import dbos_queue_anchor
from benchmarks.common import PG_SERVER, cpu_busy, ensure_database, percentile
from benchmarks.pgstats import COLUMNS, Delta, Probe, legend, row
from benchmarks.workers import BenchmarkError, Worker

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
# Scripts that drive this one's django_reactor worker with their own database, Redis database
# and queue (benchmarks/capacity.py) set these three before importing it.
REACTOR_DB = os.environ.get("REACTOR_BENCH_DB", "reactor_bench_bg")
REACTOR_REDIS_DB = int(os.environ.get("REACTOR_BENCH_REDIS_DB", "12"))
REACTOR_QUEUE = os.environ.get("REACTOR_BENCH_QUEUE", "django_reactor_bench_bg")
ANCHOR_BROKER_DB = 13
ANCHOR_BACKEND_DB = 14
ANCHOR_QUEUE = "celery"  # the anchor's app uses Celery's default queue, alone in its database
DURABLE_DB = "reactor_bench_durable"
DURABLE_BROKER_DB = 15
DURABLE_QUEUE = "celery"  # the durable anchor's app too, alone in its broker database
STEPS = 10
TARGET_RATIO = 3.0  # reactors/s against the chain's chains/s
TARGET_DURABLE_RATIO = 0.9  # reactors/s against the durable anchor's runs/s (issue 15)
TARGET_DBOS_RATIO = 1.0  # reactors/s against the DBOS queue's runs/s (issue 28)
DBOS_DB = dbos_queue_anchor.DATABASE
RUN_TABLES = {
    "django_reactor": "django_reactor_execution",
    "durable anchor": "durable_run",
    "DBOS queue": "dbos.workflow_status",
}
WORKER_PROCESSES = 2
# Seconds between two polls of the execution table while a burst runs: one poll costs the server
# about 0.5 ms (200 ids), so polling much faster would take CPU from the worker.
BURST_POLL = 0.02
WAIT_LIMIT = 60.0  # seconds: the longest a burst (or one run) may take before it is abandoned

# The benchmark process and the django_reactor worker share these settings.
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bg_settings"
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{REACTOR_DB}"
os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{REACTOR_REDIS_DB}"
os.environ["REACTOR_BENCH_QUEUE"] = REACTOR_QUEUE
os.environ["BROKER"] = f"{REDIS_SERVER}/{ANCHOR_BROKER_DB}"
os.environ["BACKEND"] = f"{REDIS_SERVER}/{ANCHOR_BACKEND_DB}"
os.environ["DURABLE_BROKER"] = f"{REDIS_SERVER}/{DURABLE_BROKER_DB}"
os.environ["DURABLE_DSN"] = f"{PG_SERVER}/{DURABLE_DB}"


# ---------------------------------------------------------------------------- setup


def setup_django() -> None:
    """Configure Django, migrate the benchmark database and empty django_reactor's tables."""
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_reactor_execution, django_reactor_steprecord, "
            "django_reactor_executionevent, django_reactor_dispatch CASCADE"
        )


REDIS_KEYS = {
    REACTOR_REDIS_DB: [f"{REACTOR_QUEUE}*", "unacked*"],
    ANCHOR_BROKER_DB: [f"{ANCHOR_QUEUE}*", "unacked*"],
    ANCHOR_BACKEND_DB: ["celery-task-meta-*"],
    DURABLE_BROKER_DB: [f"{DURABLE_QUEUE}*", "unacked*"],
}


def redis_messages(db: int, *, delete: bool = False) -> dict[str, int]:
    """Messages waiting or unacknowledged in this benchmark's keys of Redis database ``db``."""
    import redis

    found: dict[str, int] = {}
    client = redis.Redis.from_url(f"{REDIS_SERVER}/{db}")
    try:
        keys = {key for pattern in REDIS_KEYS[db] for key in client.scan_iter(match=pattern)}
        for key in keys:
            kind = client.type(key)
            if kind == b"list":
                count = int(client.llen(key))
            elif kind == b"hash" and key == b"unacked":
                count = int(client.hlen(key))
            else:
                continue
            if count:
                found[f"db{db}:{key.decode(errors='replace')}"] = count
        if delete and keys:
            client.delete(*keys)
    finally:
        client.close()
    return found


def wait_acked(db: int, limit: float = 3.0) -> None:
    """Wait until the worker acknowledged every message it took (bounded).

    The benchmark sees a run completed a moment before the worker acknowledges its message;
    stopping the worker in between makes Celery give the message back to the queue.
    """
    import redis

    client = redis.Redis.from_url(f"{REDIS_SERVER}/{db}")
    deadline = time.monotonic() + limit
    try:
        while client.hlen("unacked") and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        client.close()


def clean_redis() -> dict[str, int]:
    """Delete the queues (and unacked messages) this benchmark uses; return what was dropped."""
    return {k: v for db in REDIS_KEYS for k, v in redis_messages(db, delete=True).items()}


# ---------------------------------------------------------------------------- workers


def worker_env(*, django: bool) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if not django:
        # The anchor's worker is plain Celery: without this, Celery installs its Django fixup.
        env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


@contextlib.contextmanager
def running(worker: Worker, registry: list[Worker]) -> Iterator[Worker]:
    registry.append(worker)
    try:
        yield worker.start()
    finally:
        worker.stop()
        registry.remove(worker)


# ---------------------------------------------------------------------------- django_reactor


def reactor_submit(count: int) -> tuple[list[uuid.UUID], float]:
    """Start ``count`` background runs as fast as possible; return their ids and the start time."""
    from benchmarks.bg_reactors import Chain10
    from django_reactor import Dispatched

    run = Chain10.run
    ids: list[uuid.UUID] = []
    started = time.perf_counter()
    for _ in range(count):
        outcome = run({})
        if not isinstance(outcome, Dispatched):
            raise BenchmarkError(f"run() did not dispatch the run: {outcome!r}")
        ids.append(outcome.execution_id)
    return ids, started


#: Read-only transactions this process ran against a benchmark database while it waited (the
#: polls), by database: taken off the ``pg_stat`` commits.
POLLS: dict[str, int] = {REACTOR_DB: 0, DURABLE_DB: 0, DBOS_DB: 0}


def reactor_wait(ids: list[uuid.UUID], *, pause: float, limit: float = WAIT_LIMIT) -> float:
    """Poll the execution table until every run in ``ids`` is completed; return that moment."""
    from django.db import connection

    deadline = time.perf_counter() + limit
    with connection.cursor() as cursor:
        while True:
            POLLS[REACTOR_DB] += 1
            cursor.execute(
                "SELECT count(*) FILTER (WHERE status = 'completed'), "
                "count(*) FILTER (WHERE finished_at IS NOT NULL AND status <> 'completed') "
                "FROM django_reactor_execution WHERE id = ANY(%s)",
                [ids],
            )
            done, ended_otherwise = cursor.fetchone()
            now = time.perf_counter()
            if done == len(ids):
                return now
            if ended_otherwise:
                raise BenchmarkError(f"{ended_otherwise} run(s) finished without completing")
            if now > deadline:
                raise BenchmarkError(f"only {done}/{len(ids)} runs completed after {limit:.0f} s")
            time.sleep(pause)


def reactor_burst(count: int) -> tuple[float, float]:
    """Submit ``count`` runs at once; return (reactors/s, seconds the submissions took)."""
    ids, started = reactor_submit(count)
    submitted = time.perf_counter() - started
    finished = reactor_wait(ids, pause=BURST_POLL)
    return count / (finished - started), submitted


def reactor_latency(samples: int) -> list[float]:
    """Seconds from ``run()`` to the row reading ``completed``, one run at a time."""
    from django.db import connection

    from benchmarks.bg_reactors import Chain10

    times: list[float] = []
    with connection.cursor() as cursor:
        for _ in range(samples):
            t0 = time.perf_counter()
            execution_id = Chain10.run({}).execution_id
            deadline = t0 + 30.0
            while True:
                POLLS[REACTOR_DB] += 1
                cursor.execute(
                    "SELECT status, finished_at IS NOT NULL FROM django_reactor_execution "
                    "WHERE id = %s",
                    [execution_id],
                )
                status, finished = cursor.fetchone()
                if status == "completed":
                    times.append(time.perf_counter() - t0)
                    break
                if finished:
                    raise BenchmarkError(f"run {execution_id} ended {status}")
                if time.perf_counter() > deadline:
                    raise BenchmarkError(f"run {execution_id} did not complete within 30 s")
                time.sleep(0.001)
    return times


# ---------------------------------------------------------------------------- anchor


def anchor_burst(count: int, *, timeout: float = WAIT_LIMIT) -> float:
    """Submit ``count`` chains at once, wait for every result; return chains/s."""
    from benchmarks.chain_anchor import signature

    deadline = time.monotonic() + timeout
    started = time.perf_counter()
    results = [signature(i, STEPS).apply_async() for i in range(count)]
    for i, result in enumerate(results):
        remaining = max(0.1, deadline - time.monotonic())
        value = result.get(timeout=remaining)
        if value != i + STEPS:
            raise BenchmarkError(f"chain {i} returned {value!r}, expected {i + STEPS}")
    return count / (time.perf_counter() - started)


# ---------------------------------------------------------------------------- durable anchor


class DurableCaller:
    """This process's side of the durable anchor: one kept autocommit connection."""

    def __init__(self) -> None:
        self.conn: Any = None

    def connection(self) -> Any:
        import psycopg

        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(f"{PG_SERVER}/{DURABLE_DB}", autocommit=True)
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


DURABLE = DurableCaller()


def setup_durable() -> None:
    """Create the durable anchor's database and tables, and empty them."""
    from benchmarks.durable_task_anchor import create_schema

    ensure_database(DURABLE_DB)
    create_schema(DURABLE.connection())


def durable_submit(count: int) -> tuple[list[uuid.UUID], float]:
    from benchmarks.durable_task_anchor import submit

    conn = DURABLE.connection()
    started = time.perf_counter()
    return [submit(conn) for _ in range(count)], started


def durable_wait(ids: list[uuid.UUID], *, pause: float, limit: float = WAIT_LIMIT) -> float:
    """Poll the anchor's run table until every run in ``ids`` is completed; return that moment."""
    conn = DURABLE.connection()
    deadline = time.perf_counter() + limit
    while True:
        POLLS[DURABLE_DB] += 1
        done = conn.execute(
            "SELECT count(*) FROM durable_run WHERE id = ANY(%s) AND status = 'completed'",
            (ids,),
        ).fetchone()[0]
        now = time.perf_counter()
        if done == len(ids):
            return now
        if now > deadline:
            raise BenchmarkError(
                f"only {done}/{len(ids)} durable runs completed after {limit:.0f} s"
            )
        time.sleep(pause)


def durable_burst(count: int) -> float:
    """Submit ``count`` durable anchor runs at once; return runs/s."""
    ids, started = durable_submit(count)
    finished = durable_wait(ids, pause=BURST_POLL)
    return count / (finished - started)


# ---------------------------------------------------------------------------- the run


@dataclass
class Figures:
    reactors_per_s: list[float] = field(default_factory=list)
    submit_s: list[float] = field(default_factory=list)
    chains_per_s: list[float] = field(default_factory=list)
    durable_per_s: list[float] = field(default_factory=list)
    dbos_per_s: list[float] = field(default_factory=list)
    dbos_latency_s: list[float] = field(default_factory=list)
    per_run: dict[str, Delta] = field(default_factory=dict)  # pg_stat figures per run
    probes: list[Probe] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before / after
    busy_before: float = 0.0  # share of all CPUs busy during the second before the run
    cpu: CpuSample | None = None  # CPU seconds used during the run
    revision: tuple[str, str] = ("?", "?")  # of the code, at start and at end


class StatWindow:
    """A ``pg_stat`` window over one phase's measured runs (see the module docstring)."""

    def __init__(self, figures: Figures, system: str, database: str, close: Callable[[], None]):
        self.figures, self.system, self.database, self.close = figures, system, database, close
        self.probe = Probe(PG_SERVER, database)
        figures.probes.append(self.probe)
        self.close()
        self.probe.calibrate()
        self.before = self.probe.snapshot()  # waits for the worker's idle connections to flush
        self.polls = POLLS[database]

    def end(self, runs: int) -> None:
        """Call once the worker has stopped."""
        self.close()
        delta = self.probe.diff(self.before, self.probe.snapshot())
        polls = POLLS[self.database] - self.polls
        if delta.other_xacts > 0:
            self.figures.notes.append(
                f"{self.system} pg_stat window: {delta.other_xacts:.0f} transaction(s) ran in "
                "other databases (only the server-wide pg_stat_wal counts them)"
            )
        self.figures.per_run[self.system] = replace(delta, commits=delta.commits - polls).per(runs)
        self.probe.close()


def _close_django() -> None:
    from django.db import connection

    connection.close()


def reactor_phase(
    args: argparse.Namespace, figures: Figures, logs: Path, workers: list[Worker], *, last: bool
) -> None:
    name = f"reactor{len(figures.reactors_per_s) + 1}"
    worker = Worker(
        name,
        "testproject",
        REACTOR_QUEUE,
        worker_env(django=True),
        logs,
        processes=WORKER_PROCESSES,
    )
    window: StatWindow | None = None
    with running(worker, workers):
        for _ in range(2):  # warm-up: both processes connect, import the reactor, prepare
            reactor_wait(reactor_submit(args.warmup // 2 or 1)[0], pause=BURST_POLL)
        if last and args.pg_stats:
            window = StatWindow(figures, "django_reactor", REACTOR_DB, _close_django)
        rate, submitted = reactor_burst(args.burst)
        figures.reactors_per_s.append(rate)
        figures.submit_s.append(submitted)
        if last:
            figures.latency_s = reactor_latency(args.latency)
        wait_acked(REACTOR_REDIS_DB)
    if window is not None:
        window.end(args.burst + (args.latency if last else 0))
    left = redis_messages(REACTOR_REDIS_DB)
    if left:
        figures.notes.append(f"{name}: message(s) left in Redis after the phase: {left}")


def anchor_phase(
    args: argparse.Namespace, figures: Figures, logs: Path, workers: list[Worker]
) -> None:
    name = f"anchor{len(figures.chains_per_s) + 1}"
    worker = Worker(
        name,
        "benchmarks.chain_anchor",
        None,
        worker_env(django=False),
        logs,
        processes=WORKER_PROCESSES,
    )
    with running(worker, workers):
        for _ in range(2):
            anchor_burst(args.warmup // 2 or 1)
        figures.chains_per_s.append(anchor_burst(args.burst))
        wait_acked(ANCHOR_BROKER_DB)
    left = redis_messages(ANCHOR_BROKER_DB)
    if left:
        figures.notes.append(f"{name}: message(s) left in Redis after the phase: {left}")


def durable_phase(
    args: argparse.Namespace, figures: Figures, logs: Path, workers: list[Worker], *, last: bool
) -> None:
    name = f"durable{len(figures.durable_per_s) + 1}"
    app = "benchmarks.durable_task_anchor"
    worker = Worker(name, app, None, worker_env(django=False), logs, processes=WORKER_PROCESSES)
    window: StatWindow | None = None
    with running(worker, workers):
        for _ in range(2):
            durable_wait(durable_submit(args.warmup // 2 or 1)[0], pause=BURST_POLL)
        if last and args.pg_stats:
            window = StatWindow(figures, "durable anchor", DURABLE_DB, DURABLE.close)
        figures.durable_per_s.append(durable_burst(args.burst))
        wait_acked(DURABLE_BROKER_DB)
    if window is not None:
        window.end(args.burst)
    left = redis_messages(DURABLE_BROKER_DB)
    if left:
        figures.notes.append(f"{name}: message(s) left in Redis after the phase: {left}")


def dbos_phase(args: argparse.Namespace, figures: Figures, logs: Path, *, last: bool) -> None:
    prefix = f"dbos{len(figures.dbos_per_s) + 1}"
    caller = dbos_queue_anchor.Caller(POLLS)
    window: StatWindow | None = None
    try:
        # The context stops its workers on the way out, errors and interrupts included.
        with dbos_queue_anchor.workers(
            logs,
            processes=WORKER_PROCESSES,
            concurrency=dbos_queue_anchor.WORKER_CONCURRENCY,
            poll=dbos_queue_anchor.POLL_INTERVAL,
            prefix=prefix,
        ):
            dbos_queue_anchor.empty()
            for _ in range(2):
                caller.wait(caller.submit(args.warmup // 2 or 1)[0], pause=BURST_POLL)
            if last and args.pg_stats:
                window = StatWindow(figures, "DBOS queue", DBOS_DB, caller.close)
            figures.dbos_per_s.append(caller.burst(args.burst, pause=BURST_POLL))
            if last:
                figures.dbos_latency_s = caller.latency(args.latency)
    finally:
        caller.close()
    if window is not None:
        window.end(args.burst + (args.latency if last else 0))


def measure(args: argparse.Namespace, figures: Figures, logs: Path) -> None:
    workers: list[Worker] = []
    phases: list[tuple[str, Callable[[bool], None]]] = [
        ("django_reactor", lambda last: reactor_phase(args, figures, logs, workers, last=last)),
        ("chain anchor", lambda last: anchor_phase(args, figures, logs, workers)),
        ("durable anchor", lambda last: durable_phase(args, figures, logs, workers, last=last)),
    ]
    if args.dbos:
        phases.append(("DBOS queue", lambda last: dbos_phase(args, figures, logs, last=last)))
    try:
        for round_no in range(args.rounds):
            order = phases if round_no % 2 == 0 else phases[::-1]
            for name, phase in order:
                last = round_no == args.rounds - 1
                status = "done"
                try:
                    phase(last)
                except Exception as exc:  # report the phase as failed; go on with the others
                    figures.errors.append(
                        f"round {round_no + 1} {name}: {type(exc).__name__}: {exc}"
                    )
                    status = "FAILED"
                print(f"  round {round_no + 1}: {name} {status}", flush=True)
    finally:
        for worker in list(workers):
            worker.stop()


def context_line(figures: Figures) -> str:
    import celery
    import django
    import kombu
    import redis
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg_version = cursor.fetchone()[0]
        cursor.execute("SHOW synchronous_commit")
        sync_commit = cursor.fetchone()[0]
    client = redis.Redis.from_url(f"{REDIS_SERVER}/{REACTOR_REDIS_DB}")
    try:
        redis_version = client.info("server").get("redis_version", "?")
    finally:
        client.close()
    return (
        f"git {figures.revision[0]}; "
        f"{os.cpu_count()} CPUs, PostgreSQL {pg_version} (synchronous_commit={sync_commit}), "
        f"Redis {redis_version}, Celery {celery.__version__} (kombu {kombu.__version__}), "
        f"Django {django.get_version()}, Python {sys.version.split()[0]}"
    )


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far: by the machine, this process tree, PostgreSQL and Redis."""

    machine: float
    ours: float
    postgres: float
    redis: float

    @classmethod
    def take(cls) -> CpuSample:
        import resource

        tick = float(os.sysconf("SC_CLK_TCK"))
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
            machine = (sum(fields) - fields[3] - fields[4]) / tick
        except (OSError, ValueError, IndexError):
            machine = 0.0
        ours = sum(
            usage.ru_utime + usage.ru_stime
            for usage in (
                resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN),  # workers once reaped
            )
        )
        by_name = {"postgres": 0.0, "redis-server": 0.0}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                name = (entry / "comm").read_text().strip()
                if name not in by_name:
                    continue
                rest = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            # utime, stime, and cutime, cstime: the postmaster reaps its finished backends
            by_name[name] += sum(int(x) for x in rest[11:15]) / tick
        return cls(machine, ours, by_name["postgres"], by_name["redis-server"])

    def until(self, later: CpuSample) -> CpuSample:
        return CpuSample(
            later.machine - self.machine,
            later.ours - self.ours,
            later.postgres - self.postgres,
            later.redis - self.redis,
        )


def code_revision() -> str:
    """``git describe --dirty`` of the checkout, plus a digest of uncommitted changes to the code.

    Workers import the code when they start, once per phase: if it changes during the run,
    the phases measured different code.
    """
    import hashlib

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    described = git("describe", "--always", "--dirty") or "?"
    diff = git("diff", "HEAD", "--", "django_reactor", "testproject", "benchmarks/*.py")
    if diff:
        described += f" (diff {hashlib.sha1(diff.encode()).hexdigest()[:8]})"
    return described


def report(
    args: argparse.Namespace, figures: Figures, dropped: dict[str, int], elapsed: float
) -> None:
    print(
        f"background throughput: {args.burst} reactors of {STEPS} no-op steps "
        f"(Meta.background='all') vs {args.burst} Celery chains of {STEPS} tasks; one worker, "
        f"-P prefork -c {WORKER_PROCESSES}; {args.rounds} alternating round(s)"
    )
    print(context_line(figures))
    if figures.revision[0] != figures.revision[1]:
        print(f"WARNING: the code changed during the run (now {figures.revision[1]})")
    if args.db_reuse_max:
        print(f"variant: django_reactor worker with CELERY_DB_REUSE_MAX={args.db_reuse_max}")
    if dropped:
        print(f"(dropped stale messages left by an earlier run: {dropped})")
    print()

    def rounds(values: list[float], fmt: str = "{:.1f}") -> str:
        return ", ".join(fmt.format(v) for v in values) or "-"

    reactors = statistics.median(figures.reactors_per_s) if figures.reactors_per_s else None
    chains = statistics.median(figures.chains_per_s) if figures.chains_per_s else None
    print(
        f"django_reactor reactors/s: {_fmt(reactors)}  (rounds: {rounds(figures.reactors_per_s)})"
    )
    print(f"  submitting {args.burst} runs took: {rounds(figures.submit_s, '{:.2f}')} s")
    print(f"celery chain   chains/s:   {_fmt(chains)}  (rounds: {rounds(figures.chains_per_s)})")
    durable = statistics.median(figures.durable_per_s) if figures.durable_per_s else None
    print(f"durable anchor runs/s:     {_fmt(durable)}  (rounds: {rounds(figures.durable_per_s)})")
    dbos = statistics.median(figures.dbos_per_s) if figures.dbos_per_s else None
    if args.dbos:
        print(f"DBOS queue     runs/s:     {_fmt(dbos)}  (rounds: {rounds(figures.dbos_per_s)})")
    ratios = [
        ("ratio reactors/chains:     ", chains, TARGET_RATIO),
        ("ratio reactors/durable:    ", durable, TARGET_DURABLE_RATIO),
    ]
    if args.dbos:
        ratios.append(("ratio reactors/DBOS queue: ", dbos, TARGET_DBOS_RATIO))
    for label, anchor, target in ratios:
        if reactors is not None and anchor:
            ratio = reactors / anchor
            verdict = "PASS" if ratio >= target else "MISS"
            print(f"{label}{ratio:.2f}   target >= {target}   {verdict}")
        else:
            print(f"{label}n/a   target >= {target}   MISS (not measured)")
    if figures.latency_s:
        ms = [t * 1000 for t in figures.latency_s]
        print(
            f"latency run() -> completed ({len(ms)} sequential runs): "
            f"median {statistics.median(ms):.2f} ms, p99 {percentile(ms, 0.99):.2f} ms"
        )
    else:
        print("latency: not measured")
    if figures.dbos_latency_s:
        ms = [t * 1000 for t in figures.dbos_latency_s]
        print(
            f"DBOS queue latency enqueue -> SUCCESS ({len(ms)} sequential runs): "
            f"median {statistics.median(ms):.2f} ms, p99 {percentile(ms, 0.99):.2f} ms"
        )
        if figures.latency_s:
            ratio = statistics.median(figures.latency_s) / statistics.median(figures.dbos_latency_s)
            verdict = "PASS" if ratio <= 1.0 else "MISS"
            print(
                f"ratio latency ours/DBOS queue (medians): {ratio:.2f}   target <= 1.0   {verdict}"
            )
    if figures.per_run:
        print()
        print("pg_stat per run (last round; caller and worker together)")
        print(COLUMNS)
        for system, delta in figures.per_run.items():
            print(row(system, delta, RUN_TABLES[system]))
        print(legend(figures.probes))
        for probe in figures.probes:
            for error in probe.errors:
                print(f"note ({probe.database}): {error}")
    for note in figures.notes:
        print(f"note: {note}")
    for error in figures.errors:
        print(f"ERROR {error}")
    before, after = figures.load
    busy = figures.busy_before
    print(
        f"(measured in {elapsed:.1f} s; CPUs {busy:.0%} busy just before; load average "
        f"{before:.2f} before, {after:.2f} at end)"
    )
    cpu = figures.cpu
    if cpu is not None:
        available = elapsed * (os.cpu_count() or 1)
        others = max(0.0, cpu.machine - cpu.ours - cpu.postgres - cpu.redis)
        print(
            f"CPU seconds during the run (of {available:.0f} available): this benchmark and its "
            f"workers {cpu.ours:.1f}, PostgreSQL {cpu.postgres:.1f}, Redis {cpu.redis:.1f}, "
            f"other processes {others:.1f}"
        )
        if others > 0.05 * available or busy > 0.15:
            print(
                "WARNING: other work shared these CPUs during the run; the figures are skewed "
                "(run it again on a quiet machine)"
            )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    parser.add_argument("--burst", type=int, default=200, help="runs/chains per burst (200)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed runs per phase (20)")
    parser.add_argument("--latency", type=int, default=100, help="sequential latency runs (100)")
    parser.add_argument(
        "--logs", type=Path, default=None, help="keep the workers' logs in this directory"
    )
    parser.add_argument(
        "--no-pg-stats",
        dest="pg_stats",
        action="store_false",
        help="skip the pg_stat windows of the last round (they add about 25 s)",
    )
    parser.add_argument(
        "--no-dbos",
        dest="dbos",
        action="store_false",
        help="leave the DBOS queue anchor out (it needs the bench extra's dbos package)",
    )
    parser.add_argument(
        "--db-reuse-max",
        type=int,
        default=None,
        help="override CELERY_DB_REUSE_MAX on the django_reactor worker (default: the "
        "project's 1000; 0 unsets it, and Celery then closes the database connection around "
        "every task)",
    )
    args = parser.parse_args(argv)
    if args.db_reuse_max is not None:
        os.environ["BENCH_DB_REUSE_MAX"] = str(args.db_reuse_max)
    if min(args.rounds, args.burst, args.latency) < 1 or args.warmup < 0:
        parser.error("--rounds, --burst and --latency must be positive")
    return args


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds through the finally blocks that stop the workers


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    load_before = os.getloadavg()[0]
    revision = code_revision()
    busy_before = cpu_busy(1.0)
    cpu_start = CpuSample.take()
    started = time.perf_counter()
    ensure_database(REACTOR_DB)
    setup_django()
    setup_durable()
    if args.dbos:
        ensure_database(DBOS_DB)
    dropped = clean_redis()
    import testproject  # noqa: F401  (the project's Celery app: django_reactor publishes with it)

    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="reactor-bench-bg-") as logs:
        try:
            measure(args, figures, Path(logs))
        finally:
            if args.logs is not None:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(logs).glob("*.log"):
                    (args.logs / log.name).write_bytes(log.read_bytes())
            elif figures.errors:  # keep the workers' logs of a failed run
                kept = Path(tempfile.mkdtemp(prefix="reactor-bench-bg-logs-"))
                for log in Path(logs).glob("*.log"):
                    (kept / log.name).write_bytes(log.read_bytes())
                figures.errors.append(f"worker logs kept in {kept}")
    figures.load = (load_before, os.getloadavg()[0])
    figures.busy_before = busy_before
    figures.revision = (revision, code_revision())
    figures.cpu = cpu_start.until(CpuSample.take())
    report(args, figures, dropped, time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # a benchmark: report and exit 0
        print(f"ERROR {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(0)
