"""Latency of resuming a paused run through the API, with the rest of the run on a worker.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/resume_latency.py [--samples 200] [--burst 100]

It takes about 30 s. Run it on an otherwise idle machine: it prints how many CPU seconds other
processes used meanwhile, and warns when they skewed the figures.

What it measures
----------------
``ResumeOnce`` (defined here): an ``approval`` interrupt (``resume="background"``, payload
validated by a DRF serializer) followed by one no-op step. ``ResumeOnce.run({})`` pauses at
once, in this process. Each paused run is then resumed by a signed webhook (Standard Webhooks
headers from ``django_reactor.api.signatures.sign``, a new webhook id each time) POSTed to
``/reactor/executions/<id>/resume/`` through Django's test client (``django.test.Client``: the
whole Django request path, middleware and DRF view included, minus the network and the WSGI
server). The view verifies the signature, reserves the webhook id, validates the payload,
claims the interrupt, commits the run ``pending`` with its outbox row, publishes the task and
answers 202. One Celery worker (``celery -A testproject worker -P prefork -c 2``, its own queue
on Redis db 11) runs the rest against PostgreSQL (database ``reactor_bench_resume``, created and
migrated if missing, emptied at start).

* **N=1** (``--samples`` times, one run at a time): POST-to-202, the wall time of
  ``Client.post()``; POST-to-completed, from the start of the POST until the execution row reads
  ``completed`` (polled every ~1 ms).
* **N=100** (``--burst``, one burst): the runs are paused first, then resumed back to back, as
  fast as this one process answers, while a thread polls the 100 rows every ``BURST_POLL``
  seconds; per run, POST-to-202 and POST-to-completed (the first poll that saw it completed).

Medians and p99 (nearest rank) of both, for both, against the targets: POST-to-202 p99 < 50 ms,
POST-to-completed median < 100 ms. The worker and this process are warmed up first
(``--warmup`` resumes). ``--profile`` runs ``--profile-runs`` extra resume requests under
cProfile afterwards and prints where the request's time goes.

Override the servers with ``BENCH_PG`` (default ``postgresql://postgres@127.0.0.1:5432``) and
``BENCH_REDIS`` (default ``redis://127.0.0.1:6379``). The exit code is 0 whatever the figures:
this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, cpu_busy, ensure_database, percentile

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
REACTOR_DB = "reactor_bench_resume"
REACTOR_REDIS_DB = 11
REACTOR_QUEUE = "django_reactor_bench_resume"
WORKER_PROCESSES = 2
TARGET_202_P99_MS = 50.0
TARGET_COMPLETED_MEDIAN_MS = 100.0
SAMPLE_POLL = 0.001  # seconds between two polls of one run's row (N=1)
# Seconds between two polls of the burst's rows, from a thread of this process: one poll of 100
# ids costs the server about 0.5 ms, and the thread takes the GIL from the requests meanwhile.
BURST_POLL = 0.005
WAIT_LIMIT = 60.0  # seconds: the longest a burst (or one run) may take before it is abandoned
MODULE = "benchmarks.resume_latency"  # this file's import path, also when run as a script
REACTOR_NAME = f"{MODULE}.ResumeOnce"
PAYLOAD = {"approved": True, "approver": "bench@example.com", "note": "resume latency"}

if __name__ == "__main__":
    # The benchmark process and the worker share these settings. (The worker imports this module
    # by the reactor's dotted name, with its environment already set.)
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.resume_settings"
    os.environ["DATABASE_URL"] = f"{PG_SERVER}/{REACTOR_DB}"
    os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{REACTOR_REDIS_DB}"
    os.environ["REACTOR_BENCH_QUEUE"] = REACTOR_QUEUE


class BenchmarkError(RuntimeError):
    """A phase could not be measured (the worker did not start, a run did not complete...)."""


# ---------------------------------------------------------------------------- the reactor

_reactor: Any = None


def resume_once() -> Any:
    """The reactor: ``approval`` (background interrupt) then ``after`` (a no-op step).

    Built on first use, after Django is set up, with this module's import path as its
    ``__module__`` and name, so that the benchmark (running this file as ``__main__``) and the
    worker (importing ``benchmarks.resume_latency.ResumeOnce`` by name) define the same reactor.
    """
    global _reactor
    if _reactor is None:
        from rest_framework import serializers

        from benchmarks.bg_reactors import noop
        from django_reactor import Reactor, interrupt, step

        class Approval(serializers.Serializer):  # type: ignore[type-arg]
            approved = serializers.BooleanField()
            approver = serializers.CharField(max_length=100)
            note = serializers.CharField(max_length=500, required=False, default="")

        attrs = {
            "__module__": MODULE,
            "__qualname__": "ResumeOnce",
            "approval": interrupt(payload=Approval, resume="background"),
            "after": step(noop, wait_for=["approval"]),
            "Meta": type("Meta", (), {"name": REACTOR_NAME}),
        }
        _reactor = type("ResumeOnce", (Reactor,), attrs)
    return _reactor


def __getattr__(name: str) -> Any:  # the worker's registry imports the reactor by its name
    if name == "ResumeOnce":
        return resume_once()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
            "django_reactor_executionevent, django_reactor_dispatch, django_reactor_interrupt, "
            "django_reactor_apirequest CASCADE"
        )


REDIS_KEYS = [f"{REACTOR_QUEUE}*", "unacked*"]


def redis_messages(*, delete: bool = False) -> dict[str, int]:
    """Messages waiting or unacknowledged in this benchmark's keys of its Redis database."""
    import redis

    found: dict[str, int] = {}
    client = redis.Redis.from_url(f"{REDIS_SERVER}/{REACTOR_REDIS_DB}")
    try:
        keys = {key for pattern in REDIS_KEYS for key in client.scan_iter(match=pattern)}
        for key in keys:
            kind = client.type(key)
            if kind == b"list":
                count = int(client.llen(key))
            elif kind == b"hash" and key == b"unacked":
                count = int(client.hlen(key))
            else:
                continue
            if count:
                found[f"db{REACTOR_REDIS_DB}:{key.decode(errors='replace')}"] = count
        if delete and keys:
            client.delete(*keys)
    finally:
        client.close()
    return found


def wait_acked(limit: float = 3.0) -> None:
    """Wait until the worker acknowledged every message it took (bounded).

    A run reads completed a moment before the worker acknowledges its message; stopping the
    worker in between makes Celery give the message back to the queue.
    """
    import redis

    client = redis.Redis.from_url(f"{REDIS_SERVER}/{REACTOR_REDIS_DB}")
    deadline = time.monotonic() + limit
    try:
        while client.hlen("unacked") and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        client.close()


# ---------------------------------------------------------------------------- the worker


class Worker:
    """One ``celery worker`` subprocess in its own session, stopped with all its children."""

    def __init__(self, name: str, logs: Path) -> None:
        self.name = name
        self.log_path = logs / f"{name}.log"
        self.command = [
            sys.executable, "-m", "celery", "-A", "testproject", "worker",
            "-P", "prefork", "-c", str(WORKER_PROCESSES), "-Q", REACTOR_QUEUE,
            "-n", f"{name}-{os.getpid()}@%h",
            "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO",
        ]  # fmt: skip
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
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


@contextlib.contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    try:
        yield worker.start()
    finally:
        worker.stop()


# ---------------------------------------------------------------------------- resuming


def pause_runs(count: int) -> list[uuid.UUID]:
    """Start ``count`` runs; each pauses at ``approval`` in this process."""
    from django_reactor import Paused

    reactor = resume_once()
    ids: list[uuid.UUID] = []
    for _ in range(count):
        outcome = reactor.run({})
        if not isinstance(outcome, Paused) or outcome.execution_id is None:
            raise BenchmarkError(f"run() did not pause: {outcome!r}")
        ids.append(outcome.execution_id)
    return ids


@dataclass(frozen=True)
class Delivery:
    """One signed resume request, ready to send."""

    execution_id: uuid.UUID
    path: str
    body: bytes
    headers: dict[str, str]


def delivery(execution_id: uuid.UUID) -> Delivery:
    from django.conf import settings

    from django_reactor.api.signatures import sign

    body = json.dumps({"step": "approval", "payload": PAYLOAD}).encode()
    secret = settings.BENCH_WEBHOOK_SECRET
    return Delivery(
        execution_id,
        f"/reactor/executions/{execution_id}/resume/",
        body,
        sign(secret, f"msg_{uuid.uuid4().hex}", body),
    )


def post(client: Any, item: Delivery) -> Any:
    return client.post(item.path, item.body, content_type="application/json", headers=item.headers)


def check_accepted(response: Any, item: Delivery) -> None:
    if response.status_code != 202:
        body = response.content[:500].decode(errors="replace")
        raise BenchmarkError(
            f"resume of {item.execution_id} answered {response.status_code}, not 202: {body}"
        )


def wait_completed(execution_id: uuid.UUID, cursor: Any, deadline: float) -> float:
    """Poll one row every ~1 ms until it reads completed; return that moment."""
    while True:
        cursor.execute(
            "SELECT status, finished_at IS NOT NULL FROM django_reactor_execution WHERE id = %s",
            [execution_id],
        )
        status, finished = cursor.fetchone()
        now = time.perf_counter()
        if status == "completed":
            return now
        if finished:
            raise BenchmarkError(f"run {execution_id} ended {status}")
        if now > deadline:
            raise BenchmarkError(f"run {execution_id} did not complete within {WAIT_LIMIT:.0f} s")
        time.sleep(SAMPLE_POLL)


@dataclass
class Single:
    accepted: list[float]  # POST-to-202 seconds
    completed: list[float]  # POST-to-completed seconds
    cpu: list[float]  # CPU seconds this process spent answering each POST


def one_at_a_time(samples: int) -> Single:
    """N=1: resume one run at a time, timing each."""
    from django.db import connection
    from django.test import Client

    client = Client()
    result = Single([], [], [])
    items = [delivery(i) for i in pause_runs(samples)]
    with connection.cursor() as cursor:
        for item in items:
            c0 = time.process_time()
            t0 = time.perf_counter()
            response = post(client, item)
            t1 = time.perf_counter()
            c1 = time.process_time()
            check_accepted(response, item)
            done = wait_completed(item.execution_id, cursor, t0 + WAIT_LIMIT)
            result.accepted.append(t1 - t0)
            result.completed.append(done - t0)
            result.cpu.append(c1 - c0)
    return result


class Poller(threading.Thread):
    """Polls the burst's rows every ``BURST_POLL`` s; notes when each is first seen completed."""

    def __init__(self, ids: list[uuid.UUID]) -> None:
        super().__init__(daemon=True)
        self.waiting = set(ids)
        self.seen: dict[uuid.UUID, float] = {}
        self.error: str | None = None
        self.stop_at = time.perf_counter() + WAIT_LIMIT

    def run(self) -> None:
        from django.db import connection

        try:
            with connection.cursor() as cursor:
                while self.waiting:
                    cursor.execute(
                        "SELECT id, status FROM django_reactor_execution "
                        "WHERE id = ANY(%s) AND finished_at IS NOT NULL",
                        [list(self.waiting)],
                    )
                    now = time.perf_counter()
                    for execution_id, status in cursor.fetchall():
                        if status != "completed":
                            self.error = f"run {execution_id} ended {status}"
                            return
                        self.seen[execution_id] = now
                        self.waiting.discard(execution_id)
                    if now > self.stop_at:
                        self.error = f"{len(self.waiting)} run(s) not completed after {WAIT_LIMIT}s"
                        return
                    time.sleep(BURST_POLL)
        except Exception as exc:  # reported by the main thread
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()


@dataclass
class Burst:
    accepted: list[float]
    completed: list[float]
    posting: float  # seconds from the first POST until the last 202
    draining: float  # seconds from the first POST until the last run completed


def burst(count: int) -> Burst:
    """N=``count``: pause that many runs, then resume them back to back as one burst."""
    from django.test import Client

    client = Client()
    items = [delivery(i) for i in pause_runs(count)]
    poller = Poller([item.execution_id for item in items])
    started: dict[uuid.UUID, float] = {}
    accepted: list[float] = []
    poller.start()
    first = time.perf_counter()
    for item in items:
        t0 = time.perf_counter()
        response = post(client, item)
        t1 = time.perf_counter()
        check_accepted(response, item)
        started[item.execution_id] = t0
        accepted.append(t1 - t0)
    posted = time.perf_counter()
    poller.join(WAIT_LIMIT + 5)
    if poller.error or poller.is_alive():
        raise BenchmarkError(f"burst: {poller.error or 'the poller did not finish'}")
    completed = [poller.seen[i] - started[i] for i in started]
    return Burst(accepted, completed, posted - first, max(poller.seen.values()) - first)


def insert_floor(samples: int = 200) -> float:
    """Median ms of one autocommit INSERT into a scratch table: one round trip and one commit."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS bench_scratch "
            "(id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"
        )
        times: list[float] = []
        for _ in range(samples):
            t0 = time.perf_counter()
            cursor.execute("INSERT INTO bench_scratch DEFAULT VALUES")
            times.append(time.perf_counter() - t0)
        cursor.execute("TRUNCATE bench_scratch")
    return statistics.median(times) * 1000


def statements_per_request() -> int:
    """How many SQL statements one resume request sends through Django (counted, not timed)."""
    from django.db import connection
    from django.test import Client

    count = 0

    def counting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal count
        count += 1
        return execute(sql, params, many, context)

    item = delivery(pause_runs(1)[0])
    with connection.execute_wrapper(counting):
        check_accepted(post(Client(), item), item)
    with connection.cursor() as cursor:
        wait_completed(item.execution_id, cursor, time.perf_counter() + WAIT_LIMIT)
    return count


def profile_requests(runs: int) -> str:
    """cProfile over ``runs`` resume requests (the request path only), top entries."""
    import cProfile
    import io
    import pstats

    from django.db import connection
    from django.test import Client

    client = Client()
    items = [delivery(i) for i in pause_runs(runs)]
    profiler = cProfile.Profile()
    with connection.cursor() as cursor:
        for item in items:
            profiler.enable()
            response = post(client, item)
            profiler.disable()
            check_accepted(response, item)
            wait_completed(item.execution_id, cursor, time.perf_counter() + WAIT_LIMIT)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(40)
    stats.sort_stats("tottime").print_stats(20)
    return out.getvalue()


# ---------------------------------------------------------------------------- the run


@dataclass
class Figures:
    single: Single | None = None
    burst: Burst | None = None
    statements: int | None = None
    floor: tuple[float, float] = (0.0, 0.0)  # ms of an autocommit INSERT, before / after
    profile: str = ""
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before / after
    busy_before: float = 0.0  # share of all CPUs busy during the second before the run
    cpu: CpuSample | None = None  # CPU seconds used during the run
    revision: tuple[str, str] = ("?", "?")  # of the code, at start and at end


def measure(args: argparse.Namespace, figures: Figures, logs: Path) -> None:
    floor_before = insert_floor()
    worker = Worker("resume", logs)
    with running(worker):
        for _ in range(2):  # warm-up: both processes connect, import the reactor, prepare
            one_at_a_time(args.warmup // 2 or 1)
        figures.statements = statements_per_request()
        for name, phase in (
            ("N=1", lambda: one_at_a_time(args.samples)),
            (f"N={args.burst}", lambda: burst(args.burst)),
        ):
            try:
                result = phase()
            except Exception as exc:  # report the phase as failed; go on with the other
                figures.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                print(f"  {name} FAILED", flush=True)
                continue
            if isinstance(result, Burst):
                figures.burst = result
            else:
                figures.single = result
            print(f"  {name} done", flush=True)
        if args.profile:
            figures.profile = profile_requests(args.profile_runs)
        wait_acked()
    figures.floor = (floor_before, insert_floor())
    left = redis_messages()
    if left:
        figures.notes.append(f"message(s) left in Redis after the run: {left}")


def context_line(figures: Figures) -> str:
    import celery
    import django
    import kombu
    import redis
    import rest_framework
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
        f"Django {django.get_version()}, DRF {rest_framework.VERSION}, "
        f"Python {sys.version.split()[0]}"
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
                resource.getrusage(resource.RUSAGE_CHILDREN),  # the worker once reaped
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

    The worker imports the code when it starts: if it changes during the run, the benchmark
    process and the worker may run different code.
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
        "resume latency: signed webhook POST -> 202 (django.test.Client, in process) and POST "
        "-> run completed by one worker (-P prefork "
        f"-c {WORKER_PROCESSES}); interrupt(resume='background') then one no-op step"
    )
    print(context_line(figures))
    if figures.revision[0] != figures.revision[1]:
        print(f"WARNING: the code changed during the run (now {figures.revision[1]})")
    if dropped:
        print(f"(dropped stale messages left by an earlier run: {dropped})")
    if figures.statements is not None:
        print(f"SQL statements sent through Django per resume request: {figures.statements}")
    if figures.floor[0]:
        print(
            f"DB round-trip floor (autocommit INSERT): {figures.floor[0]:.3f} ms before, "
            f"{figures.floor[1]:.3f} ms after"
        )
    print()

    def line(label: str, seconds: list[float]) -> tuple[float, float] | None:
        if not seconds:
            print(f"  {label}: not measured")
            return None
        ms = [s * 1000 for s in seconds]
        median, p99 = statistics.median(ms), percentile(ms, 0.99)
        print(
            f"  {label}: median {median:7.2f} ms   p99 {p99:7.2f} ms   "
            f"(min {min(ms):.2f}, max {max(ms):.2f}; {len(ms)} runs)"
        )
        return median, p99

    verdicts: list[str] = []
    single = figures.single or Single([], [], [])
    series = [(f"N=1 ({args.samples} sequential runs)", single.accepted, single.completed)]
    if figures.burst is not None:
        series.append(
            (f"N={args.burst} (one burst)", figures.burst.accepted, figures.burst.completed)
        )
    else:
        series.append((f"N={args.burst} (one burst)", [], []))
    for title, accepted, completed in series:
        print(title)
        got_202 = line("POST -> 202      ", accepted)
        got_done = line("POST -> completed", completed)
        ok_202 = got_202 is not None and got_202[1] < TARGET_202_P99_MS
        ok_done = got_done is not None and got_done[0] < TARGET_COMPLETED_MEDIAN_MS
        verdicts.append(
            f"{title.split(' ')[0]}: POST->202 p99 < {TARGET_202_P99_MS:.0f} ms "
            f"{'PASS' if ok_202 else 'MISS'}; POST->completed median < "
            f"{TARGET_COMPLETED_MEDIAN_MS:.0f} ms {'PASS' if ok_done else 'MISS'}"
        )
    if single.cpu:
        cpu_ms = [c * 1000 for c in single.cpu]
        print(
            f"  N=1: CPU of this process per POST (Django, DRF, django_reactor, psycopg, kombu): "
            f"median {statistics.median(cpu_ms):.2f} ms"
        )
    if figures.burst is not None:
        b = figures.burst
        print(
            f"  burst: last 202 after {b.posting:.2f} s ({len(b.accepted) / b.posting:.0f} "
            f"requests/s), last run completed after {b.draining:.2f} s"
        )
    print()
    for verdict in verdicts:
        print(verdict)
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
            f"worker {cpu.ours:.1f}, PostgreSQL {cpu.postgres:.1f}, Redis {cpu.redis:.1f}, "
            f"other processes {others:.1f}"
        )
        if others > 0.05 * available or busy > 0.15:
            print(
                "WARNING: other work shared these CPUs during the run; the figures are skewed "
                "(run it again on a quiet machine)"
            )
    if figures.profile:
        print()
        print(f"cProfile of {args.profile_runs} resume requests (the request path only):")
        print(figures.profile)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200, help="N=1 resumes, one at a time (200)")
    parser.add_argument("--burst", type=int, default=100, help="resumes in the burst (100)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed resumes first (20)")
    parser.add_argument("--logs", type=Path, default=None, help="keep the worker's log here")
    parser.add_argument(
        "--profile", action="store_true", help="afterwards, cProfile some resume requests"
    )
    parser.add_argument("--profile-runs", type=int, default=100, help="requests profiled (100)")
    args = parser.parse_args(argv)
    if min(args.samples, args.burst, args.profile_runs) < 1 or args.warmup < 0:
        parser.error("--samples, --burst and --profile-runs must be positive")
    return args


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds through the finally blocks that stop the worker


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
    dropped = redis_messages(delete=True)
    import testproject  # noqa: F401  (the project's Celery app: django_reactor publishes with it)

    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="reactor-bench-resume-") as logs:
        try:
            measure(args, figures, Path(logs))
        except Exception as exc:
            figures.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            if args.logs is not None:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(logs).glob("*.log"):
                    (args.logs / log.name).write_bytes(log.read_bytes())
            elif figures.errors:  # keep the worker's log of a failed run
                kept = Path(tempfile.mkdtemp(prefix="reactor-bench-resume-logs-"))
                for log in Path(logs).glob("*.log"):
                    (kept / log.name).write_bytes(log.read_bytes())
                figures.errors.append(f"worker log kept in {kept}")
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
