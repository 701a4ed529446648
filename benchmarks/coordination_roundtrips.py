"""Coordination round trips per second on both backends, beside plain Redis and SQL anchors.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/coordination_roundtrips.py [--seconds 1.5] [--rounds 3]

What it measures
----------------
Operations per second, one after the other from this one process (latency-bound, as a worker
taking a lock is):

* ``lock``: ``acquire_lock`` then ``release_lock`` of one key (one pair = one operation);
* ``rate (allowed)``: ``check_rate`` against one window of 1,000,000 per second, always allowed;
* ``rate (saturated)``: ``check_rate`` against ``{"second": 50, "minute": 1000}``, which refuses
  almost every call once the budget is spent (the usual state of a busy limited key);

for the Redis backend (Redis database 15, keys under a prefix of this run, deleted afterwards)
and for the database backend (PostgreSQL database ``reactor_coord_bench``, created and migrated
if missing). The anchors are measured in the same run, interleaved with the operations: a plain
Redis ``PING`` on the same client; a plain ``SELECT 1`` on the same Django connection
(autocommit); and, because every database-backend operation commits a write (a WAL flush with
the default ``synchronous_commit = on``), one committed ``UPDATE`` of a one-row scratch table
(``coord_bench_anchor``). Each figure is the median over ``--rounds`` rounds of ``--seconds``
each. The ratio printed is the anchor's rate divided by the operation's: how many plain round
trips one operation costs.

Override the servers with ``BENCH_PG`` (default ``postgresql://postgres@127.0.0.1:5432``) and
``BENCH_REDIS`` (default ``redis://127.0.0.1:6379/15``). Django runs with ``DEBUG`` off.
The exit code is 0 whatever the figures: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, ensure_database

DATABASE = "reactor_coord_bench"
REDIS_URL = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/15")

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
os.environ.setdefault("DJANGO_DEBUG", "0")
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def rate(operation: Callable[[], Any], seconds: float) -> float:
    """Calls of ``operation`` per second, over about ``seconds``."""
    calls, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(20):
            operation()
        calls += 20
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - start)


def operations(backend: Any, tag: str) -> dict[str, Callable[[], Any]]:
    """The measured operations of one backend, on keys of this run."""
    from django_reactor.coordination import Window, parse_windows

    owner = f"bench-{uuid.uuid4().hex[:8]}"
    lock_key, allowed_key, saturated_key = (f"{tag}-{k}-{owner}" for k in ("lock", "ok", "sat"))
    allowed_windows = [Window(1_000_000, 1.0)]
    saturated_windows = parse_windows({"second": 50, "minute": 1000})

    def lock() -> None:
        if backend.acquire_lock(lock_key, owner, 30) is None:
            raise RuntimeError("the benchmark's own lock was taken")
        backend.release_lock(lock_key, owner)

    return {
        "lock acquire+release": lock,
        "rate check (allowed)": lambda: backend.check_rate(allowed_key, allowed_windows),
        "rate check (saturated)": lambda: backend.check_rate(saturated_key, saturated_windows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    args = parser.parse_args()

    ensure_database(DATABASE)
    setup_django()
    import redis
    from django.db import connection

    from django_reactor.coordination.backends.database import DatabaseBackend
    from django_reactor.coordination.backends.redis import RedisBackend

    prefix = f"reactor-coord-bench-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    cursor = connection.cursor()

    def select_one() -> None:
        cursor.execute("SELECT 1")
        cursor.fetchone()

    cursor.execute("CREATE TABLE IF NOT EXISTS coord_bench_anchor (id int PRIMARY KEY, n bigint)")
    cursor.execute("INSERT INTO coord_bench_anchor VALUES (1, 0) ON CONFLICT DO NOTHING")

    def committed_update() -> None:
        cursor.execute("UPDATE coord_bench_anchor SET n = n + 1 WHERE id = 1")

    anchors: dict[str, dict[str, Callable[[], Any]]] = {
        "redis": {"Redis PING": client.ping},
        "database": {
            "PostgreSQL SELECT 1": select_one,
            "PostgreSQL committed UPDATE": committed_update,
        },
    }
    suites: dict[str, dict[str, Callable[[], Any]]] = {
        "redis": operations(RedisBackend(client=client, prefix=prefix), "redis"),
        "database": operations(DatabaseBackend(), "db"),
    }
    results: dict[tuple[str, str], list[float]] = {}
    try:
        for name, ops in suites.items():
            for op in [*anchors[name].values(), *ops.values()]:
                for _ in range(50):  # warm up: scripts loaded, rows created, plans cached
                    op()
        for round_number in range(args.rounds):
            for name, ops in suites.items():
                for op_name, op in [*anchors[name].items(), *ops.items()]:
                    results.setdefault((name, op_name), []).append(rate(op, args.seconds))
            print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        cursor.close()

    print(
        f"coordination round trips, one process, median of {args.rounds} x {args.seconds:g} s "
        f"(PostgreSQL {PG_SERVER}/{DATABASE}, Redis {REDIS_URL})"
    )
    for name, ops in suites.items():
        anchor_rates = {a: statistics.median(results[(name, a)]) for a in anchors[name]}
        header = "".join(f" {'x ' + a:>30}" for a in anchor_rates)
        print(f"\n{name:<10} {'operation':<28} {'ops/s':>10}{header}")
        for anchor_name, anchor_rate in anchor_rates.items():
            print(f"{name:<10} {anchor_name:<28} {anchor_rate:>10,.0f}   (anchor)")
        for op_name in ops:
            op_rate = statistics.median(results[(name, op_name)])
            ratios = "".join(f" {a / op_rate:>30.2f}" for a in anchor_rates.values())
            print(f"{name:<10} {op_name:<28} {op_rate:>10,.0f}{ratios}")
    print(
        "\n'x <anchor>': how many anchor round trips one operation costs (anchor rate / its rate)."
    )


if __name__ == "__main__":
    main()
