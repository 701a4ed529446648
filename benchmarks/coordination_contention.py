"""100 background runs contending for one lock key and a 50/s rate limit, on real workers.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/coordination_contention.py [--runs 100] [--delay SECONDS]

It takes about a minute. The exit code is 0 whatever the figures: a benchmark, not a test.

What it measures
----------------
``Contended`` (below) declares ``Meta.coordination = [RateLimit("bench-rate-{ns}",
limits={"second": 50}), Lock("bench-lock-{ns}")]`` and ``Meta.background = "all"``; its one
step records, in Redis database 2 with the Redis server's clock, when its body started and
ended and how many bodies were inside at once (INCR/DECR of a counter, high-water mark kept in
the same Lua call). ``--runs`` runs are submitted at once to one Celery worker (``-P prefork
-c 2``: two processes, like ``background_throughput.py``), on the Redis backend and then on the
database backend (each with a fresh worker, a warm-up of a few runs on other keys first). With
the default ``REACTOR["CONTENTION_DELAY"]`` (1 s), a run that finds the lock taken is
rescheduled ("snoozed") 1 s later; a rate-limited one after the limiter's ``retry_after``.

Printed per backend:

* **violations** (both must be 0): lock, pairs of bodies that overlapped (and the most bodies
  inside at once); rate, charges of the rate limiter (its own log, copied every 50 ms while the
  runs go: Redis sorted set, or the ``RateLimitEvent`` table, on the backend's clock) beyond 50
  in any 1 s window. Body starts per 1 s window are shown too: a body starts a few ms after
  its run's charge, so they may exceed the limit by that jitter;
* **achieved start rate**: charges per second from the first to the last charge;
* **lock wait** p50 / p95: from the run's creation (``Execution.created_at``) to its lock's
  ``acquire`` trace event;
* **total**: from the first submit until every run reads ``completed``, and runs/s;
* **snoozes per run** (``park`` events with reason contention or unavailable): mean, p95, max,
  and how many were for the lock and how many for the rate limit.

Both the benchmark and its worker use ``tests.workers.settings`` (the settings the worker tests
start their workers with: database, broker and ``REACTOR`` from the environment), with
``DEBUG`` off. Database ``reactor_bench_coord`` (created, migrated, emptied at start); broker
on Redis database 4, queue ``django_reactor_bench_coord``; the Redis backend on database 3
with a key prefix of this run. Override the servers with ``BENCH_PG`` and ``BENCH_REDIS``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
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

from benchmarks.common import PG_SERVER, ensure_database, percentile
from django_reactor import Lock, RateLimit, Reactor, arg, step, step_context

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
DATABASE = "reactor_bench_coord"
BROKER_DB = 4
COORDINATION_DB = 3
RECORD_DB = 2
QUEUE = "django_reactor_bench_coord"
WORKER_PROCESSES = 2
RATE = 50  # per second, as Contended declares
WAIT_LIMIT = 180.0  # seconds the runs of one backend may take before the phase is abandoned
BACKENDS = {
    "redis": "django_reactor.coordination.backends.redis.RedisBackend",
    "database": "django_reactor.coordination.backends.database.DatabaseBackend",
}

# ---------------------------------------------------------------------------- the reactor

# INCR the holders counter, keep its high-water mark, return the count and server time (us).
_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
local t = redis.call('TIME')
return {n, t[1] * 1000000 + t[2]}
"""
# DECR it; append "execution start end holders" to the entries.
_EXIT = """
local function fmt(n) return string.format('%.0f', n) end
redis.call('DECR', KEYS[1])
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. fmt(t[1] * 1000000 + t[2]) ..
  ' ' .. ARGV[3])
return 1
"""
_clients: dict[str, Any] = {}


def _client(url: str) -> Any:
    client = _clients.get(url)
    if client is None:
        import redis

        client = _clients[url] = redis.Redis.from_url(url)
    return client


def record(ns: str, redis_url: str) -> int:
    """The step: note the body's start, end and the bodies inside at once."""
    client = _client(redis_url)
    holders, start = client.eval(_ENTER, 2, f"{ns}:holders", f"{ns}:max")
    execution = str(step_context().execution_id)
    client.eval(_EXIT, 2, f"{ns}:holders", f"{ns}:entries", execution, int(start), int(holders))
    return int(holders)


class Contended(Reactor):
    """One recording step under a 50/s rate limit and one lock, both keyed on ``ns``."""

    work = step(record, ns=arg.input("ns"), redis_url=arg.input("redis_url"))

    class Meta:
        background = "all"
        coordination = [
            RateLimit("bench-rate-{ns}", limits={"second": 50}),
            Lock("bench-lock-{ns}", ttl=30),
        ]


# ---------------------------------------------------------------------------- workers


class BenchmarkError(RuntimeError):
    """A phase could not be measured."""


def reactor_settings(backend: str, prefix: str, delay: float | None) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "CELERY_QUEUE": QUEUE,
        "COORDINATION_BACKEND": BACKENDS[backend],
        "COORDINATION_REDIS": f"{REDIS_SERVER}/{COORDINATION_DB}",
        "COORDINATION_KEY_PREFIX": prefix,
    }
    if delay is not None:
        settings["CONTENTION_DELAY"] = delay
    return settings


def start_worker(settings: dict[str, Any], logs: Path) -> Any:
    """One ``celery -A testproject worker -P prefork -c 2`` on the benchmark's queue."""
    from tests.workers.harness import Worker

    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "REACTOR_SETTINGS_JSON": json.dumps(settings),
    }
    worker = Worker(env=env, queue=QUEUE, log_dir=logs, concurrency=WORKER_PROCESSES)
    try:
        return worker.start()
    except BaseException:
        worker.stop()
        raise


def wait_acked(limit: float = 3.0) -> None:
    """Let the worker acknowledge the messages of runs that completed (bounded)."""
    client = _client(f"{REDIS_SERVER}/{BROKER_DB}")
    deadline = time.monotonic() + limit
    while client.hlen("unacked") and time.monotonic() < deadline:
        time.sleep(0.01)


# ---------------------------------------------------------------------------- measuring


class ChargeLog:
    """Copies every charge of one rate limit from the backend's log while the runs go (each
    charge stays in the log for the window, 1 s; copied every 50 ms)."""

    def __init__(self, backend: str, prefix: str, key: str) -> None:
        self.backend = backend
        self.prefix = prefix
        self.key = key
        self.charges: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.error: BaseException | None = None

    def _copy(self) -> None:
        from django.db import connection

        try:
            if self.backend == "redis":
                from django_reactor.coordination.backends.redis import RedisBackend

                redis_backend = RedisBackend(
                    f"{REDIS_SERVER}/{COORDINATION_DB}", prefix=self.prefix
                )
                zset = redis_backend._key("rate", self.key)
                client = redis_backend.client
                while not self.stop.is_set():
                    for member, score in client.zrange(zset, 0, -1, withscores=True):
                        self.charges[member.decode()] = score / 1_000_000
                    self.stop.wait(0.05)
            else:
                from django_reactor.coordination.models import RateLimitEvent

                events = RateLimitEvent.objects.filter(key=self.key)
                while not self.stop.is_set():
                    for pk, at in events.values_list("id", "at"):
                        self.charges[str(pk)] = at.timestamp()
                    self.stop.wait(0.05)
        except BaseException as exc:  # reported by the phase
            self.error = exc
        finally:
            connection.close()

    def __enter__(self) -> ChargeLog:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        time.sleep(0.1)  # one more copy after the last run completed
        self.stop.set()
        self.thread.join(timeout=5)


def most_in_a_window(times: list[float], window: float) -> int:
    """The most of ``times`` in any half-open window ``(t - window, t]``."""
    ordered = sorted(times)
    most, first = 0, 0
    for last, t in enumerate(ordered):
        while ordered[first] <= t - window:
            first += 1
        most = max(most, last - first + 1)
    return most


def over_limit(times: list[float], window: float, limit: int) -> int:
    """How many of ``times`` found more than ``limit`` in the window ending with them."""
    ordered = sorted(times)
    return sum(1 for i in range(limit, len(ordered)) if ordered[i] - ordered[i - limit] < window)


def submit(reactor: type[Reactor], inputs: dict[str, Any], count: int) -> list[uuid.UUID]:
    from django_reactor import Dispatched

    ids = []
    for _ in range(count):
        outcome = reactor.run(inputs)
        if not isinstance(outcome, Dispatched):
            raise BenchmarkError(f"run() did not dispatch the run: {outcome!r}")
        ids.append(outcome.execution_id)
    return ids


def wait_completed(ids: list[uuid.UUID], limit: float = WAIT_LIMIT) -> float:
    from django.db import connection

    deadline = time.perf_counter() + limit
    with connection.cursor() as cursor:
        while True:
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
            time.sleep(0.02)


@dataclass
class Figures:
    backend: str
    runs: int = 0
    total_s: float = 0.0
    lock_overlaps: int = 0
    max_holders: int = 0
    charges: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    lock_waits: list[float] = field(default_factory=list)
    snoozes: list[int] = field(default_factory=list)
    lock_snoozes: int = 0
    rate_snoozes: int = 0
    other_snoozes: int = 0
    error: str = ""


def collect(figures: Figures, ids: list[uuid.UUID], ns: str, lock_key: str) -> None:
    from django_reactor.models import Execution, ExecutionEvent

    client = _client(f"{REDIS_SERVER}/{RECORD_DB}")
    entries = []
    for line in client.lrange(f"{ns}:entries", 0, -1):
        execution, start, end, holders = line.decode().split()
        entries.append((int(start), int(end), int(holders), execution))
    entries.sort()
    if len(entries) != len(ids):
        figures.error = f"{len(entries)} bodies recorded for {len(ids)} runs"
    figures.lock_overlaps = sum(1 for a, b in itertools.pairwise(entries) if b[0] < a[1])
    figures.max_holders = int(client.get(f"{ns}:max") or 0)
    figures.starts = [start / 1_000_000 for start, *_ in entries]

    created = dict(Execution.objects.filter(id__in=ids).values_list("id", "created_at"))
    acquired: dict[uuid.UUID, Any] = {}
    snoozes = dict.fromkeys(ids, 0)
    for execution_id, kind, at, data in ExecutionEvent.objects.filter(
        execution_id__in=ids, kind__in=["acquire", "park"]
    ).values_list("execution_id", "kind", "at", "data"):
        if kind == "acquire" and data.get("lock") == lock_key:
            acquired[execution_id] = at
        elif kind == "park" and data.get("reason") in ("contention", "unavailable"):
            snoozes[execution_id] += 1
            waiting = data.get("waiting_for", "")
            if waiting.startswith("rate limit"):
                figures.rate_snoozes += 1
            elif waiting.startswith("lock"):
                figures.lock_snoozes += 1
            else:
                figures.other_snoozes += 1
    figures.lock_waits = [(acquired[i] - created[i]).total_seconds() for i in ids if i in acquired]
    if len(acquired) != len(ids):
        figures.error += f"; {len(ids) - len(acquired)} run(s) without a lock acquire event"
    figures.snoozes = list(snoozes.values())


def phase(args: argparse.Namespace, backend: str, logs: Path) -> Figures:
    from django.conf import settings
    from django.test import override_settings

    figures = Figures(backend)
    prefix = f"reactor-bench-coord-{uuid.uuid4().hex[:8]}"
    reactor_config = reactor_settings(backend, prefix, args.delay)
    from benchmarks.coordination_contention import Contended  # its importable name

    record_url = f"{REDIS_SERVER}/{RECORD_DB}"
    ns = f"bench-{backend}-{uuid.uuid4().hex[:8]}"
    worker = None
    with override_settings(REACTOR={**settings.REACTOR, **reactor_config}):
        try:
            worker = start_worker(reactor_config, logs)
            warmup = {"ns": f"{ns}-warmup", "redis_url": record_url}
            wait_completed(submit(Contended, warmup, args.warmup))
            inputs = {"ns": ns, "redis_url": record_url}
            with ChargeLog(backend, prefix, f"rate:bench-rate-{ns}") as log:
                started = time.perf_counter()
                ids = submit(Contended, inputs, args.runs)
                figures.total_s = wait_completed(ids) - started
            if log.error is not None:
                raise BenchmarkError(f"copying the rate log failed: {log.error!r}")
            figures.runs = len(ids)
            figures.charges = sorted(log.charges.values())
            collect(figures, ids, ns, f"bench-lock-{ns}")
        except Exception as exc:
            figures.error = f"{type(exc).__name__}: {exc}"
        finally:
            if worker is not None:
                with contextlib.suppress(Exception):
                    wait_acked()
                worker.stop()
            clean_keys(prefix, ns)
    return figures


def clean_keys(prefix: str, ns: str) -> None:
    import redis

    for db, pattern in ((COORDINATION_DB, f"{prefix}:*"), (RECORD_DB, f"{ns}*")):
        client = redis.Redis.from_url(f"{REDIS_SERVER}/{db}")
        try:
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


# ---------------------------------------------------------------------------- report


def report(args: argparse.Namespace, results: list[Figures]) -> None:
    import celery
    import django
    import redis

    delay = "default 1.0" if args.delay is None else f"{args.delay}"
    print(
        f"coordination contention: {args.runs} background runs, one Lock key and a "
        f"{RATE}/s RateLimit; one worker, -P prefork -c {WORKER_PROCESSES}; "
        f"CONTENTION_DELAY {delay} s"
    )
    print(
        f"{os.cpu_count()} CPUs, Redis {_redis_version()}, Celery {celery.__version__}, "
        f"Django {django.get_version()}, redis-py {redis.__version__}, "
        f"Python {sys.version.split()[0]}"
    )
    header = (
        f"{'backend':<9} {'lock viol.':>10} {'rate viol.':>10} {'max/1s':>7} "
        f"{'starts/1s':>9} {'start rate':>10} {'wait p50':>8} {'wait p95':>8} "
        f"{'total s':>7} {'runs/s':>6} {'snoozes/run':>17}"
    )
    print()
    print(header)
    for f in results:
        if f.error and not f.runs:
            print(f"{f.backend:<9} ERROR {f.error}")
            continue
        rate_violations = over_limit(f.charges, 1.0, RATE)
        span = (f.charges[-1] - f.charges[0]) if len(f.charges) > 1 else 0.0
        start_rate = (len(f.charges) - 1) / span if span else float("nan")
        snoozes = (
            f"{statistics.mean(f.snoozes):.1f} (p95 {percentile(f.snoozes, 0.95):.0f}, "
            f"max {max(f.snoozes)})"
        )
        print(
            f"{f.backend:<9} {f.lock_overlaps:>10} {rate_violations:>10} "
            f"{most_in_a_window(f.charges, 1.0):>7} {most_in_a_window(f.starts, 1.0):>9} "
            f"{start_rate:>8.1f}/s {percentile(f.lock_waits, 0.5):>7.2f}s "
            f"{percentile(f.lock_waits, 0.95):>7.2f}s {f.total_s:>7.2f} "
            f"{f.runs / f.total_s:>6.1f} {snoozes:>17}"
        )
    print()
    for f in results:
        if not f.runs:
            continue
        print(
            f"{f.backend}: {len(f.charges)} charges for {f.runs} runs; most bodies inside the "
            f"lock at once: {f.max_holders}; snoozes for the lock {f.lock_snoozes}, for the rate "
            f"limit {f.rate_snoozes}, other {f.other_snoozes}"
        )
        if f.error:
            print(f"{f.backend}: ERROR {f.error}")
    print(
        "lock viol.: overlapping bodies; rate viol.: charges beyond the limit in a 1 s window; "
        "max/1s: most charges in any 1 s (limiter's clock); starts/1s: most body starts in "
        "any 1 s (Redis clock); start rate: charges/s, first to last; wait: created -> lock "
        "acquired"
    )


def _redis_version() -> str:
    import redis

    client = redis.Redis.from_url(f"{REDIS_SERVER}/{RECORD_DB}")
    try:
        return str(client.info("server").get("redis_version", "?"))
    finally:
        client.close()


def setup_django() -> None:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per backend (100)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed runs first (4)")
    parser.add_argument(
        "--delay", type=float, default=None, help="REACTOR['CONTENTION_DELAY'] (default 1 s)"
    )
    parser.add_argument(
        "--backends", default="redis,database", help="comma-separated: redis, database"
    )
    parser.add_argument("--logs", type=Path, default=None, help="keep the worker logs here")
    args = parser.parse_args(argv)

    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.workers.settings"
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"
    os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{BROKER_DB}"
    os.environ["REACTOR_SETTINGS_JSON"] = json.dumps({"CELERY_QUEUE": QUEUE})
    ensure_database(DATABASE)
    setup_django()
    import redis

    broker = redis.Redis.from_url(f"{REDIS_SERVER}/{BROKER_DB}")
    broker.delete(QUEUE, "unacked", "unacked_index")  # stale messages of an aborted run
    broker.close()
    import testproject  # noqa: F401  (the project's Celery app: django_reactor publishes with it)

    results = []
    with tempfile.TemporaryDirectory(prefix="reactor-bench-coord-") as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        for backend in args.backends.split(","):
            print(f"  {backend}...", flush=True)
            results.append(phase(args, backend.strip(), logs))
        if any(f.error for f in results) and args.logs is None:
            kept = Path(tempfile.mkdtemp(prefix="reactor-bench-coord-logs-"))
            for log in Path(tmp).glob("*.log"):
                (kept / log.name).write_bytes(log.read_bytes())
            print(f"worker logs kept in {kept}")
    report(args, results)
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
