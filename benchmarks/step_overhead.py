"""Durable per-step overhead of an inline django_reactor run, beside the DBOS anchor.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth)::

    .venv/bin/python benchmarks/step_overhead.py [--runs N] [--steps 50] [--rounds R]

What it measures
----------------
Per-step overhead = (T(steps) - T(1)) / (steps - 1), where T(k) is the median wall time of one
run of a chain of ``k`` no-op steps, each step taking the previous step's result:

* django_reactor: ``Chain.run({})`` inline in this process (autocommit, one checkpoint per step),
  in the dedicated database ``reactor_bench``;
* DBOS (the anchor, ``dbos`` package): a ``@DBOS.workflow()`` calling a no-op ``@DBOS.step()``
  ``k`` times, system database ``dbos_bench`` on the same PostgreSQL server.

Subtracting T(1) removes the fixed cost of a run (creating and finishing the execution or
workflow), leaving what each extra durable step costs. Both systems are warmed up, then measured
in interleaved batches (django_reactor and DBOS alternate, in alternating order, for ``--rounds``
rounds), so machine noise hits both alike; medians are taken over all timed runs of each
configuration. The ratio django_reactor/DBOS is compared with the target (<= 0.14, issue 28).

As context, the same run measures the database round-trip floor: the median time of one
autocommit ``INSERT`` into a scratch table through Django's connection.

After the timed rounds, an untimed ``pg_stat`` pass (``benchmarks/pgstats.py``) measures what a
step costs the database, per system: ``--stat-runs`` runs of 1 step and as many of ``steps``
steps, each batch in its own window (settled and snapshotted before and after), and per step =
(window(steps) - window(1)) / (stat-runs * (steps - 1)), after taking off what the system does
when idle (DBOS's background threads poll its database; measured in an idle window of the same
kind and scaled to each window's length). Columns: statements (counted at the psycopg driver in
this process, so django_reactor's checkpoint statement, which bypasses Django's cursor, counts;
``pg_stat_statements`` instead when the server loads it), commits (``pg_stat_database``), WAL
commit records, WAL records and bytes (``pg_walinspect``: this database's records only, else
``pg_stat_wal``, server-wide), and the HOT share of the updates of the run table
(``pg_stat_user_tables``). Target: <= 10 WAL records per django_reactor step.

Databases ``reactor_bench`` and ``dbos_bench`` are created if missing; ``reactor_bench`` is
migrated. Override the server with ``BENCH_PG`` (default ``postgresql://postgres@127.0.0.1:5432``).
Django runs with ``DEBUG`` off (``DJANGO_DEBUG=0``) unless ``DJANGO_DEBUG`` is set, as in
production: with DEBUG on, Django records every query in memory.

The exit code is 0 whatever the figures: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, ensure_database
from benchmarks.pgstats import COLUMNS, Delta, Probe, StatementCounter, legend, row

REACTOR_DB = "reactor_bench"
DBOS_DB = "dbos_bench"
TARGET_RATIO = 0.14  # issue 28 (issue 15: 0.15; before: 0.25)
TARGET_WAL_PER_STEP = 10.0  # WAL records per django_reactor step (issue 15)
TARGET_ATOMIC_RATIO = 1.2  # an atomic step against a plain durable step (issue 16)
RUN_TABLES = {
    "django_reactor": "django_reactor_execution",
    "atomic": "django_reactor_execution",
    "plain + INSERT": "django_reactor_execution",
    "atomic + INSERT": "django_reactor_execution",
    "DBOS": "dbos.workflow_status",
}

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
os.environ.setdefault("DJANGO_DEBUG", "0")
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{REACTOR_DB}"


# ---------------------------------------------------------------------------- setup


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def noop(prev: Any = None) -> Any:
    return prev


def insert_row(prev: Any = None) -> Any:
    """A step's own database work: one INSERT into a scratch table."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO bench_scratch DEFAULT VALUES")
    return prev


def reactor_chain(n: int, *, atomic: bool = False, write: bool = False) -> Callable[[], None]:
    """A reactor of ``n`` chained steps (no-ops, or one INSERT each with ``write``; atomic
    steps with ``atomic``); returns a callable that runs it once."""
    from django_reactor import Reactor, arg, step

    body = insert_row if write else noop
    attrs: dict[str, Any] = {"s0": step(body, atomic=atomic)}
    for i in range(1, n):
        attrs[f"s{i}"] = step(body, prev=arg.result(f"s{i - 1}"), atomic=atomic)
    label = f"{'Atomic' if atomic else ''}{'Write' if write else ''}"
    chain = cast(
        "type[Reactor]",
        type(f"BenchChain{label}{n}", (Reactor,), {"__module__": __name__, **attrs}),
    )
    assert len(chain.definition.steps) == n

    def run_once() -> None:
        outcome = chain.run({})
        if not outcome.ok:
            raise RuntimeError(f"django_reactor chain of {n} steps did not complete: {outcome!r}")

    return run_once


def setup_dbos() -> tuple[Callable[[int], Callable[[], None]], Callable[[], None]]:
    """Launch DBOS; return (factory of one-run callables per step count, shutdown)."""
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "step_overhead",
        "system_database_url": f"{PG_SERVER}/{DBOS_DB}",
        "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    def add(x: int) -> int:
        return x + 1

    @DBOS.workflow()
    def chain(steps: int, x: int) -> int:
        for _ in range(steps):
            x = add(x)
        return x

    DBOS.launch()
    for name in ("dbos", "sqlalchemy"):
        logging.getLogger(name).setLevel(logging.WARNING)

    def runner(n: int) -> Callable[[], None]:
        def run_once() -> None:
            if chain(n, 0) != n:
                raise RuntimeError(f"DBOS workflow of {n} steps returned a wrong result")

        return run_once

    return runner, DBOS.destroy


def insert_floor(samples: int) -> float:
    """Median ms of one autocommit INSERT into a scratch table through Django's connection."""
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


# ---------------------------------------------------------------------------- measurement


@dataclass
class Series:
    """Per-run wall times (seconds) of one system at one chain length."""

    run_once: Callable[[], None]
    times: list[float] = field(default_factory=list)

    def batch(self, runs: int) -> None:
        gc.collect()
        run_once = self.run_once
        for _ in range(runs):
            t0 = time.perf_counter()
            run_once()
            self.times.append(time.perf_counter() - t0)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times) * 1000


@dataclass
class System:
    name: str
    one: Series
    many: Series
    close: Callable[[], None] = lambda: None  # close this process's connections (they flush)
    background: bool = False  # polls its database from background threads when idle

    def batch(self, runs: int) -> None:
        self.one.batch(runs)
        self.many.batch(runs)

    def per_step_ms(self, steps: int) -> float:
        return (self.many.median_ms - self.one.median_ms) / (steps - 1)


@dataclass
class StepStats:
    """pg_stat figures per step of one system (see the module docstring)."""

    per_step: Delta
    idle_rate: Delta | None  # per second, taken off every window (systems with background work)
    other_xacts: float  # transactions in other databases during the windows


def stat_pass(system: System, probe: Probe, steps: int, runs: int, idle: float) -> StepStats:
    """Windows of ``runs`` runs of 1 and of ``steps`` steps (and an idle one for a system with
    background work); per step figures."""
    windows: list[Delta] = []

    def window(body: Callable[[], None]) -> Delta:
        system.close()
        before = probe.snapshot()
        body()
        system.close()
        windows.append(probe.diff(before, probe.snapshot()))
        return windows[-1]

    def batch(series: Series) -> Callable[[], None]:
        def body() -> None:
            for _ in range(runs):
                series.run_once()

        return body

    rate: Delta | None = None
    if system.background:
        idle_delta = window(lambda: time.sleep(idle))
        rate = idle_delta.per(idle_delta.seconds)
    one = window(batch(system.one))
    many = window(batch(system.many))
    if rate is not None:
        one = one.minus(rate.scaled(one.seconds))
        many = many.minus(rate.scaled(many.seconds))
    others = sum(w.other_xacts for w in windows)
    return StepStats(many.minus(one).per(runs * (steps - 1)), rate, others)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs",
        type=int,
        default=100,
        help="timed runs per system and chain length, over all rounds (100)",
    )
    parser.add_argument("--steps", type=int, default=50, help="length of the long chain (50)")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds the runs are split into (5)"
    )
    parser.add_argument(
        "--warmup", type=int, default=10, help="untimed runs per system and chain length first (10)"
    )
    parser.add_argument(
        "--stat-runs",
        type=int,
        default=20,
        help="runs per chain length in the untimed pg_stat pass (20; 0 skips it)",
    )
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    if args.runs < 1 or args.rounds < 1:
        parser.error("--runs and --rounds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steps: int = args.steps
    per_batch = max(1, -(-args.runs // args.rounds))  # ceil

    ensure_database(REACTOR_DB)
    ensure_database(DBOS_DB)
    setup_django()
    dbos_runner, dbos_shutdown = setup_dbos()

    from django.db import connection as django_connection

    insert_floor(1)  # creates the scratch table the writing steps insert into
    reactor = System(
        "django_reactor",
        Series(reactor_chain(1)),
        Series(reactor_chain(steps)),
        close=django_connection.close,
    )
    atomic = System(
        "atomic",
        Series(reactor_chain(1, atomic=True)),
        Series(reactor_chain(steps, atomic=True)),
        close=django_connection.close,
    )
    writers = [
        System(
            name,
            Series(reactor_chain(1, atomic=is_atomic, write=True)),
            Series(reactor_chain(steps, atomic=is_atomic, write=True)),
            close=django_connection.close,
        )
        for name, is_atomic in (("plain + INSERT", False), ("atomic + INSERT", True))
    ]
    # DBOS keeps its pooled connections (and polls its database from background threads):
    # the probe waits for them to flush, and takes its idle activity off.
    dbos = System("DBOS", Series(dbos_runner(1)), Series(dbos_runner(steps)), background=True)
    systems = [reactor, atomic, *writers, dbos]
    stats: dict[str, StepStats] = {}
    probes: list[Probe] = []

    started = time.perf_counter()
    try:
        for system in systems:  # warm-up: imports, connections, caches, JIT-free steady state
            for series in (system.one, system.many):
                for _ in range(args.warmup):
                    series.run_once()
        floor_before = insert_floor(200)
        for round_no in range(args.rounds):
            order = systems if round_no % 2 == 0 else systems[::-1]
            for system in order:
                system.batch(per_batch)
        floor_after = insert_floor(200)
        if args.stat_runs > 0:
            counter = StatementCounter().install()
            try:
                for system, database in (
                    (reactor, REACTOR_DB),
                    (atomic, REACTOR_DB),
                    *((w, REACTOR_DB) for w in writers),
                    (dbos, DBOS_DB),
                ):
                    probe = Probe(PG_SERVER, database, statements=counter)
                    probes.append(probe)
                    system.close()
                    probe.calibrate()
                    stats[system.name] = stat_pass(system, probe, steps, args.stat_runs, 3.0)
            finally:
                counter.uninstall()
                for probe in probes:
                    probe.close()
    finally:
        dbos_shutdown()
    elapsed = time.perf_counter() - started

    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server_version = cursor.fetchone()[0]

    ours, anchor = reactor.per_step_ms(steps), dbos.per_step_ms(steps)
    ratio = ours / anchor if anchor > 0 else float("inf")
    verdict = "PASS" if ratio <= TARGET_RATIO else "MISS"
    runs_each = per_batch * args.rounds

    print(
        f"step overhead: no-op chains of 1 and {steps} steps, {runs_each} timed runs each "
        f"({args.rounds} interleaved rounds of {per_batch}), medians"
    )
    server = PG_SERVER.split("@")[-1]
    print(
        f"PostgreSQL {server_version} at {server}, Django {django.get_version()}, "
        f"dbos {_dist_version('dbos')}, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    print(
        f"DB round-trip floor (autocommit INSERT): {floor_before:.3f} ms before, "
        f"{floor_after:.3f} ms after"
    )
    print()
    print(f"{'':16}{'T(1) ms':>10}{f'T({steps}) ms':>12}{'per step ms':>13}")
    for system in systems:
        print(
            f"{system.name:16}{system.one.median_ms:>10.3f}{system.many.median_ms:>12.3f}"
            f"{system.per_step_ms(steps):>13.4f}"
        )
    print()
    print(f"ratio django_reactor/DBOS per step: {ratio:.3f}   target <= {TARGET_RATIO}   {verdict}")
    atomic_ratio = atomic.per_step_ms(steps) / ours if ours > 0 else float("inf")
    atomic_verdict = "PASS" if atomic_ratio <= TARGET_ATOMIC_RATIO else "MISS"
    print(
        f"ratio atomic/plain step (no-op bodies): {atomic_ratio:.3f}   "
        f"target <= {TARGET_ATOMIC_RATIO}   {atomic_verdict}"
    )
    plain_w, atomic_w = (w.per_step_ms(steps) for w in writers)
    print(
        f"a step that INSERTs one row: plain {plain_w:.4f} ms (its INSERT commits on its own), "
        f"atomic {atomic_w:.4f} ms (one commit with the checkpoint): "
        f"{atomic_w / plain_w if plain_w > 0 else float('inf'):.3f}x"
    )
    if stats:
        print()
        print(
            f"pg_stat per step (untimed pass: {args.stat_runs} runs of 1 and of {steps} steps "
            "per system, idle activity taken off)"
        )
        print(COLUMNS)
        for system in systems:
            if system.name in stats:
                print(row(system.name, stats[system.name].per_step, RUN_TABLES[system.name]))
        wal_ours = stats["django_reactor"].per_step.wal()[0]
        wal_verdict = "PASS" if wal_ours <= TARGET_WAL_PER_STEP else "MISS"
        print(
            f"WAL records per django_reactor step: {wal_ours:.1f}   "
            f"target <= {TARGET_WAL_PER_STEP:.0f}   {wal_verdict}"
        )
        for name, got in stats.items():
            rate = got.idle_rate
            if rate is not None:
                print(
                    f"({name} when idle: {rate.commits:.1f} commits/s, "
                    f"{rate.statements or 0:.1f} statements/s, {rate.wal()[0]:.1f} WAL "
                    "records/s, taken off)"
                )
            if got.other_xacts > 0:
                print(
                    f"note ({name}): {got.other_xacts:.0f} transaction(s) ran in other databases "
                    "during its windows (only the server-wide pg_stat_wal counts them)"
                )
        print(legend(probes))
        for probe in probes:
            for error in probe.errors:
                print(f"note ({probe.database}): {error}")
    print(f"(measured in {elapsed:.1f} s)")
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(0)
