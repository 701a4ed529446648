"""A schedule's fire against a direct background ``run()``, in the same process and run.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/schedule_fires.py [--schedules 1000] [--rounds 3]

What it measures
----------------
``Chain10`` (``benchmarks/bg_reactors.py``: ten no-op steps, all on a worker) is started two
ways, in database ``reactor_bench_fire`` (emptied first), its tasks published through the
Celery bridge to Redis db 14 (queue ``django_reactor_bench_fire``, emptied after; no worker
takes them, so only the start is measured):

- *direct*: ``Chain10.run({})`` called ``--schedules`` times (each writes the pending run and
  its dispatch, commits, publishes);
- *fire*: ``--schedules`` schedules of ``Chain10`` (``every="1h"``, ``overlap="allow"``) made
  due at one instant, then ``services.schedules.fire_due()`` called until every tick has
  fired (what the sweeper does at 9:00 when many schedules tick together).

Each is timed per run (``--rounds`` alternated rounds, the median shown) and, in one more
round, its SQL statements counted (a Django ``execute_wrapper`` and the store's own
statements; savepoints included, BEGIN and COMMIT not).
Target (issue 28): a fire costs at most 1.5x a direct start. The exit code is 0 whatever the
figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, ensure_database

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
DATABASE = "reactor_bench_fire"
BROKER_DB = 14
QUEUE = "django_reactor_bench_fire"
TARGET = 1.5

os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bg_settings"
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"
os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{BROKER_DB}"
os.environ["REACTOR_BENCH_QUEUE"] = QUEUE


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    empty()


def empty() -> None:
    import redis
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_reactor_schedulefire, django_reactor_schedule, "
            "django_reactor_execution, django_reactor_steprecord, "
            "django_reactor_executionevent, django_reactor_dispatch CASCADE"
        )
    client = redis.Redis.from_url(f"{REDIS_SERVER}/{BROKER_DB}")
    try:
        client.delete(QUEUE)
    finally:
        client.close()


def direct(count: int, counting: bool = False) -> tuple[float, int]:
    """Seconds (and statements) for ``count`` direct background starts."""
    from benchmarks.bg_reactors import Chain10

    with Statements(counting) as sent:
        started = time.perf_counter()
        for _ in range(count):
            Chain10.run({})
        seconds = time.perf_counter() - started
    return seconds, sent.count


def fire(count: int, counting: bool = False) -> tuple[float, int]:
    """Seconds (and statements) for firing ``count`` schedules due at one instant (created
    beforehand, not measured)."""
    from benchmarks.bg_reactors import Chain10
    from django_reactor import services
    from django_reactor.testing import make_schedules_due

    for i in range(count):
        services.schedules.create(Chain10, every="1h", overlap="allow", name=f"fire-{i}")
    make_schedules_due()
    fired = 0
    with Statements(counting) as sent:
        started = time.perf_counter()
        while fired < count:
            report = services.schedules.fire_due()
            if not report.started:
                raise RuntimeError(f"only {fired} of {count} ticks fired")
            fired += report.started
        seconds = time.perf_counter() - started
    return seconds, sent.count


class Statements:
    """Counts the SQL statements sent while it is open, when ``counting`` (savepoints
    included): those through Django's cursors, and the store's own (``store.sql._execute``,
    which Django's wrappers do not see)."""

    def __init__(self, counting: bool) -> None:
        self.counting = counting
        self.count = 0
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Statements:
        if not self.counting:
            return self
        from django.db import connection

        from django_reactor.store import sql

        def wrapper(execute: Any, statement: str, params: Any, many: bool, context: Any) -> Any:
            self.count += 1
            return execute(statement, params, many, context)

        own = sql._execute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return own(*args, **kwargs)

        sql._execute = counted  # type: ignore[assignment]
        self._stack.callback(setattr, sql, "_execute", own)
        self._stack.enter_context(connection.execute_wrapper(wrapper))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1000, help="starts per round (1,000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (3)")
    args = parser.parse_args(argv)
    ensure_database(DATABASE)
    setup_django()
    n = args.schedules
    import django_reactor

    print(f"django_reactor from {Path(django_reactor.__file__).parent}")
    direct(50)  # warm up: imports, connections, the reactor's registration
    empty()
    timings: dict[str, list[float]] = {"direct": [], "fire": []}
    for _ in range(args.rounds):
        for name, measure in (("direct", direct), ("fire", fire)):
            timings[name].append(measure(n)[0] / n * 1000)
            empty()
    counted = {}
    for name, measure in (("direct", direct), ("fire", fire)):
        counted[name] = measure(n, True)[1] / n
        empty()
    d, f = statistics.median(timings["direct"]), statistics.median(timings["fire"])
    print(f"{n:,} starts of Chain10 (10 no-op steps, all on a worker), median of {args.rounds}")
    print(f"direct background run(): {d:.3f} ms a run, {counted['direct']:.2f} statements")
    print(
        f"a schedule's fire:       {f:.3f} ms a run, {counted['fire']:.2f} statements "
        f"({n:,} schedules due at one instant)"
    )
    verdict = "PASS" if f / d <= TARGET else "MISS"
    print(f"fire / direct: {f / d:.2f}x   target <= {TARGET}x   {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
