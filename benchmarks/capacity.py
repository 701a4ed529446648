"""What one background run costs PostgreSQL and the worker: the figures of the capacity model.

Run from the repository root (the servers of ``background_throughput.py``)::

    .venv/bin/python benchmarks/capacity.py [--rounds 3] [--burst 200]

It takes about three minutes. ``docs/explanation/capacity.md`` turns its figures into how many
runs a second one PostgreSQL sustains.

Setup: the worker of ``background_throughput.py`` (``celery -A testproject worker -P prefork
-c 2``, the example project's settings, which keep the worker's database connection), with its
own database ``reactor_bench_capacity``, Redis database 10 and queue
``django_reactor_bench_capacity``. Two reactors of ``benchmarks.bg_reactors``, ``Chain1`` (one
no-op step) and ``Chain10`` (ten), ``Meta.background = "all"``: the difference between the two
is the cost of a step, the rest the fixed cost of a run. Each round, for each reactor: start the
worker, warm it up (``--warmup`` runs), open a window, submit a burst of ``--burst`` runs as
fast as this process can, wait until all are completed, close the window, stop the worker. The
order flips every round; the table shows the medians of the rounds. A third window each round
(``--no-dbos`` leaves it out) measures the same for the DBOS queue anchor's 10-step workflow
(``benchmarks/dbos_queue_anchor.py``: two DBOS worker processes, enqueued by a ``DBOSClient``),
column ``DBOS 10``: its caller's backends are the ``DBOSClient``'s pool, its commits include
its queue threads' polls (every 10 ms on each worker, read-only transactions).

What a window measures, divided by the burst's runs:

* **PostgreSQL CPU, worker backends**: CPU time (``/proc/<pid>/schedstat``) of the server
  backends that serve the worker's connections (the backends connected to the database when
  the window opens, less the caller's and the poller's; a backend that appears during the
  window counts from its start, one that leaves is reported). ``pg_stat_statements`` would
  give the same per statement, but it needs ``shared_preload_libraries``; ``/proc`` needs the
  server on this machine.
* **PostgreSQL CPU, caller backend**: the backend of this process's Django connection, which
  only runs ``run()``: the completion polls go through a connection of their own, left out.
* **PostgreSQL CPU, all server processes**: every ``postgres`` process (background writer,
  WAL writer, checkpointer, autovacuum and the stats included): server-wide, so other
  databases' work counts too; the report says how many transactions ran elsewhere.
* **WAL bytes and records**: ``benchmarks/pgstats.py`` (``pg_walinspect``: this database's
  records only; else ``pg_stat_wal``, server-wide).
* **commits**: ``pg_stat_database.xact_commit`` of the database, less the polls and the probe's
  own transactions; **WAL commits**: commit records, transactions that wrote.
* **worker CPU**: user + system CPU of the Celery worker's processes (its parent and children,
  every thread: ``/proc/<pid>/stat``, in clock ticks, enough over a burst).
* **caller CPU**: this process's CPU time in ``run()``.

Also measured once: the commit latency, median of 200 autocommit single-row INSERTs into a
scratch table (a commit's round trip and WAL flush with ``synchronous_commit`` as set).

Override the servers with ``BENCH_PG`` and ``BENCH_REDIS``. The exit code is 0 whatever the
figures: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

DATABASE = "reactor_bench_capacity"
REDIS_DB = 10
QUEUE = "django_reactor_bench_capacity"
os.environ["REACTOR_BENCH_DB"] = DATABASE
os.environ["REACTOR_BENCH_REDIS_DB"] = str(REDIS_DB)
os.environ["REACTOR_BENCH_QUEUE"] = QUEUE

from benchmarks import background_throughput as bench
from benchmarks.common import PG_SERVER, backend_cpu, ensure_database, process_cpu
from benchmarks.pgstats import Delta, Probe
from benchmarks.workers import BenchmarkError, Worker

REACTORS = {1: "Chain1", 10: "Chain10"}  # steps -> reactor of benchmarks.bg_reactors
POLL = 0.02  # s between two completion polls


# ---------------------------------------------------------------------------- CPU


def group_cpu(pgid: int) -> float:
    """CPU seconds of the live processes of process group ``pgid`` (a worker and its children)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            group = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, IndexError, ValueError):
            continue
        if group == pgid:
            total += process_cpu(int(entry.name)) or 0.0
    return total


def backends(admin: Any, oid: int) -> dict[int, str]:
    """The client backends connected to database ``oid``: pid -> ``application_name``."""
    rows = admin.execute(
        "SELECT pid, application_name FROM pg_stat_activity "
        "WHERE datid = %s AND backend_type = 'client backend'",
        (oid,),
    ).fetchall()
    return {int(pid): name for pid, name in rows}


class Meter:
    """CPU time over one burst: the database's backends, the worker's processes, all of PostgreSQL.

    A backend is the caller's when ``is_caller(pid, application_name)`` says so, else the
    worker's; ``skip`` (the poller's) counts for neither. Backends that join during the burst
    count from their start; those that leave are not counted, and reported.
    """

    def __init__(
        self,
        admin: Any,
        oid: int,
        groups: list[int],
        *,
        is_caller: Callable[[int, str], bool],
        skip: set[int],
    ) -> None:
        self.admin, self.oid, self.groups = admin, oid, groups
        self.is_caller, self.skip = is_caller, skip
        self.before = {p: n for p, n in backends(admin, oid).items() if p not in skip}
        self.cpu0 = {pid: backend_cpu(pid) for pid in self.before}
        self.server0 = bench.CpuSample.take().postgres
        self.worker0 = sum(group_cpu(g) for g in groups)

    def read(self) -> tuple[float, float, float, float, list[str]]:
        """(worker backends, caller backends, all of PostgreSQL, worker processes) CPU seconds
        since the start, and notes."""
        worker = sum(group_cpu(g) for g in self.groups) - self.worker0
        now = {p: n for p, n in backends(self.admin, self.oid).items() if p not in self.skip}
        left = set(self.before) - set(now)
        joined = set(now) - set(self.before)
        spent = {pid: (backend_cpu(pid) or 0.0) - (self.cpu0.get(pid) or 0.0) for pid in now}
        server = bench.CpuSample.take().postgres - self.server0
        caller = sum(t for pid, t in spent.items() if self.is_caller(pid, now[pid]))
        notes = []
        if left:
            notes.append(f"{len(left)} backend(s) left during the window (not counted)")
        if joined:
            notes.append(f"{len(joined)} backend(s) joined during the window (counted)")
        return sum(spent.values()) - caller, caller, server, worker, notes


# ---------------------------------------------------------------------------- one window


@dataclass(frozen=True)
class Window:
    """One burst's figures, per run."""

    steps: int
    system: str  # "django_reactor" or "DBOS queue"
    runs_per_s: float
    worker_backends_ms: float
    caller_backend_ms: float
    server_ms: float  # every postgres process: server-wide
    worker_ms: float
    caller_ms: float
    stats: Delta  # pgstats figures per run (commits less the polls)
    notes: tuple[str, ...] = ()

    @property
    def backends_ms(self) -> float:
        return self.worker_backends_ms + self.caller_backend_ms


class Poller:
    """Polls the execution table through a connection of its own (its backend is left out)."""

    def __init__(self) -> None:
        import psycopg

        self.conn = psycopg.connect(f"{PG_SERVER}/{DATABASE}", autocommit=True)
        self.pid = int(self.conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        self.polls = 0

    def wait(self, ids: list[uuid.UUID], *, limit: float = bench.WAIT_LIMIT) -> float:
        deadline = time.perf_counter() + limit
        while True:
            self.polls += 1
            done, other = self.conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'completed'), "
                "count(*) FILTER (WHERE finished_at IS NOT NULL AND status <> 'completed') "
                "FROM django_reactor_execution WHERE id = ANY(%s)",
                (ids,),
            ).fetchone()
            now = time.perf_counter()
            if done == len(ids):
                return now
            if other:
                raise BenchmarkError(f"{other} run(s) finished without completing")
            if now > deadline:
                raise BenchmarkError(f"only {done}/{len(ids)} runs completed after {limit:.0f} s")
            time.sleep(POLL)

    def close(self) -> None:
        self.conn.close()


def submit(reactor: Any, count: int) -> tuple[list[uuid.UUID], float, float]:
    """Start ``count`` background runs; return their ids, the start time and this process's CPU."""
    from django_reactor import Dispatched

    cpu0 = time.process_time()
    started = time.perf_counter()
    ids: list[uuid.UUID] = []
    for _ in range(count):
        outcome = reactor.run({})
        if not isinstance(outcome, Dispatched):
            raise BenchmarkError(f"run() did not dispatch the run: {outcome!r}")
        ids.append(outcome.execution_id)
    return ids, started, time.process_time() - cpu0


def caller_backend() -> int:
    """The pid of the backend of this process's Django connection (opening it if needed)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def window(args: argparse.Namespace, steps: int, logs: Path, name: str) -> Window:
    """Start a worker, warm it up, measure one burst of ``steps``-step runs, stop the worker."""
    from django.db import connection

    from benchmarks import bg_reactors

    reactor = getattr(bg_reactors, REACTORS[steps])
    worker = Worker(
        name,
        "testproject",
        QUEUE,
        bench.worker_env(django=True),
        logs,
        processes=bench.WORKER_PROCESSES,
    )
    import psycopg

    poller = Poller()
    probe = Probe(PG_SERVER, DATABASE)
    admin = psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True)
    try:
        worker.start()
        assert worker.process is not None
        for _ in range(2):  # both processes connect, import the reactor, prepare
            poller.wait(submit(reactor, args.warmup // 2 or 1)[0])
        connection.close()
        probe.calibrate()
        before = probe.snapshot()  # waits for the worker's idle connections to flush
        polls0 = poller.polls
        caller = caller_backend()
        meter = Meter(
            admin,
            probe.oid,
            [worker.process.pid],
            is_caller=lambda pid, _: pid == caller,
            skip={poller.pid},
        )

        ids, started, caller_s = submit(reactor, args.burst)
        finished = poller.wait(ids)
        bench.wait_acked(REDIS_DB)
        worker_backends, caller_backend_s, server, worker_s, notes = meter.read()

        worker.stop()
        connection.close()
        polls = poller.polls - polls0 + 1  # and caller_backend()'s one transaction
        poller.close()
        delta = probe.diff(before, probe.snapshot())
        runs = args.burst
        return Window(
            steps=steps,
            system="django_reactor",
            runs_per_s=runs / (finished - started),
            worker_backends_ms=worker_backends * 1000 / runs,
            caller_backend_ms=caller_backend_s * 1000 / runs,
            server_ms=server * 1000 / runs,
            worker_ms=worker_s * 1000 / runs,
            caller_ms=caller_s * 1000 / runs,
            stats=replace(delta, commits=delta.commits - polls).per(runs),
            notes=tuple(notes),
        )
    finally:
        worker.stop()
        probe.close()
        admin.close()
        with contextlib.suppress(Exception):
            poller.close()


def dbos_window(args: argparse.Namespace, logs: Path, name: str) -> Window:
    """The same for the DBOS queue anchor's 10-step workflow, on its two worker processes."""
    import psycopg

    from benchmarks import dbos_queue_anchor as dbos

    caller = dbos.Caller()
    probe = Probe(PG_SERVER, dbos.DATABASE)
    admin = psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True)
    try:
        with dbos.workers(
            logs,
            processes=bench.WORKER_PROCESSES,
            concurrency=dbos.WORKER_CONCURRENCY,
            poll=dbos.POLL_INTERVAL,
            prefix=name,
        ) as started:
            dbos.empty()
            for _ in range(2):
                caller.wait(caller.submit(args.warmup // 2 or 1)[0], pause=POLL)
            caller.close()
            probe.calibrate()
            before = probe.snapshot()
            polls0 = caller.polls[dbos.DATABASE]
            caller.client()
            poller = int(caller.connection().execute("SELECT pg_backend_pid()").fetchone()[0])
            meter = Meter(
                admin,
                probe.oid,
                [one.process.pid for one in started if one.process is not None],
                is_caller=lambda _, app: app == "dbos_transact_client",  # DBOSClient's pool
                skip={poller},
            )
            cpu0 = time.process_time()
            ids, t0 = caller.submit(args.burst)
            caller_s = time.process_time() - cpu0
            finished = caller.wait(ids, pause=POLL)
            worker_backends, caller_backends, server, worker_s, notes = meter.read()
        caller.close()
        polls = caller.polls[dbos.DATABASE] - polls0 + 1  # and the pid's transaction
        delta = probe.diff(before, probe.snapshot())
        runs = args.burst
        return Window(
            steps=dbos.STEPS,
            system="DBOS queue",
            runs_per_s=runs / (finished - t0),
            worker_backends_ms=worker_backends * 1000 / runs,
            caller_backend_ms=caller_backends * 1000 / runs,
            server_ms=server * 1000 / runs,
            worker_ms=worker_s * 1000 / runs,
            caller_ms=caller_s * 1000 / runs,
            stats=replace(delta, commits=delta.commits - polls).per(runs),
            notes=tuple(notes),
        )
    finally:
        caller.close()
        probe.close()
        admin.close()


def commit_latency(samples: int = 200) -> float:
    """Median ms of one autocommit single-row INSERT (a commit's round trip and WAL flush)."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/{DATABASE}", autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS capacity_scratch (id bigserial PRIMARY KEY)")
        times: list[float] = []
        for _ in range(samples):
            t0 = time.perf_counter()
            conn.execute("INSERT INTO capacity_scratch DEFAULT VALUES")
            times.append(time.perf_counter() - t0)
        conn.execute("DROP TABLE capacity_scratch")
    return statistics.median(times) * 1000


# ---------------------------------------------------------------------------- report


ROWS: list[tuple[str, Any, str]] = [
    ("runs/s (burst, 2 worker processes)", lambda w: w.runs_per_s, "{:.1f}"),
    ("PostgreSQL CPU ms: worker backends", lambda w: w.worker_backends_ms, "{:.3f}"),
    ("PostgreSQL CPU ms: caller backend", lambda w: w.caller_backend_ms, "{:.3f}"),
    ("PostgreSQL CPU ms: backends together", lambda w: w.backends_ms, "{:.3f}"),
    ("PostgreSQL CPU ms: all processes [s]", lambda w: w.server_ms, "{:.3f}"),
    ("WAL bytes", lambda w: w.stats.wal()[1], "{:.0f}"),
    ("WAL records", lambda w: w.stats.wal()[0], "{:.1f}"),
    ("commits", lambda w: w.stats.commits, "{:.1f}"),
    ("WAL commits (writing transactions)", lambda w: w.stats.db_wal_commits, "{:.1f}"),
    ("worker CPU ms", lambda w: w.worker_ms, "{:.3f}"),
    ("caller CPU ms (run())", lambda w: w.caller_ms, "{:.3f}"),
]


def median_of(
    windows: list[Window], steps: int, value: Any, system: str = "django_reactor"
) -> float | None:
    got = [value(w) for w in windows if w.steps == steps and w.system == system]
    got = [v for v in got if v is not None]
    return statistics.median(got) if got else None


def report(
    args: argparse.Namespace, windows: list[Window], latency_ms: float, elapsed: float
) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
        cursor.execute("SHOW synchronous_commit")
        sync = cursor.fetchone()[0]
    print(
        f"capacity: per background run, {args.burst}-run bursts through one worker "
        f"(-P prefork -c {bench.WORKER_PROCESSES}); medians of {args.rounds} round(s)"
    )
    print(
        f"git {bench.code_revision()}; {os.cpu_count()} CPUs, PostgreSQL {version} "
        f"(synchronous_commit={sync})"
    )
    print()
    dbos = any(w.system == "DBOS queue" for w in windows)
    head = f"{'per run':40}{'1 step':>10}{'10 steps':>10}{'per step':>10}{'fixed':>10}"
    if dbos:
        head += f"{'DBOS 10':>10}"
    print(head)
    print("-" * len(head))
    for label, value, fmt in ROWS:
        one = median_of(windows, 1, value)
        ten = median_of(windows, 10, value)

        def cell(v: float | None, fmt: str = fmt) -> str:
            return "n/a" if v is None else fmt.format(v)

        step = fixed = None
        if one is not None and ten is not None and not label.startswith("runs/s"):
            step = (ten - one) / 9
            fixed = one - step
        line = f"{label:40}{cell(one):>10}{cell(ten):>10}{cell(step):>10}{cell(fixed):>10}"
        if dbos:
            line += f"{cell(median_of(windows, 10, value, 'DBOS queue')):>10}"
        print(line)
    print(
        "per step = (10 steps - 1 step) / 9; fixed = 1 step - per step. [s]: server-wide "
        "(other databases' work counts too)."
        + (
            " DBOS 10: the DBOS queue anchor's 10-step workflow on 2 worker processes; its "
            "commits include its queue threads' polls; caller backend = its DBOSClient's."
            if dbos
            else ""
        )
    )
    print(f"commit latency (autocommit 1-row INSERT, median of 200): {latency_ms:.3f} ms")
    ten_ms = median_of(windows, 10, lambda w: w.backends_ms)
    ten_wal = median_of(windows, 10, lambda w: w.stats.wal()[1])
    if ten_ms:
        print()
        print("model, 10-step runs (docs/explanation/capacity.md): PostgreSQL CPU-bound ceiling")
        for cores in sorted({os.cpu_count() or 1, 8, 32}):
            rate = cores * 1000 / ten_ms
            wal = f", WAL {rate * (ten_wal or 0) / 1e6:.1f} MB/s" if ten_wal else ""
            print(f"  {cores:>3} cores fully busy: {rate:,.0f} runs/s{wal}")
    for w in windows:
        for note in w.notes:
            print(f"note ({w.system}, {w.steps} step(s)): {note}")
    others = sum(w.stats.other_xacts * args.burst for w in windows)
    if others:
        print(
            f"note: other databases ran {others:.0f} transaction(s) during the windows: the "
            "[s] rows count their work"
        )
    print(f"(measured in {elapsed:.0f} s; load average {os.getloadavg()[0]:.2f} at end)")


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    parser.add_argument("--burst", type=int, default=200, help="runs per burst (200)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed runs per window (20)")
    parser.add_argument("--logs", type=Path, default=None, help="keep the workers' logs here")
    parser.add_argument(
        "--no-dbos",
        dest="dbos",
        action="store_false",
        help="leave out the DBOS queue anchor's window (benchmarks/dbos_queue_anchor.py)",
    )
    args = parser.parse_args(argv)
    if min(args.rounds, args.burst) < 1 or args.warmup < 0:
        parser.error("--rounds and --burst must be positive")
    return args


@contextlib.contextmanager
def log_dir(keep: Path | None) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="reactor-bench-capacity-") as logs:
        try:
            yield Path(logs)
        finally:
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                for log in Path(logs).glob("*.log"):
                    (keep / log.name).write_bytes(log.read_bytes())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    ensure_database(DATABASE)
    bench.setup_django()
    bench.redis_messages(REDIS_DB, delete=True)  # stale messages of an aborted run
    import testproject  # noqa: F401  (the project's Celery app: django_reactor publishes with it)

    windows: list[Window] = []
    errors: list[str] = []
    with log_dir(args.logs) as logs:
        for round_no in range(args.rounds):
            phases: list[tuple[str, Callable[[], Window]]] = [
                (
                    f"{steps} step(s)",
                    functools.partial(window, args, steps, logs, f"cap{round_no}-{steps}"),
                )
                for steps in sorted(REACTORS)
            ]
            if args.dbos:
                phases.append(
                    ("DBOS queue", functools.partial(dbos_window, args, logs, f"capdbos{round_no}"))
                )
            for label, measure in phases if round_no % 2 == 0 else phases[::-1]:
                try:
                    windows.append(measure())
                    status = "done"
                except Exception as exc:  # report the window as failed; go on with the others
                    errors.append(f"round {round_no + 1}, {label}: {exc}")
                    status = "FAILED"
                print(f"  round {round_no + 1}: {label} {status}", flush=True)
    latency = commit_latency()
    report(args, windows, latency, time.perf_counter() - started)
    for error in errors:
        print(f"ERROR {error}")
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
