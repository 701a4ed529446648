"""What a concurrency key costs a run that never waits for it, inline and on a worker.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379 for the worker part)::

    .venv/bin/python benchmarks/concurrency_cost.py [--runs 200] [--rounds 5] [--burst 200]

It takes about three minutes.

What it measures (issue 31: "the cost of a concurrency key on an uncontended run <= 1.2x a
plain run")
-----------------------------------------------------------------------------------------
Two reactors of ``benchmarks/flow_reactors.py`` that differ only by ``Meta.concurrency``:
``CostPlain`` (one no-op step) and ``CostKeyed`` (the same, with
``Concurrency(key="{tenant}", limit=1, on_limit="queue")``). Database ``reactor_bench_ccost``
(created and migrated if missing, emptied before every batch); Django with ``DEBUG`` off, in
autocommit.

* **Inline**: ``Reactor.run({"tenant": ...})`` in this process, one run after another, in
  batches of ``--runs``, each run timed from the call until it returns ``Completed``. Three
  configurations: *plain* (``CostPlain``), *key per run* (``CostKeyed``, every run its own
  tenant, so its key's row is created by that start: never contended) and *one key*
  (``CostKeyed``, every run the same tenant: the key's row exists, and the run before has
  ended, so the key always has room). The configurations alternate for ``--rounds`` rounds
  (the order flips every round); the figure is the median of every timed run of a
  configuration. Target: the key-per-run median <= 1.2x the plain median.
* **Statements and transactions per run**: one more batch of ``--count-runs`` runs of each
  configuration, counting what this process sends through psycopg (``Cursor.execute`` and
  ``executemany``: every statement, the store's own checkpoint cursor included; transactions:
  ``Connection.commit``, each ``transaction.atomic`` block that wrote or read). An autocommit
  statement is its own transaction and is not counted as one. The server does not preload
  ``pg_stat_statements``, so the driver is the source. ``--show-sql`` prints one run's
  statements of each configuration.
* **On a worker** (``--no-background`` leaves it out): ``CostPlainOnWorker`` and
  ``CostKeyedOnWorker`` (the same, ``Meta.background = "all"``, a key per run). Each burst:
  ``--burst`` runs are submitted as fast as this process can with no worker running (the
  table shows how fast: ``run()`` calls a second), then one Celery worker (``celery -A
  testproject worker -P prefork -c 2``, the example project's settings, queue
  ``django_reactor_bench_ccost`` on Redis db 1) is started, runs them all and is stopped.
  runs/s = burst / (the runs' last ``finished_at`` - their first ``started_at``): the
  worker's rate, without its start nor the caller's; worker CPU = user + system CPU of the
  worker's processes (``/proc``) from its "ready." until the last run completed, a run. The
  two alternate for ``--rounds`` rounds (the order flips every round); the ratio of the
  medians is shown beside the target (plain runs/s <= 1.2x the keyed runs/s).

Override the servers with ``BENCH_PG`` (default ``postgresql://postgres@127.0.0.1:5432``) and
``BENCH_REDIS`` (default ``redis://127.0.0.1:6379``). The exit code is 0 whatever the figures:
this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, cpu_busy, ensure_database, percentile
from benchmarks.pgstats import StatementCounter
from benchmarks.workers import BenchmarkError, Worker

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
DATABASE = "reactor_bench_ccost"
# The one db number no other benchmark nor the tests use; fairness.py shares it (its own
# queue): run one benchmark at a time.
REDIS_DB = 1
QUEUE = "django_reactor_bench_ccost"
WORKER_PROCESSES = 2
TARGET = 1.2  # a keyed uncontended run against a plain one
WAIT_LIMIT = 120.0  # seconds a burst may take
POLL = 0.02
TICK = float(os.sysconf("SC_CLK_TCK"))

os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bg_settings"
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"
os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{REDIS_DB}"
os.environ["REACTOR_BENCH_QUEUE"] = QUEUE

CONFIGS = ("plain", "key per run", "one key")


# ---------------------------------------------------------------------------- setup


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def empty() -> None:
    """Empty django_reactor's run tables and the keys' rows, and this benchmark's queue."""
    import redis
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_reactor_execution, django_reactor_steprecord, "
            "django_reactor_executionevent, django_reactor_dispatch, "
            "django_reactor_flowkey CASCADE"
        )
    client = redis.Redis.from_url(f"{REDIS_SERVER}/{REDIS_DB}")
    try:
        keys = [*client.scan_iter(match=f"{QUEUE}*"), *client.scan_iter(match="unacked*")]
        if keys:
            client.delete(*keys)
    finally:
        client.close()


# ---------------------------------------------------------------------------- inline


def starter(config: str) -> Callable[[int], Any]:
    """The call that starts run ``i`` of ``config``."""
    from benchmarks.flow_reactors import CostKeyed, CostPlain

    batch = uuid.uuid4().hex[:8]  # keys never repeat across batches
    if config == "plain":
        return lambda i: CostPlain.run({"tenant": f"{batch}-{i}"})
    if config == "key per run":
        return lambda i: CostKeyed.run({"tenant": f"{batch}-{i}"})
    return lambda i: CostKeyed.run({"tenant": "same"})


def inline_batch(config: str, runs: int) -> list[float]:
    """Seconds of each of ``runs`` inline runs of ``config``."""
    from django_reactor import Completed

    start = starter(config)
    times = []
    for i in range(runs):
        t0 = time.perf_counter()
        outcome = start(i)
        times.append(time.perf_counter() - t0)
        if not isinstance(outcome, Completed):
            raise BenchmarkError(f"{config}: run {i} did not complete: {outcome!r}")
    return times


class Commits:
    """Counts ``psycopg.Connection.commit`` calls (transactions Django committed)."""

    def __init__(self) -> None:
        self.count = 0
        self._saved: Any = None

    def install(self) -> Commits:
        import psycopg

        commit = psycopg.Connection.commit
        self._saved = commit
        counter = self

        @functools.wraps(commit)
        def counted(conn: Any) -> Any:
            counter.count += 1
            return commit(conn)

        psycopg.Connection.commit = counted  # type: ignore[method-assign]
        return self

    def uninstall(self) -> None:
        import psycopg

        if self._saved is not None:
            psycopg.Connection.commit = self._saved  # type: ignore[method-assign]
            self._saved = None


def counted_batch(config: str, runs: int) -> tuple[float, float]:
    """(statements, transactions) per run of ``config``, over ``runs`` runs."""
    statements, commits = StatementCounter().install(), Commits().install()
    try:
        inline_batch(config, runs)
    finally:
        statements.uninstall()
        commits.uninstall()
    return statements.count(DATABASE) / runs, commits.count / runs


def show_sql(config: str) -> list[str]:
    """The statements one run of ``config`` sends (run after its counted batch)."""
    import psycopg

    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def recording(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else repr(query)
        sent.append(" ".join(text.split())[:160])
        return execute(cursor, query, *args, **kwargs)

    start = starter(config)
    psycopg.Cursor.execute = recording  # type: ignore[method-assign]
    try:
        start(0)
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    return sent


# ---------------------------------------------------------------------------- worker


def submit(reactor: Any, count: int) -> tuple[list[uuid.UUID], float]:
    """Start ``count`` background runs (a key each) as fast as possible; (ids, run() calls/s)."""
    from django_reactor import Dispatched

    batch = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    ids = []
    for i in range(count):
        outcome = reactor.run({"tenant": f"{batch}-{i}"})
        if not isinstance(outcome, Dispatched):
            raise BenchmarkError(f"run() did not dispatch the run: {outcome!r}")
        ids.append(outcome.execution_id)
    return ids, count / (time.perf_counter() - started)


def wait_completed(ids: list[uuid.UUID]) -> None:
    from django.db import connection

    deadline = time.perf_counter() + WAIT_LIMIT
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT count(*) FILTER (WHERE status = 'completed'), "
                "count(*) FILTER (WHERE finished_at IS NOT NULL AND status <> 'completed') "
                "FROM django_reactor_execution WHERE id = ANY(%s)",
                [ids],
            )
            done, ended_otherwise = cursor.fetchone()
            if done == len(ids):
                return
            if ended_otherwise:
                raise BenchmarkError(f"{ended_otherwise} run(s) ended without completing")
            if time.perf_counter() > deadline:
                raise BenchmarkError(f"only {done}/{len(ids)} runs completed in {WAIT_LIMIT:.0f} s")
            time.sleep(POLL)


def group_cpu(group: int) -> float:
    """User + system CPU seconds of the live processes of process group ``group``."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            rest = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(rest[2]) == group:  # pgrp; utime and stime follow
            total += (int(rest[11]) + int(rest[12])) / TICK
    return total


@dataclass(frozen=True)
class Burst:
    runs_per_s: float  # the worker's: burst / (last finished_at - first started_at)
    submits_per_s: float  # this process's run() calls a second
    cpu_ms: float  # the worker's CPU (every process) a run


def worker_burst(reactor: Any, count: int, logs: Path, name: str) -> Burst:
    """Submit ``count`` runs with no worker, then run them on a worker started for them."""
    from django.db import connection

    empty()
    ids, submits = submit(reactor, count)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    one = Worker(name, "testproject", QUEUE, env, logs, processes=WORKER_PROCESSES)
    try:
        one.start()
        assert one.process is not None
        group = one.process.pid  # the worker leads its own process group
        cpu = group_cpu(group)
        wait_completed(ids)
        cpu = group_cpu(group) - cpu
    finally:
        one.stop()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(started_at), max(finished_at) FROM django_reactor_execution "
            "WHERE id = ANY(%s)",
            [ids],
        )
        first, last = cursor.fetchone()
    seconds = max((last - first).total_seconds(), 1e-6)
    return Burst(count / seconds, submits, cpu / count * 1000)


# ---------------------------------------------------------------------------- the run


@dataclass
class Figures:
    inline: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CONFIGS})
    counted: dict[str, tuple[float, float]] = field(default_factory=dict)
    sql: dict[str, list[str]] = field(default_factory=dict)
    background: dict[str, list[Burst]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def measure(args: argparse.Namespace, figures: Figures) -> None:
    for config in CONFIGS:  # warm up: imports, the connection, the reactors' registration
        inline_batch(config, 20)
    for round_no in range(args.rounds):
        order = CONFIGS if round_no % 2 == 0 else CONFIGS[::-1]
        for config in order:
            empty()
            figures.inline[config].extend(inline_batch(config, args.runs))
        print(f"  round {round_no + 1}: inline done", flush=True)
    for config in CONFIGS:
        empty()
        figures.counted[config] = counted_batch(config, args.count_runs)
        if args.show_sql:
            figures.sql[config] = show_sql(config)
    if not args.background:
        return
    from benchmarks.flow_reactors import CostKeyedOnWorker, CostPlainOnWorker

    reactors = {"plain": CostPlainOnWorker, "key per run": CostKeyedOnWorker}
    figures.background = {name: [] for name in reactors}
    with tempfile.TemporaryDirectory(prefix="reactor-bench-ccost-") as logs:
        try:
            for round_no in range(args.rounds):
                names = list(reactors) if round_no % 2 == 0 else list(reactors)[::-1]
                for name in names:
                    worker = f"ccost-{round_no + 1}-{name.replace(' ', '-')}"
                    figures.background[name].append(
                        worker_burst(reactors[name], args.burst, Path(logs), worker)
                    )
                print(f"  round {round_no + 1}: worker done", flush=True)
        except Exception:
            kept = Path(tempfile.mkdtemp(prefix="reactor-bench-ccost-logs-"))
            for log in Path(logs).glob("*.log"):
                (kept / log.name).write_bytes(log.read_bytes())
            figures.errors.append(f"worker logs kept in {kept}")
            raise


def report(args: argparse.Namespace, figures: Figures, context: dict[str, Any]) -> None:
    print(
        "concurrency cost: one no-op step, with Meta.concurrency (limit 1, never contended) "
        "and without"
    )
    print(context["line"])
    print()
    header = (
        f"{'inline run':<14} {'median ms':>10} {'p90 ms':>8} {'ratio':>7} "
        f"{'statements':>11} {'transactions':>13}"
    )
    print(header)
    print("-" * len(header))
    plain = statistics.median(figures.inline["plain"]) if figures.inline["plain"] else None
    for config in CONFIGS:
        times = figures.inline[config]
        if not times:
            continue
        median = statistics.median(times)
        statements, commits = figures.counted.get(config, (float("nan"), float("nan")))
        ratio = f"{median / plain:.2f}x" if plain else "n/a"
        print(
            f"{config:<14} {median * 1000:>10.3f} {percentile(times, 0.9) * 1000:>8.3f} "
            f"{ratio:>7} {statements:>11.2f} {commits:>13.2f}"
        )
    print(f"({len(figures.inline['plain'])} timed runs each, {args.rounds} alternated rounds)")
    if figures.background:
        print()
        header = (
            f"{'on a worker':<14} {'runs/s':>8} {'rounds':>30} {'ratio':>7} "
            f"{'worker CPU ms/run':>18} {'run() calls/s':>14}"
        )
        print(header)
        print("-" * len(header))
        base = [b.runs_per_s for b in figures.background.get("plain", [])]
        for name, bursts in figures.background.items():
            if not bursts:
                continue
            rates = [b.runs_per_s for b in bursts]
            rate = statistics.median(rates)
            ratio = f"{statistics.median(base) / rate:.2f}x" if base else "n/a"
            shown = ", ".join(f"{r:.0f}" for r in rates)
            cpu = statistics.median(b.cpu_ms for b in bursts)
            submits = statistics.median(b.submits_per_s for b in bursts)
            print(f"{name:<14} {rate:>8.1f} {shown:>30} {ratio:>7} {cpu:>18.2f} {submits:>14.0f}")
        print(
            "(medians; runs/s: the worker's, from its first claim to its last finish; ratio: "
            "the plain runs/s over this one's; run() calls/s: this process submitting)"
        )
    for config, sent in figures.sql.items():
        print()
        print(f"statements of one {config} run:")
        for text in sent:
            print(f"  {text}")
    print()
    if plain and figures.inline["key per run"]:
        ratio = statistics.median(figures.inline["key per run"]) / plain
        verdict = "PASS" if ratio <= TARGET else "MISS"
        print(
            f"inline, key per run / plain (medians): {ratio:.2f}x   target <= {TARGET}x   {verdict}"
        )
    if plain and figures.inline["one key"]:
        ratio = statistics.median(figures.inline["one key"]) / plain
        verdict = "PASS" if ratio <= TARGET else "MISS"
        print(
            f"inline, one key / plain (medians):     {ratio:.2f}x   target <= {TARGET}x   {verdict}"
        )
    base, keyed = figures.background.get("plain"), figures.background.get("key per run")
    if base and keyed:
        ratio = statistics.median(b.runs_per_s for b in base) / statistics.median(
            b.runs_per_s for b in keyed
        )
        verdict = "PASS" if ratio <= TARGET else "MISS"
        print(
            f"on a worker, plain runs/s / keyed runs/s (medians): {ratio:.2f}x   "
            f"target <= {TARGET}x   {verdict}"
        )
    for error in figures.errors:
        print(f"ERROR {error}")
    print(
        f"(measured in {context['elapsed']:.0f} s; CPUs {context['busy']:.0%} busy just before; "
        f"load average {context['load'][0]:.2f} before, {context['load'][1]:.2f} at end)"
    )


def context_line() -> str:
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg_version = cursor.fetchone()[0]
        cursor.execute("SHOW synchronous_commit")
        sync_commit = cursor.fetchone()[0]
    return (
        f"{os.cpu_count()} CPUs, PostgreSQL {pg_version} (synchronous_commit={sync_commit}), "
        f"Django {django.get_version()}, Python {sys.version.split()[0]}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="inline runs per batch (200)")
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds (5)")
    parser.add_argument(
        "--count-runs", type=int, default=100, help="runs whose statements are counted (100)"
    )
    parser.add_argument("--burst", type=int, default=200, help="runs per worker burst (200)")
    parser.add_argument(
        "--no-background",
        dest="background",
        action="store_false",
        help="leave out the runs on a worker",
    )
    parser.add_argument(
        "--show-sql", action="store_true", help="print one run's statements of each"
    )
    args = parser.parse_args(argv)
    if min(args.runs, args.rounds, args.count_runs, args.burst) < 1:
        parser.error("--runs, --rounds, --count-runs and --burst must be positive")
    return args


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds through the finally block that stops the worker


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    load_before = os.getloadavg()[0]
    busy = cpu_busy(1.0)
    started = time.perf_counter()
    ensure_database(DATABASE)
    setup_django()
    import testproject  # noqa: F401  (the project's Celery app: django_reactor publishes with it)

    figures = Figures()
    try:
        measure(args, figures)
    except Exception as exc:  # report what was measured
        figures.errors.append(f"{type(exc).__name__}: {exc}")
    empty()
    context = {
        "line": context_line(),
        "elapsed": time.perf_counter() - started,
        "busy": busy,
        "load": (load_before, os.getloadavg()[0]),
    }
    report(args, figures, context)
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
