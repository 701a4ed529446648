"""10,000 runs sleeping until the same second, resumed by 2 worker processes; a sleeping run
costs no worker time.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
Redis on 127.0.0.1:6379)::

    .venv/bin/python benchmarks/sleeping_runs.py [--runs 10000]

What it measures
----------------
``NapsUntil`` (``benchmarks/bg_reactors.py``) sleeps until the time given as its input, then
runs one no-op step. The script:

1. starts ``--runs`` runs inline (database ``reactor_bench_sleep``, emptied first), each
   sleeping until an hour from now: each run parks (``pending``, its ``sleeping`` step record
   holding the time, its wake-up time stored); no message is queued and no worker holds it;
2. starts one Celery worker (``-P prefork -c 2``) and the sweeper
   (``manage.py reactor_sweep --loop --interval 1``, ``SWEEP_BATCH`` = ``--runs``), and for
   ``--idle`` seconds measures what the sleeping runs cost them: the CPU seconds the worker's
   processes use and the messages in its queue (none: nothing waits in a worker's memory);
3. moves the stored times forward so that every run is due at the same second, 3 s from now
   (``django_reactor.store.shift``: what the clock reaching them would do), and measures from
   that second until every sleep has ended (the sweep that wakes the runs records their sleep
   steps completed, in one statement), until every run has resumed (a worker has taken it: it
   is no longer pending) and until every run has completed, polling the database every 200 ms
   (three counts; the runs' through the status index).

Target (issue 17): every run resumed within 5 s of the second they are due. The exit code is 0
whatever the figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
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
TARGET_SECONDS = 5.0
LEAD = 3.0  # seconds between moving the times and the second every run is due

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
    import redis

    client = redis.Redis.from_url(f"{REDIS_SERVER}/{BROKER_DB}")
    try:
        client.delete(QUEUE, "unacked", "unacked_index")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000, help="sleeping runs (10,000)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds measured asleep (10)")
    args = parser.parse_args(argv)
    ensure_database(DATABASE)
    setup_django()
    empty_queue()  # of an interrupted run
    from django.utils import timezone

    from benchmarks.bg_reactors import NapsUntil
    from django_reactor.store import shift

    wake = timezone.now() + dt.timedelta(hours=1)
    started = time.perf_counter()
    for _ in range(args.runs):
        outcome = NapsUntil.run({"at": wake.isoformat()})
        if outcome.status != "pending":
            raise BenchmarkError(f"a run did not go to sleep: {outcome!r}")
    created = time.perf_counter() - started
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "REACTOR_SWEEP_BATCH": str(args.runs),
    }
    with tempfile.TemporaryDirectory() as logs:
        worker = Worker("sleeping-runs", "testproject", QUEUE, env, Path(logs), processes=2)
        worker.start()
        sweeper_log = (Path(logs) / "sweeper.log").open("wb")
        sweeper = subprocess.Popen(
            [sys.executable, "manage.py", "reactor_sweep", "--loop", "--interval", "1",
             "--skip-checks"],
            cwd=REPO_ROOT, env=env, stdout=sweeper_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            pids = _group(worker)
            before = cpu_seconds(pids)
            time.sleep(args.idle)  # the runs sleep: measure what that costs the worker
            asleep_cpu = cpu_seconds(pids) - before
            asleep_messages = messages()
            due = timezone.now() + dt.timedelta(seconds=LEAD)
            shift.shift_due_times(wake - due)
            late = (timezone.now() - due).total_seconds()
            if late > 0:  # the times moved after the second they name: measure from the move
                print(f"moving the times took {LEAD + late:.1f} s; measured from when they moved")
                due += dt.timedelta(seconds=late)
            ended_at = resumed_at = completed_at = None
            deadline = time.monotonic() + LEAD + 120
            while time.monotonic() < deadline:
                sleeping, resumed, completed = counts(args.runs)
                now = timezone.now()
                if ended_at is None and sleeping == 0:
                    ended_at = (now - due).total_seconds()
                if resumed_at is None and resumed >= args.runs:
                    resumed_at = (now - due).total_seconds()
                if completed >= args.runs:
                    completed_at = (now - due).total_seconds()
                    break
                time.sleep(0.2)
            busy_cpu = cpu_seconds(_group(worker)) - before - asleep_cpu
        finally:
            sweeper.terminate()
            sweeper.wait(timeout=15)
            worker.stop()
            sweeper_log.close()
    print(
        f"{args.runs:,} runs sleeping until the same second, then one no-op step; one worker "
        "-P prefork -c 2, the sweeper every 1 s"
    )
    print(f"created asleep in {created:.1f} s ({args.runs / created:,.0f} runs/s inline)")
    print(
        f"while they slept ({args.idle:.0f} s): worker CPU {asleep_cpu:.2f} s, messages queued "
        f"or held: {asleep_messages}"
    )
    print(
        f"every sleep ended {_fmt(ended_at)} after the second they were due (recorded "
        "completed by the sweep that woke the runs)"
    )
    verdict = "PASS" if resumed_at is not None and resumed_at <= TARGET_SECONDS else "MISS"
    print(
        f"every run resumed {_fmt(resumed_at)} after the second they were due   "
        f"target <= {TARGET_SECONDS:.0f} s   {verdict}"
    )
    print(f"every run completed {_fmt(completed_at)} after it (worker CPU {busy_cpu:.1f} s)")
    return 0


def _group(worker: Worker) -> list[int]:
    from tests.workers.harness import children_of

    assert worker.process is not None
    return [worker.process.pid, *children_of(worker.process.pid)]


def _fmt(seconds: float | None) -> str:
    return "not within the time allowed" if seconds is None else f"{seconds:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
