"""10,000 runs sleeping until the same second, woken by the sweeper at the default settings
and resumed by 2 worker processes, against Celery ETA tasks due at one instant; a sleeping run
costs no worker time.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/sleeping_runs.py [--runs 10000] [--no-anchor]
    .venv/bin/python benchmarks/sleeping_runs.py --runs 100000 --no-anchor

What it measures
----------------
``NapsUntil`` (``benchmarks/bg_reactors.py``) sleeps until the time given as its input, then
runs one no-op step. The script:

1. starts ``--runs`` runs inline (database ``reactor_bench_sleep``, emptied first), each
   sleeping until an hour from now: each run parks (``pending``, its ``sleeping`` step record
   holding the time, its wake-up time stored); no message is queued and no worker holds it;
2. starts one Celery worker (``-P prefork -c 2``) and for ``--idle`` seconds measures what the
   sleeping runs cost it: the CPU seconds its processes use and the messages in its queue
   (none: nothing waits in a worker's memory);
3. moves the stored times forward so that every run is due at the same second, 3 s from now
   (``django_reactor.store.time_in_tests``: what the clock reaching them would do), then
   starts the sweeper, ``manage.py reactor_sweep --loop`` at the default settings (no
   ``--interval``, ``SWEEP_INTERVAL``, ``SWEEP_BATCH`` or ``SWEEP_BUDGET`` of its own): it
   starts after the move, as a sweeper that had been sweeping all along would know the times;
4. measures from that second until every sleep has ended (the sweep that wakes the runs
   records their sleep steps completed), until every run has resumed (a worker has taken it:
   it is no longer pending) and until every run has completed, polling the database every
   200 ms, and prints how many had resumed by each second.

The anchor (``benchmarks/eta_anchor.py``, skipped with ``--no-anchor``): as many durable runs
written ``sleeping`` in database ``reactor_bench_eta``, each with a Celery task published with
``apply_async(eta=...)`` for one instant (Redis db 10), taken by the same kind of worker
(``-P prefork -c 2``), which claims the run and completes it (2 commits, as ours); measured the
same way from that instant.

Targets (issue 28): every run resumed within 5 s of the second they are due (10,000 runs;
60 s above 10,000); ours at least 1.0x the anchor's runs a second. The exit code is 0 whatever
the figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, ensure_database
from benchmarks.workers import BenchmarkError, Worker

REDIS_SERVER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379").rstrip("/")
DATABASE = "reactor_bench_sleep"
BROKER_DB = 11
QUEUE = "django_reactor_bench_sleep"
TARGET_SECONDS = 5.0  # 10,000 runs (or fewer) all resumed within
TARGET_SECONDS_LARGE = 60.0  # more (100,000) all resumed within
LEAD = 3.0  # seconds between moving the times and the second every run is due
ANCHOR_DATABASE = "reactor_bench_eta"
ANCHOR_BROKER_DB = 10
CALIBRATION_QUEUE = "eta_anchor_calibration"
#: The seconds after the due second at which the runs resumed (and sleeps ended) are printed.
MARKS = (1, 2, 3, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240, 300, 360)

os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bg_settings"
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"
os.environ["CELERY_BROKER_URL"] = f"{REDIS_SERVER}/{BROKER_DB}"
os.environ["REACTOR_BENCH_QUEUE"] = QUEUE


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


def empty_queue() -> None:
    empty_queue_named(QUEUE)


def empty_queue_named(queue: str) -> None:
    """Empty the Redis broker's queue ``queue`` (and the messages held unacknowledged)."""
    import redis

    client = redis.Redis.from_url(f"{REDIS_SERVER}/{BROKER_DB}")
    try:
        client.delete(queue, "unacked", "unacked_index")
    finally:
        client.close()


def messages() -> int:
    import redis

    client = redis.Redis.from_url(f"{REDIS_SERVER}/{BROKER_DB}")
    try:
        return int(client.llen(QUEUE)) + int(client.hlen("unacked"))
    finally:
        client.close()


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes used so far (from /proc)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def counts(total: int) -> tuple[int, int, int]:
    """(sleeps still sleeping, runs resumed: no longer waiting, runs completed); the runs read
    through the status index so that polling costs the server little."""
    from django_reactor.models import Execution, StepRecord

    sleeping = StepRecord.objects.filter(status="sleeping").count()
    waiting = Execution.objects.filter(status="pending").count()
    completed = Execution.objects.filter(status="completed").count()
    return sleeping, total - waiting, completed


@dataclass
class Woken:
    """When the runs woke, in seconds after the second they were due (None: not in time)."""

    runs: int
    ended: float | None = None  # every sleep recorded over (ours: by the sweep)
    resumed: float | None = None  # every run taken by a worker
    completed: float | None = None
    resumed_in_target: int = 0  # runs resumed within the target
    late_start: float = 0.0  # how late the times were set (or the tasks published)
    busy_cpu: float = 0.0
    # (seconds after the due second, sleeps ended, runs resumed), about once a second.
    timeline: list[tuple[float, int | None, int]] = field(default_factory=list)

    def rate(self, seconds: float | None) -> float | None:
        return self.runs / seconds if seconds else None


def poll(
    woken: Woken,
    due: dt.datetime,
    target: float,
    timeout: float,
    counts: Callable[[], tuple[int | None, int, int]],
) -> None:
    """Fill ``woken`` from ``counts()`` (sleeping, resumed, completed), polled every 200 ms
    from ``due`` until every run completed or ``timeout`` seconds after ``due``."""
    from django.utils import timezone

    deadline = time.monotonic() + max(0.0, (due - timezone.now()).total_seconds()) + timeout
    while time.monotonic() < deadline:
        sleeping, resumed, completed = counts()
        after = (timezone.now() - due).total_seconds()
        if not woken.timeline or after - woken.timeline[-1][0] >= 1.0:
            woken.timeline.append(
                (after, None if sleeping is None else woken.runs - sleeping, resumed)
            )
        if after <= target:
            woken.resumed_in_target = resumed
        if woken.ended is None and sleeping == 0 and after >= 0:
            woken.ended = after
        if woken.resumed is None and resumed >= woken.runs:
            woken.resumed = after
        if completed >= woken.runs:
            woken.completed = after
            return
        time.sleep(0.2)


def ours(args: argparse.Namespace, target: float) -> Woken:
    """The runs of django_reactor, woken by its sweeper at the default settings."""
    from django.utils import timezone

    from benchmarks.bg_reactors import NapsUntil
    from django_reactor.store import time_in_tests

    wake = timezone.now() + dt.timedelta(hours=1)
    started = time.perf_counter()
    for _ in range(args.runs):
        outcome = NapsUntil.run({"at": wake.isoformat()})
        if outcome.status != "pending":
            raise BenchmarkError(f"a run did not go to sleep: {outcome!r}")
    created = time.perf_counter() - started
    print(f"created asleep in {created:.1f} s ({args.runs / created:,.0f} runs/s inline)")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for name in ("REACTOR_SWEEP_BATCH", "REACTOR_SWEEP_INTERVAL"):
        env.pop(name, None)  # the defaults
    woken = Woken(args.runs)
    with tempfile.TemporaryDirectory() as logs:
        worker = Worker("sleeping-runs", "testproject", QUEUE, env, Path(logs), processes=2)
        worker.start()
        sweeper_log = (Path(logs) / "sweeper.log").open("wb")
        sweeper = None
        try:
            pids = _group(worker)
            before = cpu_seconds(pids)
            time.sleep(args.idle)  # the runs sleep: measure what that costs the worker
            asleep_cpu = cpu_seconds(pids) - before
            asleep_messages = messages()
            print(
                f"while they slept ({args.idle:.0f} s): worker CPU {asleep_cpu:.2f} s, messages "
                f"queued or held: {asleep_messages}"
            )
            due = timezone.now() + dt.timedelta(seconds=LEAD)
            time_in_tests.shift_due_times(wake - due)
            late = (timezone.now() - due).total_seconds()
            if late > 0:  # the times moved after the second they name: measure from the move
                due += dt.timedelta(seconds=late)
                woken.late_start = late
            # The sweeper starts once the times have moved, as one that has been sweeping all
            # along knows them: at the defaults (REACTOR's SWEEP_INTERVAL and SWEEP_BATCH).
            sweeper = subprocess.Popen(
                [sys.executable, "manage.py", "reactor_sweep", "--loop", "--skip-checks"],
                cwd=REPO_ROOT, env=env, stdout=sweeper_log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            poll(woken, due, target, args.timeout, lambda: counts(args.runs))
            woken.busy_cpu = cpu_seconds(_group(worker)) - before - asleep_cpu
        finally:
            if sweeper is not None:
                sweeper.terminate()
                sweeper.wait(timeout=15)
            worker.stop()
            sweeper_log.close()
    return woken


def anchor(args: argparse.Namespace, target: float) -> Woken:
    """The same number of runs as Celery ETA tasks (``benchmarks/eta_anchor.py``), due at one
    instant, on the same kind of worker."""
    import psycopg
    import redis
    from django.utils import timezone

    from benchmarks import eta_anchor

    ensure_database(ANCHOR_DATABASE)
    dsn = f"{PG_SERVER}/{ANCHOR_DATABASE}"
    broker = f"{REDIS_SERVER}/{ANCHOR_BROKER_DB}"
    client = redis.Redis.from_url(broker)
    client.delete(eta_anchor.QUEUE, "unacked", "unacked_index")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "ETA_DSN": dsn, "ETA_BROKER": broker}
    os.environ.update(ETA_DSN=dsn, ETA_BROKER=broker)
    eta_anchor.app.conf.broker_url = broker
    woken = Woken(args.runs)
    with psycopg.connect(dsn, autocommit=True) as conn, tempfile.TemporaryDirectory() as logs:
        eta_anchor.DSN = dsn
        eta_anchor.create_schema(conn)
        worker = Worker("eta-anchor", "benchmarks.eta_anchor", eta_anchor.QUEUE, env, Path(logs))
        worker.start()
        try:
            # Publishing takes time: the instant is set so that the last task is out before
            # it, from the rate of a first, throwaway round (rows written, tasks published to
            # another queue, then deleted).
            sample = min(500, args.runs)
            started = time.perf_counter()
            for _ in range(sample):
                eta_anchor.submit(conn, timezone.now(), queue=CALIBRATION_QUEUE)
            rate = sample / (time.perf_counter() - started)
            client.delete(CALIBRATION_QUEUE)
            conn.execute("TRUNCATE eta_run")
            due = timezone.now() + dt.timedelta(seconds=LEAD + 1.5 * args.runs / rate)
            for _ in range(args.runs):
                eta_anchor.submit(conn, due)
            late = (timezone.now() - due).total_seconds()
            if late > 0:
                due += dt.timedelta(seconds=late)
                woken.late_start = late

            def anchor_counts() -> tuple[int | None, int, int]:
                resumed, completed = eta_anchor.counts(conn)
                return None, resumed, completed

            before = cpu_seconds(_group(worker))
            poll(woken, due, target, args.timeout, anchor_counts)
            woken.busy_cpu = cpu_seconds(_group(worker)) - before
        finally:
            worker.stop()
            client.delete(eta_anchor.QUEUE, "unacked", "unacked_index")
            client.close()
    return woken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000, help="sleeping runs (10,000)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds measured asleep (10)")
    parser.add_argument(
        "--timeout", type=float, default=360.0, help="seconds measured after the due second"
    )
    parser.add_argument("--no-anchor", action="store_true", help="skip the Celery ETA anchor")
    args = parser.parse_args(argv)
    target = TARGET_SECONDS if args.runs <= 10_000 else TARGET_SECONDS_LARGE
    ensure_database(DATABASE)
    setup_django()
    empty_queue()  # of an interrupted run
    print(
        f"{args.runs:,} runs sleeping until the same second, then one no-op step; one worker "
        "-P prefork -c 2; the sweeper (reactor_sweep --loop) at the default settings"
    )
    mine = ours(args, target)
    theirs = None if args.no_anchor else anchor(args, target)
    for name, woken in (("django_reactor", mine), ("Celery ETA anchor", theirs)):
        if woken is None:
            continue
        print(f"{name}:")
        if woken.late_start:
            print(f"  (the instant was {woken.late_start:.1f} s late; measured from then)")
        if woken.ended is not None and name == "django_reactor":
            print(f"  every sleep ended {_fmt(woken.ended)} after the second they were due")
        rate = woken.rate(woken.resumed)
        print(
            f"  every run resumed {_fmt(woken.resumed)} after it"
            + (f" ({rate:,.0f} runs/s)" if rate else "")
            + f"; within {target:.0f} s: {woken.resumed_in_target:,} of {woken.runs:,}"
        )
        marks = _marks(woken)
        print("  resumed by then: " + ", ".join(f"{s} s {r:,}" for s, _, r in marks))
        if name == "django_reactor":
            print("  sleeps ended by then: " + ", ".join(f"{s} s {e:,}" for s, e, _ in marks))
        done = woken.rate(woken.completed)
        print(
            f"  every run completed {_fmt(woken.completed)} after it"
            + (f" ({done:,.0f} runs/s)" if done else "")
            + f" (worker CPU {woken.busy_cpu:.1f} s)"
        )
    verdict = "PASS" if mine.resumed is not None and mine.resumed <= target else "MISS"
    print(f"every run resumed within {target:.0f} s of the second they were due: {verdict}")
    if theirs is not None:
        for what, a, b in (
            ("resumed", mine.rate(mine.resumed), theirs.rate(theirs.resumed)),
            ("completed", mine.rate(mine.completed), theirs.rate(theirs.completed)),
        ):
            if a and b:
                verdict = "PASS" if a >= b else "MISS"
                print(
                    f"runs {what} a second, ours / anchor: {a / b:.2f}x   target >= 1.0x   "
                    + verdict
                )
    return 0


def _marks(woken: Woken) -> list[tuple[int, int | None, int]]:
    """The timeline at each of ``MARKS`` it reached: the last sample taken by then."""
    marks = []
    for mark in MARKS:
        taken = [sample for sample in woken.timeline if sample[0] <= mark]
        if taken:
            marks.append((mark, taken[-1][1], taken[-1][2]))
        if not woken.timeline or woken.timeline[-1][0] <= mark:
            break
    return marks


def _group(worker: Worker) -> list[int]:
    from tests.workers.harness import children_of

    assert worker.process is not None
    return [worker.process.pid, *children_of(worker.process.pid)]


def _fmt(seconds: float | None) -> str:
    return "not within the time allowed" if seconds is None else f"{seconds:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
