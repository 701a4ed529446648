"""Events matched to waiting runs: 10,000 runs parked at ``wait_for_event``, each resumed by
its own ``emit()``, against DBOS workflows parked at ``DBOS.recv`` resumed by ``DBOS.send``.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/events.py [--runs 10000] [--report events.json]
        [--no-inline] [--no-dbos]

What it measures
----------------
Three rows, one after the other in the same process, each with ``--runs`` runs (after an
untimed warm-up of ``--warmup`` runs of its own):

1. **django_reactor, background** (``PaidBackground``, ``benchmarks/events_reactors.py``): a
   no-op step, ``wait_for_event("bench.paid", match=arg.input("order"),
   resume="background")``, a no-op step. The runs are started inline in this process
   (``PaidBackground.run({"order": key})`` in a loop: each runs its first step and parks at the
   wait), in database ``reactor_bench_events`` (created and migrated if missing, emptied at
   every phase). Once every run reads ``paused``, this process calls
   ``django_reactor.emit("bench.paid", {...}, key=key)`` once per run, back to back, noting
   ``time.time()`` before each. Each emit records the event, gives it to the matching run's wait
   and hands the run to a Celery worker (``celery -A testproject worker -P prefork -c 2``, its
   own queue on Redis db 0, which no other benchmark uses), which runs the last step.
2. **django_reactor, inline** (``PaidInline``: the same with ``resume="inline"``): the emitting
   process runs the rest of each run itself, inside ``emit()``; no worker runs.
3. **DBOS anchor** (the ``dbos`` package, configured as in ``/work/shared/anchors``): a
   ``@DBOS.workflow()`` doing one ``@DBOS.step()``, ``DBOS.recv("paid", timeout_seconds=...)``,
   one step; ``--runs`` of them started with ``DBOS.start_workflow`` from this process. Once
   every one has reached its recv (its ``DBOS.sleep`` timeout row is in
   ``dbos.operation_outputs``), this process calls ``DBOS.send(workflow_id, {...}, "paid")``
   once per workflow, noting ``time.time()`` before each. System database
   ``dbos_events_bench``, dropped and created again at every run. DBOS has no separate worker:
   a workflow runs on a thread of the process that started it (DBOS's executor, unbounded by
   default), so the 10,000 waiting workflows, DBOS's notification listener and the send loop
   share this one process (and its GIL), while django_reactor's background row has two more
   processes (the Celery worker's children) for the resumed steps. The inline row is the
   one-process comparison.

Per row:

* **events/s**: ``--runs`` / the emit (send) loop's wall time (first call to last return);
* **completed/s**: ``--runs`` / (last completion - first emit);
* **emit -> completed, p50 / p99** (nearest rank): per run, its completion time (ours: the
  execution's ``finished_at``; DBOS: ``dbos.workflow_status.completed_at``, in milliseconds)
  minus the ``time.time()`` noted before its emit (send); one clock, this machine's.

Ratios: throughput ours / DBOS (above 1: ours higher), latency DBOS / ours (above 1: ours
lower). ``--report path`` writes every figure as JSON. The machine's load (1-minute load
average before and after, CPU busy share just before) is printed with the figures: on a shared
2-core machine they are loose. The exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, cpu_busy, ensure_database, percentile
from benchmarks.workers import BenchmarkError, Worker

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
DATABASE = "reactor_bench_events"
BROKER_DB = 0  # the only db number no other benchmark uses (grep benchmarks/ for redis://)
QUEUE = "django_reactor_bench_events"
WORKER_PROCESSES = 2
DBOS_DATABASE = "dbos_events_bench"
DBOS_APP = "reactor_bench_events"
EVENT = "bench.paid"
TOPIC = "paid"
PAYLOAD = {"amount": 1250, "currency": "EUR"}
POLL = 0.2  # s between two polls for the runs' states

os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bg_settings"  # environment-driven, shared
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"
os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{BROKER_DB}"
os.environ["REACTOR_BENCH_QUEUE"] = QUEUE


@dataclass
class Row:
    """One system's figures (seconds; latencies in ms)."""

    name: str
    runs: int
    parked_s: float = 0.0  # starting every run until it waits
    emit_s: float = 0.0  # the emit (send) loop, first call to last return
    drain_s: float = 0.0  # first emit to the last completion
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    min_ms: float = 0.0
    max_ms: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def events_per_s(self) -> float:
        return self.runs / self.emit_s if self.emit_s else 0.0

    @property
    def completed_per_s(self) -> float:
        return self.runs / self.drain_s if self.drain_s else 0.0

    def fill(self, emitted: list[float], completed: list[float], loop_end: float) -> None:
        """The figures from each run's emit time and completion time (epoch seconds)."""
        latencies = [(done - at) * 1000 for at, done in zip(emitted, completed, strict=True)]
        self.emit_s = loop_end - emitted[0]
        self.drain_s = max(completed) - emitted[0]
        self.p50_ms = percentile(latencies, 0.5)
        self.p99_ms = percentile(latencies, 0.99)
        self.min_ms, self.max_ms = min(latencies), max(latencies)

    def as_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "events_per_s": self.events_per_s,
            "completed_per_s": self.completed_per_s,
        }


# ---------------------------------------------------------------------------- django_reactor


def recreate_database(database: str) -> None:
    """Drop ``database`` (closing what holds it) and create it empty."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        name = sql.Identifier(database)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))


def setup_django() -> None:
    """Configure Django and migrate the benchmark database; a database whose migrations no
    longer match the code's (one renamed meanwhile) is dropped and made again."""
    import django
    from django.core.management import call_command
    from django.db import DatabaseError, connection

    django.setup()
    try:
        call_command("migrate", verbosity=0)
    except DatabaseError as exc:
        print(f"(migrate failed: {exc}; making database {DATABASE} again)", flush=True)
        connection.close()
        recreate_database(DATABASE)
        call_command("migrate", verbosity=0)


def empty_tables() -> None:
    """Empty the runs and the events (what cascades from them goes with them)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_reactor_execution, django_reactor_event CASCADE")


def empty_queue() -> None:
    """Drop the messages a run interrupted earlier left in this benchmark's queue."""
    import redis

    client = redis.Redis.from_url(f"{REDIS_SERVER}/{BROKER_DB}")
    try:
        client.delete(QUEUE)
    finally:
        client.close()


def status_counts(ids: list[uuid.UUID]) -> dict[str, int]:
    from django.db.models import Count

    from django_reactor.models import Execution

    rows = Execution.objects.filter(pk__in=ids).values("status").annotate(n=Count("pk"))
    return {row["status"]: row["n"] for row in rows}


def wait_for(
    what: str, done: Callable[[], tuple[bool, str]], limit: float, pause: float = POLL
) -> None:
    """Poll ``done()`` until it says so; BenchmarkError with its last word after ``limit`` s."""
    deadline = time.monotonic() + limit
    while True:
        finished, state = done()
        if finished:
            return
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{what} not reached after {limit:.0f} s: {state}")
        time.sleep(pause)


def park(reactor: Any, keys: list[str]) -> list[uuid.UUID]:
    """Start a run per key, inline; each runs its first step and parks at the wait."""
    from django_reactor import Paused

    ids: list[uuid.UUID] = []
    for key in keys:
        outcome = reactor.run({"order": key})
        if not isinstance(outcome, Paused) or outcome.execution_id is None:
            raise BenchmarkError(f"run() did not park at the wait: {outcome!r}")
        ids.append(outcome.execution_id)
    return ids


def emit_all(keys: list[str]) -> tuple[list[float], float, int]:
    """One emit per key, back to back: the time noted before each, the loop's end, and how many
    emits gave their event to no run or more than one."""
    import django_reactor

    emitted: list[float] = []
    unmatched = 0
    for i, key in enumerate(keys):
        emitted.append(time.time())
        got = django_reactor.emit(EVENT, {**PAYLOAD, "n": i}, key=key)
        if len(got.given) != 1:
            unmatched += 1
    return emitted, time.time(), unmatched


def finished_times(ids: list[uuid.UUID]) -> list[float]:
    """Each run's ``finished_at`` (epoch seconds), in the order of ``ids``."""
    from django_reactor.models import Execution

    found = dict(Execution.objects.filter(pk__in=ids).values_list("pk", "finished_at"))
    missing = [i for i in ids if found.get(i) is None]
    if missing:
        raise BenchmarkError(f"{len(missing)} run(s) have no finished_at")
    return [found[i].timestamp() for i in ids]


def reactor_row(name: str, reactor: Any, runs: int, prefix: str, limit: float) -> Row:
    """Park ``runs`` runs of ``reactor``, emit their events, and time them to completion."""
    empty_tables()
    row = Row(name, runs)
    keys = [f"{prefix}-{i}" for i in range(runs)]
    started = time.perf_counter()
    ids = park(reactor, keys)
    row.parked_s = time.perf_counter() - started

    def all_paused() -> tuple[bool, str]:
        counts = status_counts(ids)
        return counts.get("paused", 0) == runs, str(counts)

    wait_for("every run paused at the wait", all_paused, 30.0)
    print(f"  {name}: {runs:,} runs parked in {row.parked_s:.1f} s; emitting", flush=True)
    emitted, loop_end, unmatched = emit_all(keys)
    if unmatched:
        row.errors.append(f"{unmatched} emit(s) were given to no run or to several")

    def all_completed() -> tuple[bool, str]:
        counts = status_counts(ids)
        return counts.get("completed", 0) == runs, str(counts)

    wait_for("every run completed", all_completed, limit)
    row.fill(emitted, finished_times(ids), loop_end)
    return row


def warm_up(reactor: Any, runs: int, prefix: str) -> None:
    """Untimed: park and resume a few runs, so that both processes import, connect, prepare."""
    if runs:
        reactor_row("warm-up", reactor, runs, prefix, 60.0)


def ours(args: argparse.Namespace, logs: Path) -> list[Row]:
    """The django_reactor rows: background (with a worker), then inline (without)."""
    from benchmarks.events_reactors import PaidBackground, PaidInline

    rows: list[Row] = []
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    worker = Worker("events", "testproject", QUEUE, env, logs, processes=WORKER_PROCESSES)
    try:
        worker.start()
        warm_up(PaidBackground, args.warmup, "warm-bg")
        rows.append(
            _measured(
                "django_reactor background",
                args.runs,
                lambda: reactor_row(
                    "django_reactor background", PaidBackground, args.runs, "bg", args.timeout
                ),
            )
        )
    except BenchmarkError as exc:
        rows.append(Row("django_reactor background", args.runs, errors=[str(exc)]))
    finally:
        worker.stop()  # by its PID's process group, also on failure
    if not args.no_inline:
        warm_up(PaidInline, args.warmup, "warm-in")
        rows.append(
            _measured(
                "django_reactor inline",
                args.runs,
                lambda: reactor_row(
                    "django_reactor inline", PaidInline, args.runs, "in", args.timeout
                ),
            )
        )
    empty_tables()
    return rows


def _measured(name: str, runs: int, phase: Callable[[], Row]) -> Row:
    """``phase()``, or a row holding its error."""
    try:
        return phase()
    except Exception as exc:  # report the row as failed; go on with the others
        return Row(name, runs, errors=[f"{type(exc).__name__}: {exc}"])


# ---------------------------------------------------------------------------- DBOS


def dbos_row(args: argparse.Namespace) -> Row:
    """The anchor: ``--runs`` DBOS workflows waiting at ``DBOS.recv``, each sent a message."""
    import logging

    import psycopg
    from dbos import DBOS

    recreate_database(DBOS_DATABASE)
    dsn = f"{PG_SERVER}/{DBOS_DATABASE}"
    DBOS(config={"name": DBOS_APP, "system_database_url": dsn, "log_level": "WARNING"})

    @DBOS.step()
    def noop(value: Any) -> Any:
        return value

    @DBOS.workflow(name="paid_workflow")
    def paid_workflow(order: str) -> Any:
        noop(order)
        message = DBOS.recv(TOPIC, timeout_seconds=args.recv_timeout)
        if message is None:
            raise RuntimeError(f"workflow {order}: no message within {args.recv_timeout} s")
        return noop(message)

    DBOS.launch()
    signal.signal(signal.SIGTERM, _terminate)  # not DBOS's: unwind through the finally blocks
    for logger in ("dbos", "sqlalchemy"):
        logging.getLogger(logger).setLevel(logging.WARNING)
    row = Row("DBOS send/recv", args.runs)
    conn = psycopg.connect(dsn, autocommit=True)
    try:

        def one_round(runs: int, prefix: str, limit: float) -> Row:
            measured = Row("DBOS send/recv", runs)
            conn.execute("TRUNCATE dbos.workflow_status, dbos.operation_outputs CASCADE")
            started = time.perf_counter()
            handles = [DBOS.start_workflow(paid_workflow, f"{prefix}-{i}") for i in range(runs)]
            ids = [handle.get_workflow_id() for handle in handles]

            def all_waiting() -> tuple[bool, str]:
                waiting = conn.execute(
                    "SELECT count(*) FROM dbos.operation_outputs "
                    "WHERE function_name = 'DBOS.sleep' AND workflow_uuid = ANY(%s)",
                    (ids,),
                ).fetchone()[0]
                return waiting == runs, f"{waiting} of {runs} workflows at recv"

            wait_for("every workflow waiting at recv", all_waiting, limit)
            measured.parked_s = time.perf_counter() - started
            print(
                f"  DBOS: {runs:,} workflows waiting in {measured.parked_s:.1f} s; sending",
                flush=True,
            )
            emitted: list[float] = []
            for i, workflow_id in enumerate(ids):
                emitted.append(time.time())
                DBOS.send(workflow_id, {**PAYLOAD, "n": i}, TOPIC)
            loop_end = time.time()
            for handle in handles:  # each workflow's result, in this process
                handle.get_result()
            rows = dict(
                conn.execute(
                    "SELECT workflow_uuid, completed_at FROM dbos.workflow_status "
                    "WHERE status = 'SUCCESS' AND workflow_uuid = ANY(%s)",
                    (ids,),
                ).fetchall()
            )
            if len(rows) != runs or any(rows[i] is None for i in ids):
                raise BenchmarkError(f"{runs - len(rows)} DBOS workflow(s) did not succeed")
            measured.fill(emitted, [rows[i] / 1000 for i in ids], loop_end)
            return measured

        if args.warmup:
            one_round(args.warmup, "warm", 60.0)
        row = one_round(args.runs, "dbos", args.timeout)
    except Exception as exc:
        row.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
        DBOS.destroy(workflow_completion_timeout_sec=5)
    return row


# ---------------------------------------------------------------------------- the report


def ratios(rows: list[Row]) -> dict[str, dict[str, float | None]]:
    """Per django_reactor row: throughput ours / DBOS, latency DBOS / ours (above 1: ours
    better, both)."""
    anchor = next((r for r in rows if r.name.startswith("DBOS") and not r.errors), None)
    found: dict[str, dict[str, float | None]] = {}
    if anchor is None:
        return found

    def over(a: float, b: float) -> float | None:
        return a / b if a and b else None

    for row in rows:
        if row is anchor or row.errors:
            continue
        found[row.name] = {
            "events_per_s_ours_over_dbos": over(row.events_per_s, anchor.events_per_s),
            "completed_per_s_ours_over_dbos": over(row.completed_per_s, anchor.completed_per_s),
            "p50_dbos_over_ours": over(anchor.p50_ms, row.p50_ms),
            "p99_dbos_over_ours": over(anchor.p99_ms, row.p99_ms),
        }
    return found


def code_revision() -> str:
    """``git describe --always --dirty`` of the checkout, with a digest of its uncommitted
    changes to the code: the worker imports the code once, at its start."""
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


def context() -> dict[str, Any]:
    import celery
    import dbos
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg_version = cursor.fetchone()[0]
        cursor.execute("SHOW synchronous_commit")
        sync_commit = cursor.fetchone()[0]
    try:
        from importlib.metadata import version

        dbos_version = version("dbos")
    except Exception:
        dbos_version = getattr(dbos, "__version__", "?")
    return {
        "git": code_revision(),
        "cpus": os.cpu_count(),
        "postgresql": pg_version,
        "synchronous_commit": sync_commit,
        "celery": celery.__version__,
        "django": django.get_version(),
        "dbos": dbos_version,
        "python": platform.python_version(),
    }


def print_table(rows: list[Row], found: dict[str, dict[str, float | None]]) -> None:
    print()
    print(
        f"{'row':<28} {'runs':>7} {'parked s':>9} {'events/s':>9} {'completed/s':>12} "
        f"{'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}"
    )
    for row in rows:
        if row.errors:
            print(f"{row.name:<28} {row.runs:>7,} FAILED: {'; '.join(row.errors)}")
            continue
        print(
            f"{row.name:<28} {row.runs:>7,} {row.parked_s:>9.1f} {row.events_per_s:>9.0f} "
            f"{row.completed_per_s:>12.0f} {row.p50_ms:>9.1f} {row.p99_ms:>9.1f} "
            f"{row.max_ms:>9.1f}"
        )
    if not found:
        print("(no ratios: the DBOS row is missing or failed)")
        return
    print()
    print("ratios (above 1.00x: django_reactor better)")
    print(
        f"{'row':<28} {'events/s ours/DBOS':>19} {'completed/s ours/DBOS':>22} "
        f"{'p50 DBOS/ours':>14} {'p99 DBOS/ours':>14}"
    )

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}x"

    for name, r in found.items():
        print(
            f"{name:<28} {fmt(r['events_per_s_ours_over_dbos']):>19} "
            f"{fmt(r['completed_per_s_ours_over_dbos']):>22} "
            f"{fmt(r['p50_dbos_over_ours']):>14} {fmt(r['p99_dbos_over_ours']):>14}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000, help="runs per row (10,000)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed runs per row first (50)")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="s allowed for a phase's wait (600)"
    )
    parser.add_argument(
        "--recv-timeout",
        type=float,
        default=3600.0,
        help="DBOS.recv(timeout_seconds=...) (3600: no workflow times out while the rest start)",
    )
    parser.add_argument("--no-inline", action="store_true", help="skip the resume='inline' row")
    parser.add_argument("--no-dbos", action="store_true", help="skip the DBOS anchor")
    parser.add_argument("--report", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--logs", type=Path, default=None, help="keep the worker's log here")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be positive, --warmup not negative")
    return args


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds through the finally blocks that stop the worker


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    load_before = os.getloadavg()
    revision = code_revision()
    busy_before = cpu_busy(1.0)
    started = time.perf_counter()
    ensure_database(DATABASE)
    setup_django()
    empty_queue()
    import testproject  # noqa: F401  (the project's Celery app: django_reactor publishes with it)

    print(
        f"{args.runs:,} runs: a no-op step, wait_for_event({EVENT!r}, match=arg.input('order')), "
        f"a no-op step; one emit per run from this process; worker -P prefork "
        f"-c {WORKER_PROCESSES} (background row); load average {load_before[0]:.2f}, "
        f"CPUs {busy_before:.0%} busy just before",
        flush=True,
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="reactor-bench-events-") as logs:
        try:
            rows += ours(args, Path(logs))
        finally:
            if args.logs is not None:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(logs).glob("*.log"):
                    (args.logs / log.name).write_bytes(log.read_bytes())
    if not args.no_dbos:
        rows.append(dbos_row(args))
    load_after = os.getloadavg()
    elapsed = time.perf_counter() - started
    found = ratios(rows)
    print_table(rows, found)
    print(
        f"\n(measured in {elapsed:.0f} s; load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after; CPUs {busy_before:.0%} busy just before; "
        f"threads alive at end: {threading.active_count()})"
    )
    info = {"git_at_start": revision, **context()}
    print("; ".join(f"{k} {v}" for k, v in info.items()))
    if info["git"] != revision:
        print("WARNING: the code changed during the run; the rows may have run different code")
    if args.report is not None:
        report = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "runs": args.runs,
            "warmup": args.warmup,
            "worker_processes": WORKER_PROCESSES,
            "rows": [row.as_json() for row in rows],
            "ratios": found,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "cpu_busy_before": busy_before,
            "elapsed_s": elapsed,
            "context": info,
        }
        args.report.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report written to {args.report}")
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
