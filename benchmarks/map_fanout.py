"""Throughput and memory of a fanned-out ``map_over``, beside a Celery group and a Celery chord.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/map_fanout.py [--elements 10000] [--small 1000] [--repeat 1]

A full run takes about 4-5 minutes (the 10,000-task chord alone takes over a minute);
``--quick`` (2,000 / 500 elements, no batch/chunk sweep) about a minute. Run it on an otherwise
idle machine: it prints how many CPU seconds other processes used meanwhile.

What it measures
----------------
* **django_reactor**: ``Map_b100_c50.run({"count": N})`` (``benchmarks.map_reactors``: one
  ``map_over(numbers, noop_element, item=arg.element(), fan_out=True)`` step, the library's
  default ``batch_size=100`` and ``chunk_size=50``; the element is a function step returning its
  item). ``run()`` reads the source into N ``MapResult`` slots, queues the element tasks and
  returns a ``Dispatched`` outcome; one Celery worker (``celery -A testproject worker -P prefork
  -c 2``, its own queue on Redis db 5, database ``reactor_bench_map``, created and migrated if
  missing, emptied at start) runs the elements and resumes the run when the last one settles.
  **elements/s = N / (from calling run() until a poll of the execution row, every 20 ms, reads
  ``completed``)**. Each measured map is checked: N slots, all succeeded, the run resumed once.
* **Celery group**: ``group(noop.s(i) for i < N).apply_async().get()``
  (``benchmarks/map_anchor.py``, as ``/work/shared/anchors/celery_group_anchor.py``: Redis
  broker db 6, Redis result backend db 7, ``task_acks_late``, prefetch 4), its own worker with
  the same flags and 2 processes.
* **Celery chord**: ``chord(noop.s(i) for i < N)(total.s())`` on the same anchor worker; the
  script polls the callback's result (``ready()``) every 20 ms: ``.get()`` on the chord's result
  was seen to hang after the callback had stored its result (Celery 5.7, Redis backend).
* **Memory**: the peak resident set (``VmHWM``) of the worker's parent and of each of its two
  pool processes, and of this process (which calls ``run()``, so reads the source into slots),
  reset (``/proc/<pid>/clear_refs``) just before the measured map and read right after it, at
  ``--small`` and ``--elements`` elements: flat in N is the target.
* **Summary**: the median time of ``store.maps.summary(map_id)`` (``--summary-calls`` calls after
  one untimed call) on the ``--elements`` map, and on a map of as many elements of which one in
  20 fails (``MapFailing``, ``atomic=False``): its failure sample is full and truncated.
* **batch_size / chunk_size**: the same map at ``--elements`` elements with each pair of
  ``map_reactors.CONFIGS`` on one worker (the default pair included), in a rotating order.

Every phase starts its own worker, warms it up, measures, waits for the worker to acknowledge
its messages and stops it (with its children, also on errors or Ctrl-C): the systems never share
the 2 CPUs. Phases alternate their order every repeat; medians over ``--repeat`` repeats are
compared. Targets: map/group >= 2.0, map/chord >= 10.0, memory flat in N, summary < 50 ms.
``--profile`` adds a cProfile of the element task body (``django_reactor.map_elements``) run in
this process over a ``--elements`` map (no worker), and prints where its time goes.

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, cpu_busy, ensure_database

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
REACTOR_DB = "reactor_bench_map"
REACTOR_REDIS_DB = 5
REACTOR_QUEUE = "django_reactor_bench_map"
ANCHOR_BROKER_DB = 6
ANCHOR_BACKEND_DB = 7
ANCHOR_QUEUE = "celery"  # the anchor's app uses Celery's default queue, alone in its database
CHUNKS_BROKER_DB = 8  # the durable chunks chord (benchmarks/chunks_anchor.py)
CHUNKS_BACKEND_DB = 9
TARGET_CHUNKS = 1.0
WORKER_PROCESSES = 2
TARGET_GROUP = 2.0
TARGET_CHORD = 10.0
TARGET_SUMMARY_MS = 50.0
FAIL_EVERY = 20  # MapFailing: one element in 20 fails (500 of 10,000)
POLL = 0.02  # seconds between two polls of a run's status or of the chord's callback
WARMUP_ELEMENTS = 200

# The benchmark process and the django_reactor worker share these settings (benchmarks.bg_settings
# reads the database, the broker and the queue from the environment).
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bg_settings"
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{REACTOR_DB}"
os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{REACTOR_REDIS_DB}"
os.environ["REACTOR_BENCH_QUEUE"] = REACTOR_QUEUE
os.environ["BROKER"] = f"{REDIS_SERVER}/{ANCHOR_BROKER_DB}"
os.environ["BACKEND"] = f"{REDIS_SERVER}/{ANCHOR_BACKEND_DB}"
os.environ["CHUNKS_BROKER"] = f"{REDIS_SERVER}/{CHUNKS_BROKER_DB}"
os.environ["CHUNKS_BACKEND"] = f"{REDIS_SERVER}/{CHUNKS_BACKEND_DB}"
os.environ["CHUNKS_DSN"] = f"{PG_SERVER}/{REACTOR_DB}"


class BenchmarkError(RuntimeError):
    """A phase could not be measured (a worker did not start, a map did not complete...)."""


# ---------------------------------------------------------------------------- setup


def setup_django() -> str:
    """Configure Django, migrate the benchmark database and empty django_reactor's tables.

    A migration edited in place (the map feature is not committed yet) leaves the database
    behind its models: then the database is dropped and created again. Returns a note if so.
    """
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    call_command("migrate", verbosity=0)
    note = ""
    missing = schema_drift()
    if missing:
        import psycopg
        from psycopg import sql

        connection.close()
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(REACTOR_DB))
            )
        ensure_database(REACTOR_DB)
        call_command("migrate", verbosity=0)
        note = f"database {REACTOR_DB} recreated: its schema lacked {', '.join(missing)}"
    empty_tables()
    return note


def schema_drift() -> list[str]:
    """Columns django_reactor's models have and the benchmark database lacks."""
    from django.apps import apps
    from django.db import connection

    missing = []
    with connection.cursor() as cursor:
        for model in apps.get_app_config("django_reactor").get_models():
            table = model._meta.db_table
            columns = {
                c.name for c in connection.introspection.get_table_description(cursor, table)
            }
            missing += [
                f"{table}.{f.column}"
                for f in model._meta.local_concrete_fields
                if f.column not in columns
            ]
    return missing


def empty_tables() -> None:
    from django.apps import apps
    from django.db import connection

    tables = [m._meta.db_table for m in apps.get_app_config("django_reactor").get_models()]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")


REDIS_KEYS = {
    REACTOR_REDIS_DB: [f"{REACTOR_QUEUE}*", "unacked*"],
    ANCHOR_BROKER_DB: [f"{ANCHOR_QUEUE}*", "unacked*"],
    ANCHOR_BACKEND_DB: ["celery-task-meta-*", "celery-taskset-meta-*", "*.j", "*.t"],
    CHUNKS_BROKER_DB: [f"{ANCHOR_QUEUE}*", "unacked*"],
    CHUNKS_BACKEND_DB: ["celery-task-meta-*", "celery-taskset-meta-*", "*.j", "*.t"],
}
RESULT_DBS = (ANCHOR_BACKEND_DB, CHUNKS_BACKEND_DB)


def redis_messages(db: int, *, delete: bool = False) -> dict[str, int]:
    """Messages (or results) in this benchmark's keys of Redis database ``db``."""
    import redis

    found: dict[str, int] = {}
    client = redis.Redis.from_url(f"{REDIS_SERVER}/{db}")
    try:
        keys = {key for pattern in REDIS_KEYS[db] for key in client.scan_iter(match=pattern)}
        if db in RESULT_DBS:
            if keys:
                found[f"db{db}:results"] = len(keys)
        else:
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
            keys_list = list(keys)
            for i in range(0, len(keys_list), 1000):
                client.delete(*keys_list[i : i + 1000])
    finally:
        client.close()
    return found


def wait_acked(db: int, limit: float = 5.0) -> None:
    """Wait until the worker acknowledged every message it took (bounded)."""
    import redis

    client = redis.Redis.from_url(f"{REDIS_SERVER}/{db}")
    deadline = time.monotonic() + limit
    try:
        while client.hlen("unacked") and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        client.close()


def clean_redis() -> dict[str, int]:
    """Delete the queues, unacked messages and results this benchmark uses; return them."""
    return {k: v for db in REDIS_KEYS for k, v in redis_messages(db, delete=True).items()}


# ---------------------------------------------------------------------------- memory


def _status_kb(pid: int, field_name: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak(pids: list[int]) -> bool:
    """Reset the peak RSS (VmHWM) of ``pids`` to their current RSS (Linux >= 4.0)."""
    ok = True
    for pid in pids:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            ok = False
    return ok


def peak_mb(pid: int) -> float | None:
    kb = _status_kb(pid, "VmHWM")
    return None if kb is None else kb / 1024


def rss_mb(pid: int) -> float | None:
    kb = _status_kb(pid, "VmRSS")
    return None if kb is None else kb / 1024


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            rest = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(rest[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


@dataclass
class Memory:
    """Peak RSS (MB) during one measured map: worker parent, its pool processes, this process."""

    parent: float | None
    children: list[float | None]
    starter: float | None
    starter_base: float | None  # this process's RSS when its peak was reset

    def text(self) -> str:
        kids = " / ".join(_mb(c) for c in self.children) or "-"
        return (
            f"worker parent {_mb(self.parent)}, pool {kids}; run() process {_mb(self.starter)}"
            f" (RSS {_mb(self.starter_base)} before)"
        )


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} MB"


# ---------------------------------------------------------------------------- workers


class Worker:
    """One ``celery worker`` subprocess in its own session, stopped with all its children."""

    def __init__(self, name: str, app: str, queue: str | None, env: dict[str, str], logs: Path):
        self.name = name
        self.log_path = logs / f"{name}.log"
        self.command = [
            sys.executable, "-m", "celery", "-A", app, "worker",
            "-P", "prefork", "-c", str(WORKER_PROCESSES),
            "-n", f"{name}-{os.getpid()}@%h",
            "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO",
        ]  # fmt: skip
        if queue is not None:
            self.command += ["-Q", queue]
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> Worker:
        with self.log_path.open("wb") as log:  # the child keeps its own handle
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while "ready." not in self.log():
            if self.process.poll() is not None:
                raise BenchmarkError(f"worker {self.name} exited at start:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise BenchmarkError(f"worker {self.name} not ready after {timeout:.0f} s")
            time.sleep(0.05)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def pool(self) -> list[int]:
        return children_of(self.pid)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Warm shutdown of the whole process group; SIGKILL what is left after 15 s."""
        process = self.process
        if process is None:
            return
        group = process.pid  # start_new_session: the worker leads its own process group
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
                process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):  # children a killed parent left behind
            os.killpg(group, signal.SIGKILL)
        self.process = None


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


@dataclass
class MapRun:
    """One measured map: its throughput, when run() returned, and the map's id."""

    elements: int
    seconds: float
    run_returned: float
    map_id: uuid.UUID
    execution_id: uuid.UUID

    @property
    def rate(self) -> float:
        return self.elements / self.seconds


def start_map(reactor: Any, inputs: dict[str, Any]) -> tuple[uuid.UUID, float, float]:
    """``reactor.run(inputs)``; returns the execution id, the start and how long run() took."""
    from django_reactor import Dispatched

    started = time.perf_counter()
    outcome = reactor.run(inputs)
    returned = time.perf_counter() - started
    if not isinstance(outcome, Dispatched):
        raise BenchmarkError(f"run() did not park the run for its map: {outcome!r}")
    return outcome.execution_id, started, returned


def wait_run(execution_id: uuid.UUID, *, limit: float) -> float:
    """Poll the execution row until it reads ``completed``; return that moment (bounded)."""
    from django.db import connection

    deadline = time.perf_counter() + limit
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT status, finished_at IS NOT NULL FROM django_reactor_execution "
                "WHERE id = %s",
                [execution_id],
            )
            status, finished = cursor.fetchone()
            now = time.perf_counter()
            if status == "completed":
                return now
            if finished:
                raise BenchmarkError(f"run {execution_id} ended {status}")
            if now > deadline:
                raise BenchmarkError(
                    f"run {execution_id} not completed after {limit:.0f} s ({status}; "
                    f"map {map_progress(execution_id)})"
                )
            time.sleep(POLL)


def map_progress(execution_id: uuid.UUID) -> str:
    from django_reactor.models import MapRun as MapRow

    row = MapRow.objects.filter(execution_id=execution_id).values().first()
    if row is None:
        return "not started"
    return (
        f"{row['status']}, {row['settled']}/{row['size']} settled, {row['succeeded']} succeeded, "
        f"{row['failed']} failed"
    )


def check_map(execution_id: uuid.UUID, elements: int, *, failed: int = 0) -> uuid.UUID:
    """The map's counters, its slots and the run's resumes are what they must be."""
    from django.db.models import Count, Q

    from django_reactor.models import ExecutionEvent, MapResult
    from django_reactor.models import MapRun as MapRow

    row = MapRow.objects.get(execution_id=execution_id)
    slots = MapResult.objects.filter(map_run_id=row.pk).aggregate(
        total=Count("id"),
        succeeded=Count("id", filter=Q(status="succeeded")),
        failed=Count("id", filter=Q(status="failed")),
    )
    resumes = ExecutionEvent.objects.filter(execution_id=execution_id, kind="resume").count()
    expected = {"total": elements, "succeeded": elements - failed, "failed": failed}
    counters = (row.size, row.settled, row.succeeded, row.failed, row.collected)
    problems = []
    if slots != expected:
        problems.append(f"slots {slots}, expected {expected}")
    if counters != (elements, elements, elements - failed, failed, True):
        problems.append(f"(size, settled, succeeded, failed, collected) = {counters}")
    if resumes != 1:
        problems.append(f"the run was resumed {resumes} times")
    if problems:
        raise BenchmarkError(f"map of run {execution_id} is wrong: {'; '.join(problems)}")
    return row.pk


def measure_map(reactor: Any, elements: int, *, limit: float) -> MapRun:
    execution_id, started, returned = start_map(reactor, {"count": elements})
    finished = wait_run(execution_id, limit=limit)
    map_id = check_map(execution_id, elements)
    return MapRun(elements, finished - started, returned, map_id, execution_id)


def map_limit(elements: int) -> float:
    return 60.0 + elements / 50  # seconds: 260 s for 10,000 elements


def time_summary(map_id: uuid.UUID, calls: int) -> tuple[float, dict[str, Any]]:
    """Median milliseconds of ``store.maps.summary(map_id)`` over ``calls`` calls (one untimed)."""
    from django_reactor import store

    result = store.maps.summary(map_id)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        result = store.maps.summary(map_id)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), result


# ---------------------------------------------------------------------------- anchors


def group_burst(count: int, *, limit: float) -> float:
    """A group of ``count`` no-op tasks; seconds until every result is in."""
    from benchmarks.map_anchor import group_of

    started = time.perf_counter()
    values = group_of(count).apply_async().get(timeout=limit)
    seconds = time.perf_counter() - started
    if values != list(range(count)):
        raise BenchmarkError(f"the group of {count} returned wrong results")
    return seconds


def chord_burst(count: int, *, limit: float) -> float:
    """A chord of ``count`` no-op tasks and a summing callback; seconds until its result is in."""
    from benchmarks.map_anchor import chord_of

    started = time.perf_counter()
    result = chord_of(count).apply_async()
    deadline = started + limit
    while not result.ready():
        if time.perf_counter() > deadline:
            raise BenchmarkError(f"the chord of {count} gave no result within {limit:.0f} s")
        time.sleep(POLL)
    seconds = time.perf_counter() - started
    value = result.get(timeout=5)
    if value != count * (count - 1) // 2:
        raise BenchmarkError(f"the chord of {count} returned {value!r}")
    return seconds


def chord_get_burst(count: int, *, limit: float) -> float:
    """A chord waited for the way the anchor script (and a user) does: ``result.get()``."""
    from benchmarks.map_anchor import chord_of

    started = time.perf_counter()
    value = chord_of(count).apply_async().get(timeout=limit)
    seconds = time.perf_counter() - started
    if value != count * (count - 1) // 2:
        raise BenchmarkError(f"the chord of {count} returned {value!r}")
    return seconds


def anchor_limit(elements: int) -> float:
    return 60.0 + elements / 20  # seconds: 560 s for 10,000 (a chord ran at 30/s elsewhere)


def chunks_burst(count: int, *, limit: float) -> float:
    """The durable chunks chord over ``count`` elements (``benchmarks/chunks_anchor.py``);
    seconds until its callback's result (the rows it counted in PostgreSQL) is in."""
    from benchmarks.chunks_anchor import durable_chord

    batch = uuid.uuid4().hex
    started = time.perf_counter()
    result = durable_chord(count, batch).apply_async()
    deadline = started + limit
    while not result.ready():
        if time.perf_counter() > deadline:
            raise BenchmarkError(f"the chunks chord of {count} gave no result within {limit:.0f} s")
        time.sleep(POLL)
    seconds = time.perf_counter() - started
    value = result.get(timeout=5)
    if value != count:
        raise BenchmarkError(f"the chunks chord of {count} stored {value!r} rows")
    return seconds


# ---------------------------------------------------------------------------- pg_stat


@dataclass(frozen=True)
class PgStat:
    """Counters of the benchmark database (commits, MapResult updates) and of the server's WAL.

    The WAL counters are server-wide: other databases' writes in the window count too.
    """

    commits: int
    wal_records: int
    wal_bytes: int
    updates: int
    hot_updates: int

    @classmethod
    def take(cls) -> PgStat:
        """A snapshot; call it with no backend of the database left that has not flushed its
        counters (PostgreSQL 15 flushes a backend's counters when it exits)."""
        import psycopg

        with psycopg.connect(f"{PG_SERVER}/{REACTOR_DB}", autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            commits = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
            wal = conn.execute("SELECT wal_records, wal_bytes FROM pg_stat_wal").fetchone()
            table = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relname = 'django_reactor_mapresult'"
            ).fetchone()
        return cls(
            int(commits[0]) if commits else 0,
            int(wal[0]) if wal else 0,
            int(wal[1]) if wal else 0,
            int(table[0]) if table else 0,
            int(table[1]) if table else 0,
        )

    def until(self, later: PgStat) -> PgStat:
        return PgStat(
            later.commits - self.commits,
            later.wal_records - self.wal_records,
            later.wal_bytes - self.wal_bytes,
            later.updates - self.updates,
            later.hot_updates - self.hot_updates,
        )

    def per_element(self, elements: int) -> str:
        hot = f"{self.hot_updates / self.updates:.0%}" if self.updates else "n/a"
        return (
            f"{self.commits / elements:.3f} commits, {self.wal_records / elements:.2f} WAL "
            f"records, {self.wal_bytes / elements:.0f} WAL bytes per element; MapResult "
            f"updates {self.updates} ({hot} HOT)"
        )


def quiet_snapshot() -> PgStat:
    """A pg_stat snapshot after this process's own connection let its counters go."""
    from django.db import connections

    connections.close_all()
    time.sleep(0.05)
    return PgStat.take()


# ---------------------------------------------------------------------------- the run


@dataclass
class Figures:
    map_s: dict[int, list[MapRun]] = field(default_factory=dict)
    group_s: dict[int, list[float]] = field(default_factory=dict)
    chord_s: dict[int, list[float]] = field(default_factory=dict)
    # The chord waited for with .get(), as /work/shared/anchors/celery_chord_anchor.py does
    # (at the small N only: at 10,000 it takes many minutes).
    chord_get_s: dict[int, list[float]] = field(default_factory=dict)
    memory: dict[int, list[Memory]] = field(default_factory=dict)
    anchor_memory: dict[int, list[Memory]] = field(default_factory=dict)
    sweep: dict[tuple[int, int], list[MapRun]] = field(default_factory=dict)
    chunks_s: dict[int, list[float]] = field(default_factory=dict)
    # pg_stat over the warm-up and the measured run, with the elements they cover.
    map_pg: dict[int, list[tuple[PgStat, int]]] = field(default_factory=dict)
    chunks_pg: dict[int, list[tuple[PgStat, int]]] = field(default_factory=dict)
    summary_ms: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    failing_summary_ms: float | None = None
    failing_summary: dict[str, Any] = field(default_factory=dict)
    failing_rate: float | None = None
    profile: str = ""
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)
    busy_before: float = 0.0
    cpu: CpuSample | None = None
    revision: tuple[str, str] = ("?", "?")


class Bench:
    def __init__(self, args: argparse.Namespace, figures: Figures, logs: Path) -> None:
        self.args = args
        self.figures = figures
        self.logs = logs
        self.workers: list[Worker] = []
        self.count = 0

    def _worker(self, kind: str) -> Worker:
        self.count += 1
        if kind == "reactor":
            return Worker(
                f"reactor{self.count}", "testproject", REACTOR_QUEUE, worker_env(django=True),
                self.logs,
            )  # fmt: skip
        if kind == "chunks":
            return Worker(
                f"chunks{self.count}", "benchmarks.chunks_anchor", None, worker_env(django=False),
                self.logs,
            )  # fmt: skip
        return Worker(
            f"anchor{self.count}", "benchmarks.map_anchor", None, worker_env(django=False),
            self.logs,
        )  # fmt: skip

    def _left(self, worker: Worker, db: int) -> None:
        left = redis_messages(db)
        if left:
            self.figures.notes.append(f"{worker.name}: message(s) left in Redis: {left}")

    def map_phase(self, elements: int) -> None:
        from benchmarks.map_reactors import DEFAULT, REACTORS

        reactor = REACTORS[DEFAULT]
        worker = self._worker("reactor")
        before = quiet_snapshot()
        with running(worker, self.workers):
            measure_map(reactor, WARMUP_ELEMENTS, limit=map_limit(WARMUP_ELEMENTS))
            pool = worker.pool()
            me = os.getpid()
            reset_peak([worker.pid, *pool])
            base = rss_mb(me)
            reset_peak([me])
            run = measure_map(reactor, elements, limit=map_limit(elements))
            memory = Memory(peak_mb(worker.pid), [peak_mb(p) for p in pool], peak_mb(me), base)
            self.figures.map_s.setdefault(elements, []).append(run)
            self.figures.memory.setdefault(elements, []).append(memory)
            if elements == self.args.elements and self.figures.summary_ms is None:
                ms, summary = time_summary(run.map_id, self.args.summary_calls)
                self.figures.summary_ms, self.figures.summary = ms, summary
            wait_acked(REACTOR_REDIS_DB)
        # The worker's backends flushed their counters as they exited.
        stat = before.until(quiet_snapshot())
        self.figures.map_pg.setdefault(elements, []).append((stat, elements + WARMUP_ELEMENTS))
        self._left(worker, REACTOR_REDIS_DB)

    def chunks_phase(self, elements: int) -> None:
        """The durable chunks chord, on its own worker (the fair anchor)."""
        from benchmarks import chunks_anchor

        chunks_anchor.create_table()
        chunks_anchor.empty_table()
        worker = self._worker("chunks")
        before = quiet_snapshot()
        with running(worker, self.workers):
            chunks_burst(WARMUP_ELEMENTS, limit=60)
            seconds = chunks_burst(elements, limit=anchor_limit(elements))
            self.figures.chunks_s.setdefault(elements, []).append(seconds)
            wait_acked(CHUNKS_BROKER_DB)
        chunks_anchor.connection().close()
        stat = before.until(quiet_snapshot())
        self.figures.chunks_pg.setdefault(elements, []).append((stat, elements + WARMUP_ELEMENTS))
        self._left(worker, CHUNKS_BROKER_DB)
        redis_messages(CHUNKS_BACKEND_DB, delete=True)
        chunks_anchor.empty_table()

    def anchor_phase(self, elements: int, order: int) -> None:
        worker = self._worker("anchor")
        limit = anchor_limit(elements)
        with running(worker, self.workers):
            group_burst(100, limit=60)
            chord_burst(100, limit=60)
            pool = worker.pool()
            reset_peak([worker.pid, *pool])
            kinds = ["group", "chord"] if order % 2 == 0 else ["chord", "group"]
            for kind in kinds:
                if kind == "group":
                    seconds = group_burst(elements, limit=limit)
                    self.figures.group_s.setdefault(elements, []).append(seconds)
                else:
                    seconds = chord_burst(elements, limit=limit)
                    self.figures.chord_s.setdefault(elements, []).append(seconds)
                    if elements == self.args.small:
                        seconds = chord_get_burst(elements, limit=limit)
                        self.figures.chord_get_s.setdefault(elements, []).append(seconds)
            self.figures.anchor_memory.setdefault(elements, []).append(
                Memory(peak_mb(worker.pid), [peak_mb(p) for p in pool], None, None)
            )
            wait_acked(ANCHOR_BROKER_DB)
        self._left(worker, ANCHOR_BROKER_DB)
        redis_messages(ANCHOR_BACKEND_DB, delete=True)  # 2 x N results, kept 10 minutes

    def sweep_phase(self, round_no: int) -> None:
        """Every batch/chunk pair on one worker, plus the failing map and its summary."""
        from benchmarks.map_reactors import CONFIGS, REACTORS, MapFailing

        elements = self.args.elements
        configs = CONFIGS[round_no % len(CONFIGS) :] + CONFIGS[: round_no % len(CONFIGS)]
        worker = self._worker("reactor")
        with running(worker, self.workers):
            measure_map(REACTORS[CONFIGS[0]], WARMUP_ELEMENTS, limit=map_limit(WARMUP_ELEMENTS))
            if not self.args.no_sweep:
                for config in configs:
                    run = measure_map(REACTORS[config], elements, limit=map_limit(elements))
                    self.figures.sweep.setdefault(config, []).append(run)
            if self.figures.failing_summary_ms is None:
                inputs = {"count": elements, "fail_every": FAIL_EVERY}
                execution_id, started, _ = start_map(MapFailing, inputs)
                finished = wait_run(execution_id, limit=map_limit(elements))
                failed = len(range(0, elements, FAIL_EVERY))
                map_id = check_map(execution_id, elements, failed=failed)
                self.figures.failing_rate = elements / (finished - started)
                ms, summary = time_summary(map_id, self.args.summary_calls)
                self.figures.failing_summary_ms, self.figures.failing_summary = ms, summary
                check_summary(summary, elements, failed)
            wait_acked(REACTOR_REDIS_DB)
        self._left(worker, REACTOR_REDIS_DB)

    def measure(self) -> None:
        sizes = sorted({self.args.small, self.args.elements, *self.args.large})
        celery_sizes = {self.args.small, self.args.elements}
        try:
            for round_no in range(self.args.repeat):
                phases: list[tuple[str, Any]] = []
                for elements in sizes:
                    pair = [(f"map N={elements}", lambda n=elements: self.map_phase(n))]
                    if elements in celery_sizes and not self.args.no_celery:
                        pair.append(
                            (
                                f"group+chord N={elements}",
                                lambda n=elements, r=round_no: self.anchor_phase(n, r),
                            )
                        )
                    if elements >= self.args.elements:
                        pair.append(
                            (f"chunks chord N={elements}", lambda n=elements: self.chunks_phase(n))
                        )
                    phases += pair if round_no % 2 == 0 else pair[::-1]
                phases.append(("batch/chunk sweep", lambda r=round_no: self.sweep_phase(r)))
                for name, phase in phases:
                    t0 = time.perf_counter()
                    status = "done"
                    try:
                        phase()
                    except Exception as exc:  # report the phase as failed; go on with the others
                        self.figures.errors.append(
                            f"round {round_no + 1} {name}: {type(exc).__name__}: {exc}"
                        )
                        status = "FAILED"
                    took = time.perf_counter() - t0
                    print(f"  round {round_no + 1}: {name} {status} ({took:.0f} s)", flush=True)
        finally:
            for worker in list(self.workers):
                worker.stop()


def check_summary(summary: dict[str, Any], elements: int, failed: int) -> None:
    from django_reactor.store.maps import FAILURE_SAMPLE

    problems = []
    expected = {"total": elements, "succeeded": elements - failed, "failed": failed, "pending": 0}
    got = {key: summary.get(key) for key in expected}
    if got != expected:
        problems.append(f"totals {got}, expected {expected}")
    sample = summary.get("failures") or []
    if len(sample) != min(failed, FAILURE_SAMPLE):
        problems.append(f"{len(sample)} failures sampled")
    if [s.get("index") for s in sample] != list(range(0, elements, FAIL_EVERY))[:FAILURE_SAMPLE]:
        problems.append("the sample is not the lowest failed indexes")
    if summary.get("failures_truncated") != (failed > FAILURE_SAMPLE):
        problems.append(f"failures_truncated={summary.get('failures_truncated')}")
    if problems:
        raise BenchmarkError(f"summary of the failing map is wrong: {'; '.join(problems)}")


# ---------------------------------------------------------------------------- profile


def profile_elements(args: argparse.Namespace, figures: Figures) -> None:
    """cProfile the element task's body in this process, over a ``--elements`` map."""
    import cProfile
    import io
    import pstats

    from benchmarks.map_reactors import DEFAULT, REACTORS
    from django_reactor.celery.tasks import map_elements, resume
    from django_reactor.models import MapRun as MapRow

    elements = args.elements
    empty_tables()
    redis_messages(REACTOR_REDIS_DB, delete=True)
    execution_id, _, _ = start_map(REACTORS[DEFAULT], {"count": elements})
    map_id = MapRow.objects.get(execution_id=execution_id).pk
    profiler = cProfile.Profile()
    started = time.perf_counter()
    deadline = started + map_limit(elements)
    profiler.enable()
    try:
        # One task body at a time (each works TASK_BUDGET seconds, then hands over).
        while MapRow.objects.filter(pk=map_id, status="running").exists():
            map_elements(str(map_id))
            if time.perf_counter() > deadline:
                raise BenchmarkError("the profiled map did not settle")
    finally:
        profiler.disable()
    seconds = time.perf_counter() - started
    resume(str(execution_id))  # the wake-up task the last settle queued
    redis_messages(REACTOR_REDIS_DB, delete=True)  # element / wake tasks nobody consumed
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(
        f"cProfile of django_reactor.map_elements over {elements} elements in one process "
        f"(batch/chunk {DEFAULT[0]}/{DEFAULT[1]}): {seconds:.1f} s under the profiler, "
        f"{elements / seconds:.0f} elements/s",
        file=stream,
    )
    print("django_reactor functions by cumulative time:", file=stream)
    rows = []
    for (filename, line, name), (_, calls, _, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        if "/django_reactor/" in filename and "/site-packages/" not in filename:
            short = filename.split("/django_reactor/", 1)[1]
            rows.append((cumtime, calls, f"{short}:{line}({name})"))
    for cumtime, calls, where in sorted(rows, reverse=True)[:14]:
        print(
            f"  {cumtime:7.2f} s {100 * cumtime / total:5.1f}%  {calls:6d} calls  {where}",
            file=stream,
        )
    stats.sort_stats("tottime").print_stats(12)
    figures.profile = stream.getvalue()


# ---------------------------------------------------------------------------- report


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
    """``git describe --dirty`` of the checkout, plus a digest of uncommitted code changes."""
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
    untracked = git("ls-files", "--others", "--exclude-standard", "django_reactor")
    if diff or untracked:
        digest = hashlib.sha1(diff.encode())
        for name in untracked.split():
            with contextlib.suppress(OSError):
                digest.update((REPO_ROOT / name).read_bytes())
        described += f" (diff {digest.hexdigest()[:8]})"
    return described


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


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def report(args: argparse.Namespace, figures: Figures, dropped: dict[str, int], elapsed: float):
    from benchmarks.map_reactors import DEFAULT

    sizes = sorted({args.small, args.elements, *args.large})
    print(
        f"map fan-out: map_over(fan_out=True, batch_size={DEFAULT[0]}, chunk_size={DEFAULT[1]}) "
        f"of no-op elements vs a durable Celery chord of chunks of 50 (the fair anchor), a "
        f"Celery group and a Celery chord of no-op tasks; one worker, "
        f"-P prefork -c {WORKER_PROCESSES}; {args.repeat} repeat(s)"
    )
    print(context_line(figures))
    if figures.revision[0] != figures.revision[1]:
        print(f"WARNING: the code changed during the run (now {figures.revision[1]})")
    if dropped:
        print(f"(dropped stale messages/results left by an earlier run: {dropped})")
    print()
    for n in sizes:
        maps = [r.rate for r in figures.map_s.get(n, [])]
        groups = [n / s for s in figures.group_s.get(n, [])]
        chords = [n / s for s in figures.chord_s.get(n, [])]
        m, g, c = _median(maps), _median(groups), _median(chords)
        returned = [r.run_returned for r in figures.map_s.get(n, [])]

        def rounds(values: list[float]) -> str:
            return ", ".join(f"{v:.0f}" for v in values) or "-"

        print(f"N = {n} elements")
        print(f"  map    elements/s: {_rate(m):>6}  (repeats: {rounds(maps)})", end="")
        if returned:
            print(f"; run() returned after {statistics.median(returned):.2f} s", end="")
        print()
        print(f"  group  elements/s: {_rate(g):>6}  (repeats: {rounds(groups)})")
        print(f"  chord  elements/s: {_rate(c):>6}  (repeats: {rounds(chords)}; callback "
              "result polled)")  # fmt: skip
        gets = [n / s for s in figures.chord_get_s.get(n, [])]
        if gets:
            cg = _median(gets)
            print(f"  chord  elements/s: {_rate(cg):>6}  (repeats: {rounds(gets)}; waited with "
                  ".get() as the anchor script does)")  # fmt: skip
            if m is not None and cg:
                verdict = "PASS" if m / cg >= TARGET_CHORD else "MISS"
                print(f"  ratio map/chord (.get): {m / cg:6.2f}   target >= {TARGET_CHORD}   "
                      f"{verdict}")  # fmt: skip
        durable = [n / s for s in figures.chunks_s.get(n, [])]
        d = _median(durable)
        if durable:
            print(f"  durable chunks chord elements/s: {_rate(d):>6}  (repeats: "
                  f"{rounds(durable)}; chunks of 50, each committed in one INSERT; callback "
                  "result polled)")  # fmt: skip
        for stat, covered in figures.map_pg.get(n, []):
            print(f"  pg_stat, map (with the {WARMUP_ELEMENTS}-element warm-up): "
                  f"{stat.per_element(covered)}")  # fmt: skip
        for stat, covered in figures.chunks_pg.get(n, []):
            print(f"  pg_stat, chunks chord (with the warm-up): {stat.per_element(covered)}")
        checks = (
            ("durable chunks chord", d, TARGET_CHUNKS),
            ("group", g, TARGET_GROUP),
            ("chord", c, TARGET_CHORD),
        )
        for label, other, target in checks:
            if m is not None and other:
                ratio = m / other
                verdict = "PASS" if ratio >= target else "MISS"
                print(f"  ratio map/{label}: {ratio:6.2f}   target >= {target}   {verdict}")
            elif (label == "durable chunks chord" and n >= args.elements) or (
                label != "durable chunks chord" and n in (args.small, args.elements)
            ):
                print(f"  ratio map/{label}:    n/a   target >= {target}")
        for memory in figures.memory.get(n, []):
            print(f"  peak RSS, map:   {memory.text()}")
        for memory in figures.anchor_memory.get(n, []):
            kids = " / ".join(_mb(x) for x in memory.children)
            print(f"  peak RSS, anchor worker (group + chord): parent {_mb(memory.parent)}, "
                  f"pool {kids}")  # fmt: skip
    if len(sizes) == 2:
        small, large = sizes
        s_mem, l_mem = figures.memory.get(small, []), figures.memory.get(large, [])
        if s_mem and l_mem:

            def worst(mems: list[Memory]) -> float:
                values = [m.parent or 0 for m in mems] + [c or 0 for m in mems for c in m.children]
                return max(values)

            def starter(mems: list[Memory]) -> float:
                return max((m.starter or 0) - (m.starter_base or 0) for m in mems)

            growth = worst(l_mem) - worst(s_mem)
            print(
                f"memory, {small} -> {large} elements: largest worker process peak "
                f"{worst(s_mem):.1f} -> {worst(l_mem):.1f} MB ({growth:+.1f} MB); run() process "
                f"peak above its RSS {starter(s_mem):+.1f} -> {starter(l_mem):+.1f} MB"
            )
    print()
    for label, ms, summary in (
        (f"{args.elements}-element map", figures.summary_ms, figures.summary),
        (
            f"{args.elements}-element map, 1 in {FAIL_EVERY} failed",
            figures.failing_summary_ms,
            figures.failing_summary,
        ),
    ):
        if ms is None:
            print(f"summary of the {label}: not measured")
            continue
        verdict = "PASS" if ms < TARGET_SUMMARY_MS else "MISS"
        totals = {k: summary.get(k) for k in ("total", "succeeded", "failed", "pending")}
        sample = len(summary.get("failures") or [])
        print(
            f"summary of the {label}: median {ms:.2f} ms over {args.summary_calls} calls "
            f"(target < {TARGET_SUMMARY_MS:.0f} ms, {verdict}); {totals}, {sample} failures "
            f"sampled, truncated={summary.get('failures_truncated')}"
        )
    if figures.failing_rate is not None:
        print(f"  (the failing map ran at {figures.failing_rate:.0f} elements/s)")
    if figures.sweep:
        print()
        print(f"batch_size / chunk_size at N = {args.elements} (one worker, rotating order):")
        best = max(figures.sweep, key=lambda k: statistics.median(r.rate for r in figures.sweep[k]))
        for config, runs in figures.sweep.items():
            rates = [r.rate for r in runs]
            tasks = max(1, config[0] // config[1])
            mark = "  <- best" if config == best else ""
            default = " (default)" if config == DEFAULT else ""
            print(
                f"  {config[0]:>4} / {config[1]:<4} ({tasks:>2} tasks){default:10} "
                f"{statistics.median(rates):6.0f} elements/s "
                f"(repeats: {', '.join(f'{r:.0f}' for r in rates)}){mark}"
            )
    if figures.profile:
        print()
        print(figures.profile.rstrip())
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=None, help="the large N (10000)")
    parser.add_argument("--small", type=int, default=None, help="the small N (1000)")
    parser.add_argument("--repeat", type=int, default=1, help="repeats of every phase (1)")
    parser.add_argument(
        "--quick", action="store_true", help="2000 / 500 elements, no batch/chunk sweep"
    )
    parser.add_argument(
        "--large",
        type=int,
        action="append",
        default=None,
        help="a larger N measured for the map and the durable chunks chord only (100000; "
        "repeatable; 0: none)",
    )
    parser.add_argument(
        "--no-sweep", action="store_true", help="skip the batch_size / chunk_size sweep"
    )
    parser.add_argument(
        "--no-celery",
        action="store_true",
        help="skip the one-task-per-element Celery group and chord",
    )
    parser.add_argument("--summary-calls", type=int, default=15, help="timed summary() calls (15)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile the element task's body over an --elements map, in this process",
    )
    parser.add_argument(
        "--logs", type=Path, default=None, help="keep the workers' logs in this directory"
    )
    args = parser.parse_args(argv)
    if args.elements is None:
        args.elements = 2000 if args.quick else 10000
    if args.small is None:
        args.small = 500 if args.quick else 1000
    if args.large is None:
        args.large = [5000] if args.quick else [100000]
    args.large = [n for n in args.large if n > 0]
    if args.quick:
        args.no_sweep = True
    if min(args.elements, args.small, args.repeat, args.summary_calls) < 1:
        parser.error("--elements, --small, --repeat and --summary-calls must be positive")
    return args


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds through the finally blocks that stop the workers


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    # Ctrl-C even when started in the background of a shell (which ignores SIGINT for it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    load_before = os.getloadavg()[0]
    revision = code_revision()
    busy_before = cpu_busy(1.0)
    cpu_start = CpuSample.take()
    started = time.perf_counter()
    ensure_database(REACTOR_DB)
    recreated = setup_django()
    dropped = clean_redis()
    import testproject  # noqa: F401  (the project's Celery app: django_reactor publishes with it)

    figures = Figures()
    if recreated:
        figures.notes.append(recreated)
    with tempfile.TemporaryDirectory(prefix="reactor-bench-map-") as logs:
        try:
            Bench(args, figures, Path(logs)).measure()
            if args.profile:
                try:
                    profile_elements(args, figures)
                except Exception as exc:
                    figures.errors.append(f"profile: {type(exc).__name__}: {exc}")
        finally:
            clean_redis()
            if args.logs is not None:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(logs).glob("*.log"):
                    (args.logs / log.name).write_bytes(log.read_bytes())
            elif figures.errors:  # keep the workers' logs of a failed run
                kept = Path(tempfile.mkdtemp(prefix="reactor-bench-map-logs-"))
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
