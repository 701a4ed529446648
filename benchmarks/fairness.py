"""Fairness of concurrency keys: a backlog of one key, then a few runs of another, on workers.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/fairness.py [--a 10000] [--b 100] [--limit 2]

It takes about as long as one worker needs to run ``--a`` runs (the contrast's phase runs all
of them), plus twice the time to submit ``--a + --b`` runs: about 6.5 minutes at the defaults
on a loaded 2-core machine.

What it measures (issue 31's "Must show")
-----------------------------------------
``FairKeyed`` (``benchmarks/flow_reactors.py``: two no-op steps, ``Meta.background = "all"``,
``Meta.concurrency = Concurrency(key="{tenant}", limit=--limit, on_limit="queue")``) is started
``--a`` times with ``tenant="A"``, then ``--b`` times with ``tenant="B"``, as fast as this
process can, while no worker runs: the runs over each key's limit are stored ``queued``, the
first ``--limit`` of each key are ``pending`` with a task in the broker. Then one Celery worker
starts (``celery -A testproject worker -P prefork -c 2``, the example project's settings, its
own queue ``django_reactor_bench_fair`` on Redis db 1, database ``reactor_bench_fair``, emptied
at start) and runs them: each run that ends admits the next queued run of its key. The phase
ends once every run of B has completed (or after ``--timeout`` seconds); the worker is stopped
and the runs' ``started_at`` (set by the worker's claim) and ``finished_at`` are read back.

The contrast phase does the same with ``FairPlain`` (the same reactor without a concurrency
key): every run is ``pending`` with its task in the broker, A's 10,000 ahead of B's 100.

For each phase the table shows:

* **A completed when B's last run started**: the runs of A with ``finished_at`` at or before
  the latest ``started_at`` of B's runs. Target: fewer than a tenth of ``--a`` (B's runs all
  start before A's backlog is a tenth done).
* **Jain's index over slices**: the *window* is the time while both keys have runs waiting,
  from the first start of any run (the worker's first claim; every run was submitted before)
  to the earlier of the two keys' last starts (a key's last run waits until it starts; a key
  that never started every run waits until the end of the phase). The window is cut into
  ``--slices`` equal time slices; in each slice that holds a start, x_k is the number of runs
  of key k (A, B) that started in it and J = (x_A + x_B)^2 / (2 * (x_A^2 + x_B^2)), from
  1/2 (one key took every start) to 1 (both started as many). The figure is the mean of J
  over those slices. Target: >= 0.95. **Jain's index over the window** is the same formula
  over the window's totals (one slice), as context.
* **Most running at once**: the most runs of one key whose ``started_at``..``finished_at``
  intervals overlap (at most ``--limit`` with a key).
* The window's length, the starts in it, runs completed per second over the phase, and how
  long submitting took (``run()`` calls a second; a key's lock and count are in each).

``--limit`` is passed to the worker through ``FLOW_BENCH_LIMIT`` (the reactor's module reads
it). ``--logs DIR`` keeps the worker's logs. Override the servers with ``BENCH_PG`` (default
``postgresql://postgres@127.0.0.1:5432``) and ``BENCH_REDIS`` (default
``redis://127.0.0.1:6379``). The exit code is 0 whatever the figures: this is a benchmark,
not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, cpu_busy, ensure_database
from benchmarks.workers import BenchmarkError, Worker

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
DATABASE = "reactor_bench_fair"
# The one db number no other benchmark nor the tests use; concurrency_cost.py shares it (its own
# queue): run one benchmark at a time.
REDIS_DB = 1
QUEUE = "django_reactor_bench_fair"
WORKER_PROCESSES = 2
TARGET_SHARE = 0.10  # of A completed when B's last run starts: less than this
TARGET_JAIN = 0.95
POLL = 0.25  # seconds between two polls of B's runs while a phase runs

os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bg_settings"
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"
os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{REDIS_DB}"
os.environ["REACTOR_BENCH_QUEUE"] = QUEUE


# ---------------------------------------------------------------------------- setup


def setup_django() -> None:
    """Configure Django and migrate the benchmark database."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def empty() -> dict[str, int]:
    """Empty django_reactor's tables and this benchmark's Redis keys; return what Redis held."""
    import redis
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_reactor_execution, django_reactor_steprecord, "
            "django_reactor_executionevent, django_reactor_dispatch, "
            "django_reactor_flowkey CASCADE"
        )
    dropped: dict[str, int] = {}
    client = redis.Redis.from_url(f"{REDIS_SERVER}/{REDIS_DB}")
    try:
        keys = [*client.scan_iter(match=f"{QUEUE}*"), *client.scan_iter(match="unacked*")]
        for key in keys:
            kind = client.type(key)
            if kind == b"list":
                dropped[key.decode(errors="replace")] = int(client.llen(key))
            elif kind == b"hash":
                dropped[key.decode(errors="replace")] = int(client.hlen(key))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
    return {k: v for k, v in dropped.items() if v}


# ---------------------------------------------------------------------------- a phase


@dataclass
class Run:
    key: str
    started: dt.datetime | None
    finished: dt.datetime | None
    status: str


@dataclass
class Phase:
    """One phase's runs and timings."""

    name: str
    submit_s: float = 0.0
    runs: dict[str, list[Run]] = field(default_factory=dict)  # key -> runs, in arrival order
    worker_s: float = 0.0  # seconds the worker ran (from its start until the phase ended)
    b_all_completed: bool = False
    errors: list[str] = field(default_factory=list)


def submit(reactor: Any, tenant: str, count: int) -> list[uuid.UUID]:
    """Start ``count`` runs of ``reactor`` for ``tenant``; their ids, in arrival order."""
    from django_reactor import Dispatched, Queued

    ids = []
    for _ in range(count):
        outcome = reactor.run({"tenant": tenant})
        if not isinstance(outcome, (Dispatched, Queued)):
            raise BenchmarkError(f"run() neither dispatched nor queued the run: {outcome!r}")
        ids.append(outcome.execution_id)
    return ids


def wait_completed(ids: list[uuid.UUID], timeout: float) -> bool:
    """Poll until every run in ``ids`` has completed (True) or ``timeout`` passed (False)."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT count(*) FILTER (WHERE status = 'completed'), "
                "count(*) FILTER (WHERE finished_at IS NOT NULL AND status <> 'completed') "
                "FROM django_reactor_execution WHERE id = ANY(%s)",
                [ids],
            )
            done, ended_otherwise = cursor.fetchone()
            if ended_otherwise:
                raise BenchmarkError(f"{ended_otherwise} run(s) ended without completing")
            if done == len(ids):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL)


def read_runs(ids: list[uuid.UUID], key: str) -> list[Run]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, started_at, finished_at, status FROM django_reactor_execution "
            "WHERE id = ANY(%s)",
            [ids],
        )
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    return [Run(key, *rows[i]) for i in ids]


@contextlib.contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    try:
        yield worker.start()
    finally:
        worker.stop()


def run_phase(name: str, reactor: Any, args: argparse.Namespace, logs: Path, phase: Phase) -> Phase:
    """Submit A's runs then B's with no worker, then run them on one worker until B's are done."""
    empty()
    started = time.perf_counter()
    ids_a = submit(reactor, "A", args.a)
    ids_b = submit(reactor, "B", args.b)
    phase.submit_s = time.perf_counter() - started
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    worker = Worker(f"fair-{name}", "testproject", QUEUE, env, logs, processes=WORKER_PROCESSES)
    with running(worker):
        began = time.perf_counter()
        try:
            phase.b_all_completed = wait_completed(ids_b, args.timeout)
        finally:
            phase.worker_s = time.perf_counter() - began
    phase.runs = {"A": read_runs(ids_a, "A"), "B": read_runs(ids_b, "B")}
    return phase


# ---------------------------------------------------------------------------- figures


def jain(counts: list[int]) -> float:
    """Jain's fairness index of ``counts``: (sum x)^2 / (n * sum x^2); 1 when all are equal."""
    square_sum = sum(x * x for x in counts)
    if not square_sum:
        return 1.0
    return sum(counts) ** 2 / (len(counts) * square_sum)


def most_at_once(runs: list[Run]) -> int:
    """The most runs whose started..finished intervals overlap (a run not finished runs on)."""
    edges: list[tuple[dt.datetime, int]] = []
    never = dt.datetime.max.replace(tzinfo=dt.UTC)
    for run in runs:
        if run.started is not None:
            edges.append((run.started, 1))
            edges.append((run.finished or never, -1))
    edges.sort(key=lambda edge: (edge[0], edge[1]))  # an end before a start at the same instant
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@dataclass
class Fairness:
    a_done_at_b_last: int | None  # None: some run of B never started
    a_started_at_b_last: int | None
    b_last_after_s: float | None  # B's last start, seconds after the first start
    window_s: float
    window_starts: dict[str, int]
    slices: list[tuple[int, int]]  # (A, B) starts per slice with a start
    jain_slices: float
    jain_window: float
    most: dict[str, int]
    completed_per_s: float


def fairness(phase: Phase, slices: int) -> Fairness:
    runs_a, runs_b = phase.runs["A"], phase.runs["B"]
    everything = runs_a + runs_b
    starts = {k: sorted(r.started for r in rs if r.started) for k, rs in phase.runs.items()}
    first = min(s[0] for s in starts.values() if s)
    ends = [r.finished for r in everything if r.finished is not None]
    observed_until = max([*ends, *(s[-1] for s in starts.values() if s)])
    # A key has runs waiting until its last run starts (or the phase's end, if one never did).
    waiting_until = {
        k: starts[k][-1] if len(starts[k]) == len(phase.runs[k]) else observed_until
        for k in phase.runs
    }
    end = min(waiting_until.values())
    window = max((end - first).total_seconds(), 1e-6)
    width = window / slices
    per_slice: list[list[int]] = [[0, 0] for _ in range(slices)]
    for column, key in enumerate(("A", "B")):
        for at in starts[key]:
            if at > end:
                break
            index = min(int((at - first).total_seconds() / width), slices - 1)
            per_slice[index][column] += 1
    used = [(a, b) for a, b in per_slice if a + b]
    totals = [sum(a for a, _ in used), sum(b for _, b in used)]
    b_last: dt.datetime | None = None
    if len(starts["B"]) == len(runs_b):
        b_last = starts["B"][-1]
    completed = sum(1 for r in everything if r.status == "completed")
    return Fairness(
        a_done_at_b_last=None
        if b_last is None
        else sum(1 for r in runs_a if r.finished is not None and r.finished <= b_last),
        a_started_at_b_last=None
        if b_last is None
        else sum(1 for r in runs_a if r.started is not None and r.started <= b_last),
        b_last_after_s=None if b_last is None else (b_last - first).total_seconds(),
        window_s=window,
        window_starts={"A": totals[0], "B": totals[1]},
        slices=used,
        jain_slices=sum(jain([a, b]) for a, b in used) / len(used) if used else 0.0,
        jain_window=jain(totals),
        most={k: most_at_once(rs) for k, rs in phase.runs.items()},
        completed_per_s=completed / max((observed_until - first).total_seconds(), 1e-6),
    )


# ---------------------------------------------------------------------------- report


def report(
    args: argparse.Namespace,
    phases: list[tuple[Phase, Fairness | None]],
    context: dict[str, Any],
) -> None:
    print(
        f"fairness: {args.a:,} runs of key A, then {args.b:,} of key B, submitted before one "
        f"worker (-P prefork -c {WORKER_PROCESSES}) starts; 2 no-op steps each"
    )
    print(context["line"])
    share_target = int(args.a * TARGET_SHARE)
    header = (
        f"{'phase':<28} {'A done at B last start':>24} {'Jain slices':>11} {'Jain window':>11} "
        f"{'window':>8} {'starts A/B':>11} {'most at once A/B':>16} {'done/s':>7} "
        f"{'submit/s':>8}"
    )
    print()
    print(header)
    print("-" * len(header))
    for phase, figures in phases:
        submitted = (args.a + args.b) / phase.submit_s if phase.submit_s else 0.0
        if figures is None:
            print(f"{phase.name:<28} (no figures: {'; '.join(phase.errors) or 'failed'})")
            continue
        done = (
            f"{figures.a_done_at_b_last:,} ({figures.a_done_at_b_last / args.a:.1%})"
            if figures.a_done_at_b_last is not None
            else "B not all started"
        )
        print(
            f"{phase.name:<28} {done:>24} {figures.jain_slices:>11.3f} "
            f"{figures.jain_window:>11.3f} {figures.window_s:>7.1f}s "
            f"{figures.window_starts['A']:>5}/{figures.window_starts['B']:<5} "
            f"{figures.most['A']:>8}/{figures.most['B']:<7} {figures.completed_per_s:>7.1f} "
            f"{submitted:>8.0f}"
        )
    print()
    for phase, figures in phases:
        if figures is None:
            continue
        shown = " ".join(f"{a}/{b}" for a, b in figures.slices)
        print(f"{phase.name}: starts A/B per slice: {shown}")
        if figures.b_last_after_s is not None:
            print(
                f"{phase.name}: B's last run started {figures.b_last_after_s:.1f} s after the "
                f"first start; by then {figures.a_started_at_b_last:,} of A had started"
            )
        if not phase.b_all_completed:
            print(f"{phase.name}: B's runs had not all completed after {args.timeout:.0f} s")
    keyed = phases[0][1] if phases and phases[0][0].name.startswith("concurrency") else None
    print()
    if keyed is None:
        print("targets: no figures for the concurrency-key phase")
    else:
        done = keyed.a_done_at_b_last
        ok = done is not None and done < share_target
        print(
            f"with a key: A completed when B's last run started: "
            f"{'n/a' if done is None else f'{done:,}'}   target < {share_target:,} "
            f"({TARGET_SHARE:.0%} of A)   {'PASS' if ok else 'MISS'}"
        )
        ok = keyed.jain_slices >= TARGET_JAIN
        print(
            f"with a key: Jain's index of starts per key, mean over {len(keyed.slices)} slices: "
            f"{keyed.jain_slices:.3f}   target >= {TARGET_JAIN}   {'PASS' if ok else 'MISS'}"
        )
        ok = max(keyed.most.values()) <= args.limit
        print(
            f"with a key: most runs of one key running at once: {max(keyed.most.values())}   "
            f"limit {args.limit}   {'PASS' if ok else 'MISS'}"
        )
    for phase, _ in phases:
        for error in phase.errors:
            print(f"ERROR {phase.name}: {error}")
    for note in context.get("notes", []):
        print(f"note: {note}")
    print(
        f"(measured in {context['elapsed']:.0f} s; CPUs {context['busy']:.0%} busy just before; "
        f"load average {context['load'][0]:.2f} before, {context['load'][1]:.2f} at end)"
    )


def context_line() -> str:
    import celery
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg_version = cursor.fetchone()[0]
    return (
        f"{os.cpu_count()} CPUs, PostgreSQL {pg_version}, Celery {celery.__version__}, "
        f"Django {django.get_version()}, Python {sys.version.split()[0]}"
    )


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=int, default=10_000, help="runs of key A (10,000)")
    parser.add_argument("--b", type=int, default=100, help="runs of key B, after A's (100)")
    parser.add_argument("--limit", type=int, default=2, help="runs in flight per key (2)")
    parser.add_argument("--slices", type=int, default=10, help="time slices of the window (10)")
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds a phase may run (900)"
    )
    parser.add_argument(
        "--no-contrast",
        dest="contrast",
        action="store_false",
        help="leave out the phase without a concurrency key (it runs every run of A)",
    )
    parser.add_argument(
        "--logs", type=Path, default=None, help="keep the worker's logs in this directory"
    )
    args = parser.parse_args(argv)
    if min(args.a, args.b, args.limit, args.slices) < 1 or args.timeout <= 0:
        parser.error("--a, --b, --limit, --slices and --timeout must be positive")
    os.environ["FLOW_BENCH_LIMIT"] = str(args.limit)
    return args


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds through the finally blocks that stop the worker


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    load_before = os.getloadavg()[0]
    busy = cpu_busy(1.0)
    started = time.perf_counter()
    ensure_database(DATABASE)
    setup_django()
    import testproject  # noqa: F401  (the project's Celery app: django_reactor publishes with it)
    from benchmarks.flow_reactors import FairKeyed, FairPlain

    notes: list[str] = []
    dropped = empty()
    if dropped:
        notes.append(f"emptied Redis db {REDIS_DB} of stale messages: {dropped}")
    plan = [(f"concurrency key (limit {args.limit})", "keyed", FairKeyed)]
    if args.contrast:
        plan.append(("no key (plain background)", "plain", FairPlain))
    phases: list[tuple[Phase, Fairness | None]] = []
    with tempfile.TemporaryDirectory(prefix="reactor-bench-fair-") as logs:
        for title, name, reactor in plan:
            phase = Phase(title)
            figures: Fairness | None = None
            try:
                run_phase(name, reactor, args, Path(logs), phase)
                figures = fairness(phase, args.slices)
            except Exception as exc:  # report the phase as failed; go on with the next
                phase.errors.append(f"{type(exc).__name__}: {exc}")
            print(f"  {title}: {'FAILED' if phase.errors else 'done'}", flush=True)
            phases.append((phase, figures))
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            for log in Path(logs).glob("*.log"):
                (args.logs / log.name).write_bytes(log.read_bytes())
    empty()
    context = {
        "line": context_line(),
        "notes": notes,
        "elapsed": time.perf_counter() - started,
        "busy": busy,
        "load": (load_before, os.getloadavg()[0]),
    }
    report(args, phases, context)
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
