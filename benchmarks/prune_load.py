"""Pruning 1,000,000 ended runs while a Celery worker runs background runs: what it costs the
worker (issue 28: at most 10 % of its throughput, no lock a worker waits on for over 100 ms).

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/prune_load.py [--baseline 30] [--batch-size 1000] [--rebuild]

What it measures
----------------
A template database, ``reactor_prune_template``, is built once by SQL generation (as
``benchmarks/table_size.py`` builds its tables: 1,000,000 runs that ended 30 to 395 days ago,
one in a hundred with five step records, their trace events, a resumed interrupt and an ended
composed child, one in ten a dispatch, one in a thousand a settled map of five elements) and
reused (``--rebuild`` rebuilds it). Each round copies it into ``reactor_prune_load``
(``CREATE DATABASE ... TEMPLATE``) and starts one Celery worker (``celery -A testproject worker
-P prefork -c 2``, queue ``django_reactor_bench_prune`` on Redis db 10, ``DEBUG`` off,
``benchmarks.bg_settings``). This process keeps 100 background runs of
``benchmarks.bg_reactors.Chain10`` (10 no-op steps) in flight, submitting more as they finish,
through three phases:

1. ``--baseline`` seconds without pruning;
2. while ``services.prune(7, batch_size=--batch-size)`` runs in a process of its own (the
   project's prune, as ``reactor_prune --older-than 7 --pause P`` calls it, with ``--pause``
   seconds between batches), until it has deleted every
   ended run older than 7 days (the 1,000,000 runs and their children);
3. ``--baseline`` seconds without pruning again.

Throughput of a phase = runs whose ``finished_at`` falls in the phase / its length. The prune's
cost = 1 - phase 2 / mean(phase 1, phase 3) (target: at most 10 %). On a machine other work
shares, the load moves between phases; so during phase 2 the prune also sits out a window of
``--window`` seconds (15) every ``--window`` seconds, between two batches, and the worker's
throughput while the prune works is compared with its throughput in those windows, side by
side in time (the paired cost).

Lock waits: a thread samples ``pg_stat_activity`` every 5 ms for the worker's backends (its
processes connect with ``application_name`` ``reactor-bench-worker``) and follows each wait
(same backend, same statement, same wait event) from the first sample that sees it to the
last; it prints the longest heavyweight-lock wait (``wait_event_type = 'Lock'``: what a worker
would wait on behind the prune's row or table locks; target: under 100 ms) and the longest
``LWLock`` / ``BufferPin`` / ``IO`` waits, per phase. The prune process prints its batches'
durations (each batch is one transaction: the longest any lock it takes is held).

Override the servers with ``BENCH_PG`` and ``BENCH_REDIS``. The exit code is 0 whatever the
figures: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, ensure_database
from benchmarks.workers import BenchmarkError, Worker

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
TEMPLATE = "reactor_prune_template"
DATABASE = "reactor_prune_load"
REDIS_DB = 10
QUEUE = "django_reactor_bench_prune"
RUNS = 1_000_000
AGE_DAYS = 30
OLDER_THAN_DAYS = 7
IN_FLIGHT = 100
SAMPLE_EVERY = 0.005
WORKER_APP = "reactor-bench-worker"
TARGET_COST = 0.10
TARGET_WAIT_MS = 100.0

os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bg_settings"
os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{REDIS_DB}"
os.environ["REACTOR_BENCH_QUEUE"] = QUEUE


def admin_sql(*statements: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def child(action: str, args: argparse.Namespace) -> int:
    """``build``: fill the template; ``prune``: prune as ``reactor_prune`` does, timing batches."""
    url = os.environ["DATABASE_URL"]
    from benchmarks import scale, table_size

    os.environ["DATABASE_URL"] = url  # importing scale points it at its own database
    scale.setup_django()
    if action == "build":
        if scale.built().get("runs") != str(RUNS):
            print(f"building {RUNS:,} ended runs in {TEMPLATE}", flush=True)
            table_size.build(RUNS, age_days=AGE_DAYS, children=True)
        return 0
    from django_reactor import services

    durations: list[float] = []
    off: list[tuple[float, float]] = []  # the windows the prune sat out (epoch seconds)
    mark = {"batch": time.perf_counter(), "window": time.time()}

    def on_batch(count: int) -> None:
        durations.append((time.perf_counter() - mark["batch"]) * 1000)
        if args.window and time.time() - mark["window"] >= args.window:
            start = time.time()
            time.sleep(args.window)
            off.append((start, time.time()))
            mark["window"] = time.time()
        mark["batch"] = time.perf_counter() + args.pause  # the next batch starts after it

    started = time.perf_counter()
    total = services.prune(
        OLDER_THAN_DAYS, batch_size=args.batch_size, pause=args.pause, on_batch=on_batch
    )
    print(
        json.dumps(
            {
                "pruned": total,
                "seconds": time.perf_counter() - started - sum(b - a for a, b in off),
                "batches": len(durations),
                "batch_ms_median": statistics.median(durations) if durations else 0.0,
                "batch_ms_max": max(durations, default=0.0),
                "off": off,
            }
        )
    )
    return 0


def spawn_child(
    action: str, args: argparse.Namespace, database: str, app: str
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a child process of this script on ``database``."""
    command = [
        sys.executable,
        __file__,
        f"--child={action}",
        f"--batch-size={args.batch_size}",
        f"--pause={args.pause}",
        f"--window={args.window}",
    ]
    return command, {**os.environ, "DATABASE_URL": f"{PG_SERVER}/{database}", "PGAPPNAME": app}


# ---------------------------------------------------------------------------- sampling


@dataclass
class Waits:
    """The longest wait seen per wait type, in ms, with what was waited on."""

    longest: dict[str, tuple[float, str]] = field(default_factory=dict)

    def note(self, kind: str, ms: float, what: str) -> None:
        if ms > self.longest.get(kind, (0.0, ""))[0]:
            self.longest[kind] = (ms, what)


class Sampler(threading.Thread):
    """Samples the worker backends' waits every ``SAMPLE_EVERY`` seconds."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.phase = "start"
        self.waits: dict[str, Waits] = {}
        self.samples = 0

    def run(self) -> None:
        import psycopg

        open_waits: dict[tuple[Any, ...], float] = {}
        with psycopg.connect(
            f"{PG_SERVER}/{DATABASE}", autocommit=True, application_name="reactor-bench-sampler"
        ) as conn:
            while not self.stop.is_set():
                now = time.perf_counter()
                rows = conn.execute(
                    "SELECT pid, query_start, wait_event_type, wait_event, "
                    "regexp_replace(left(query, 80), '\\s+', ' ', 'g') "
                    "FROM pg_stat_activity WHERE datname = %s AND application_name = %s "
                    "AND state = 'active' AND wait_event_type IN "
                    "('Lock', 'LWLock', 'BufferPin', 'IO')",
                    [DATABASE, WORKER_APP],
                ).fetchall()
                self.samples += 1
                seen = set()
                waits = self.waits.setdefault(self.phase, Waits())
                for pid, started, kind, event, query in rows:
                    key = (pid, started, kind, event)
                    seen.add(key)
                    first = open_waits.setdefault(key, now)
                    waits.note(kind, (now - first) * 1000, f"{event}: {query}")
                for key in list(open_waits):
                    if key not in seen:
                        del open_waits[key]
                self.stop.wait(SAMPLE_EVERY)


# ---------------------------------------------------------------------------- load


class Load(threading.Thread):
    """Keeps ``IN_FLIGHT`` background runs in flight until stopped; remembers their ids."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.ids: list[uuid.UUID] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection

        from benchmarks.bg_reactors import Chain10

        outstanding: list[uuid.UUID] = []
        try:
            with connection.cursor() as cursor:
                while not self.stop.is_set():
                    while len(outstanding) < IN_FLIGHT:
                        run_id = Chain10.run({}).execution_id
                        outstanding.append(run_id)
                        self.ids.append(run_id)
                    cursor.execute(
                        "SELECT id FROM django_reactor_execution WHERE id = ANY(%s) "
                        "AND finished_at IS NULL",
                        [outstanding],
                    )
                    outstanding = [row[0] for row in cursor.fetchall()]
                    if len(outstanding) >= IN_FLIGHT:
                        time.sleep(0.01)
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            connection.close()


def db_now() -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def finished_between(ids: list[uuid.UUID], start: Any, end: Any) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM django_reactor_execution WHERE id = ANY(%s) "
            "AND status = 'completed' AND finished_at >= %s AND finished_at < %s",
            [ids, start, end],
        )
        return int(cursor.fetchone()[0])


def clean_redis() -> None:
    import redis

    client = redis.Redis.from_url(f"{REDIS_SERVER}/{REDIS_DB}")
    try:
        keys = [*client.scan_iter(match=f"{QUEUE}*"), *client.scan_iter(match="unacked*")]
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def one_round(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    import django
    from django.db import connection

    admin_sql(
        f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)",
        f"CREATE DATABASE {DATABASE} TEMPLATE {TEMPLATE} STRATEGY FILE_COPY",
    )
    django.setup()
    connection.close()
    clean_redis()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PGAPPNAME": WORKER_APP}
    worker = Worker("prune-worker", "testproject", QUEUE, env, logs, processes=2)
    sampler = Sampler()
    result: dict[str, Any] = {}
    worker.start()
    try:
        sampler.start()
        load = Load()
        load.start()
        time.sleep(5)  # warm-up: the worker's processes connect and import the reactor
        phases: list[tuple[str, Any, Any]] = []

        def phase(name: str, until: Any) -> None:
            sampler.phase = name
            start = db_now()
            until()
            phases.append((name, start, db_now()))
            if load.error is not None:
                raise BenchmarkError(f"the load stopped: {load.error!r}")

        phase("before", lambda: time.sleep(args.baseline))
        command, prune_env = spawn_child("prune", args, DATABASE, "reactor-bench-prune")

        def prune() -> None:
            out = subprocess.run(command, env=prune_env, capture_output=True, text=True)
            if out.returncode:
                raise BenchmarkError(f"the prune failed:\n{out.stderr[-3000:]}")
            result["prune"] = json.loads(out.stdout.strip().splitlines()[-1])

        phase("during the prune", prune)
        phase("after", lambda: time.sleep(args.baseline))
        load.stop.set()
        load.join(60)
        for name, start, end in phases:
            seconds = (end - start).total_seconds()
            result[name] = finished_between(load.ids, start, end) / seconds
        # During the prune: its own windows against those it sat out, side by side in time.
        done, seconds = 0, 0.0
        for a, b in result["prune"]["off"]:
            start, end = (dt.datetime.fromtimestamp(t, dt.UTC) for t in (a, b))
            done += finished_between(load.ids, start, end)
            seconds += b - a
        result["sat out"] = done / seconds if seconds else None
        _, start, end = phases[1]
        total = (end - start).total_seconds()
        pruning = finished_between(load.ids, start, end) - done
        result["pruning"] = pruning / (total - seconds)
    finally:
        sampler.stop.set()
        worker.stop()
        connection.close()
    result["waits"] = {k: v.longest for k, v in sampler.waits.items()}
    result["samples"] = sampler.samples
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=float, default=30.0, help="seconds before and after")
    parser.add_argument("--batch-size", type=int, default=1000, help="prune's batch size")
    parser.add_argument(
        "--pause", type=float, default=0.0, help="prune's pause between batches, in seconds"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=15.0,
        help="the prune sits out WINDOW seconds every WINDOW seconds (0: never)",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rebuild", action="store_true", help="rebuild the template database")
    parser.add_argument("--logs", type=Path, default=None, help="keep the worker's log here")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args)
    os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"
    if args.rebuild:
        admin_sql(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
    ensure_database(TEMPLATE)
    command, env = spawn_child("build", args, TEMPLATE, "reactor-bench-build")
    subprocess.run(command, env=env, check=True)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="prune_load_"))
    rows = []
    for r in range(args.rounds):
        result = one_round(args, logs)
        before, during, after = (result[k] for k in ("before", "during the prune", "after"))
        cost = 1 - during / ((before + after) / 2)
        p = result["prune"]
        lock = max((w.get("Lock", (0.0, ""))[0] for w in result["waits"].values()), default=0.0)
        rows.append((before, during, after, cost, p, lock))
        print(f"round {r + 1}:")
        print(
            f"  worker throughput: before {before:.1f} runs/s, during the prune {during:.1f}, "
            f"after {after:.1f}; cost {cost * 100:.1f} % (target <= {TARGET_COST * 100:.0f} %) "
            f"{'PASS' if cost <= TARGET_COST else 'MISS'}"
        )
        if result["sat out"]:
            paired = 1 - result["pruning"] / result["sat out"]
            print(
                f"  during the prune phase: {result['pruning']:.1f} runs/s while it pruned, "
                f"{result['sat out']:.1f} in the {len(p['off'])} windows of {args.window:.0f} s "
                f"it sat out; cost {paired * 100:.1f} % "
                f"{'PASS' if paired <= TARGET_COST else 'MISS'}"
            )
        print(
            f"  prune: {p['pruned']:,} runs in {p['seconds']:.1f} s ({p['batches']} batches of "
            f"{args.batch_size}; batch median {p['batch_ms_median']:.0f} ms, longest "
            f"{p['batch_ms_max']:.0f} ms; pause {args.pause} s)"
        )
        print(f"  longest waits of the worker's backends ({result['samples']:,} samples):")
        for phase_name, longest in result["waits"].items():
            for kind, (ms, what) in sorted(longest.items()):
                print(f"    {phase_name:<17} {kind:<9} {ms:7.1f} ms  {what}")
        print(
            f"  longest lock wait: {lock:.1f} ms (target < {TARGET_WAIT_MS:.0f} ms) "
            f"{'PASS' if lock < TARGET_WAIT_MS else 'MISS'}",
            flush=True,
        )
    print(f"\nworker log: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
