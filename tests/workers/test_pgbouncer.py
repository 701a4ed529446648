"""Real workers behind a real PgBouncer (Debian's 1.18) in transaction-pooling mode.

The ``[pgbouncer]`` runs of the tests marked ``behind_pgbouncer`` (see ``conftest.py``) show
that background runs, crashes and recovery, interrupts, maps and coordination work through the
pooler with the settings production uses behind it: ``DISABLE_SERVER_SIDE_CURSORS = True`` and
``REACTOR["CHECKPOINT_PREPARED_STATEMENTS"] = False``. This module shows the rest:

- the workers' connections do go through PgBouncer, in transaction mode, and nowhere else;
- prepared checkpoints (the default) are refused behind a PgBouncer older than 1.21: the engine
  turns them off in the process at the first refusal (an ERROR in the log says to set the
  setting) and no run fails; ``manage.py check --deploy`` says so beforehand
  (``django_reactor.W003``), for the configuration a user would write, and stays quiet for the
  right one;
- server connections dropped under running workers (``RECONNECT``; ``pg_terminate_backend``
  in the middle of their checkpoints; ``KILL`` + ``RESUME`` between statements and in the
  middle of a checkpoint) cost at most one failed task each, and every run, in flight or
  started after the fault, still completes with each effect once.

The test process stays on a direct connection to the test database; only the worker (and
``manage.py check``) processes go through the pooler.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from django_reactor.models import StepRecord
from django_reactor.states import ExecutionStatus
from testproject.example.models import Effect
from tests.workers.conftest import (
    WorkerDatabase,
    _process_env,
    direct_database,
    pooled_database,
)
from tests.workers.harness import ROOT, Worker, wait_until
from tests.workers.pgbouncer import PgBouncer
from tests.workers.reactors import Five
from tests.workers.test_background import body_runs
from tests.workers.test_coordination import start_runs, wait_finished
from tests.workers.test_crashes import FIVE_EFFECTS, effects

#: A task that did not do its work: Celery's line for a task that raised, or the engine's for a
#: run it parked because of an error of its own (``services.resume``). Celery's format only
#: (``[time: ERROR/ForkPoolWorker-1] ...``): the engine's console handler repeats its lines bare.
FAILED_TASK = re.compile(
    r"ERROR/[\w-]+\] (Task django_reactor\.\w+\[[0-9a-f-]+\] raised unexpected"
    r"|execution [0-9a-f-]+: the engine failed while running it)"
)
#: What PostgreSQL says when a prepared statement meets a server connection that is not the one
#: it was prepared on (``does not exist``), or one another client prepared it on (``already
#: exists``).
PREPARED_STATEMENT_ERROR = re.compile(
    r'prepared statement "_pg3_\d+" (does not exist|already exists)'
)
DATABASE_COORDINATION = "django_reactor.coordination.backends.database.DatabaseBackend"


@pytest.fixture
def worker_database(
    request: pytest.FixtureRequest, pgbouncer: PgBouncer, transactional_db: Any
) -> WorkerDatabase:
    """Every worker of this module behind PgBouncer; prepared checkpoints off, unless the test
    asks for ``"prepared"`` (indirect parametrization)."""
    return pooled_database(pgbouncer, prepared=getattr(request, "param", "") == "prepared")


def task_failures(workers: list[Worker]) -> list[str]:
    """Every failed-task line in the workers' logs (Celery's format, see ``FAILED_TASK``)."""
    return [line for w in workers for line in w.log().splitlines() if FAILED_TASK.search(line)]


def pgbouncer_version(pgbouncer: PgBouncer) -> tuple[int, ...]:
    """The running PgBouncer's version, e.g. ``(1, 18, 0)``."""
    text = str(pgbouncer.admin("SHOW VERSION")[0]["version"])  # "PgBouncer 1.18.0"
    return tuple(int(part) for part in text.split()[1].split("."))


def other_backends() -> set[int]:
    """PostgreSQL backends on the test database, except the test process's own."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return {pid for (pid,) in cursor.fetchall()}


# ---------------------------------------------------------------------------- the route


def test_workers_reach_the_database_only_through_pgbouncer_in_transaction_mode(
    start_worker: Callable[..., Worker], pgbouncer: PgBouncer
) -> None:
    assert pgbouncer.config("pool_mode") == "transaction"
    workers = [start_worker(), start_worker()]
    before = pgbouncer.transactions()
    ids = start_runs(Five, {}, 10)
    rows = wait_finished(ids, timeout=30)
    assert [r.status for r in rows] == [ExecutionStatus.COMPLETED] * 10
    assert all(body_runs(i) == dict.fromkeys(["s1", "s2", "s3", "s4", "s5"], 1) for i in ids)
    # Every run's claim and checkpoints went through the pooler, a transaction each.
    assert pgbouncer.transactions() - before >= 10 * 6
    # Nothing but PgBouncer's server connections is on the test database besides this process.
    backends = other_backends()
    assert backends
    assert backends <= {server.remote_pid for server in pgbouncer.servers()}
    assert task_failures(workers) == []


# ---------------------------------------------------------------------------- prepared checkpoints


@pytest.mark.parametrize("worker_database", ["prepared"], indirect=True)
def test_prepared_checkpoints_behind_pgbouncer_1_18_are_refused_once_then_turned_off(
    start_worker: Callable[..., Worker], pgbouncer: PgBouncer
) -> None:
    # PgBouncer before 1.21 does not track prepared statements: a checkpoint prepared on one
    # server connection is executed on another (or prepared again where another worker process
    # prepared the same name). The engine notices the first refusal, says loudly that
    # CHECKPOINT_PREPARED_STATEMENTS must be off here, stops preparing in that process and
    # sends the statement again: no run fails and no task fails for it.
    assert pgbouncer_version(pgbouncer) < (1, 21)
    assert pgbouncer.config("pool_mode") == "transaction"
    workers = [start_worker(), start_worker()]
    ids = start_runs(Five, {}, 12)
    rows = wait_finished(ids, timeout=45, sweep=True)
    assert [r.status for r in rows] == [ExecutionStatus.COMPLETED] * 12, [
        (r.status, r.failure) for r in rows
    ]
    for row in rows:
        assert effects(row.id) == FIVE_EFFECTS
        assert set(body_runs(row.id).values()) == {1}
    logged = "\n".join(w.log() for w in workers)
    assert "the database refused a prepared checkpoint" in logged
    assert PREPARED_STATEMENT_ERROR.search(logged)
    assert "CHECKPOINT_PREPARED_STATEMENTS'] = False" in logged
    assert task_failures(workers) == []


def deploy_check(database: WorkerDatabase, tmp_path: Any, *options: str) -> subprocess.Popen[str]:
    """``manage.py check --deploy`` with the workers' settings for ``database`` (started), and
    the example project's coordination backend (the workers' default needs a Redis cache)."""
    reactor = {**database.reactor, "COORDINATION_BACKEND": DATABASE_COORDINATION}
    return subprocess.Popen(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "CRITICAL", *options],
        env=_process_env(tmp_path, "", dataclasses.replace(database, reactor=reactor)),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_check_deploy_flags_prepared_checkpoints_behind_pgbouncer_and_not_the_right_settings(
    pgbouncer: PgBouncer, tmp_path: Any, transactional_db: Any
) -> None:
    prepared_only = WorkerDatabase(
        pgbouncer.url(), {}, {"CHECKPOINT_PREPARED_STATEMENTS": True}, pgbouncer=pgbouncer
    )
    with_database = ("--database", "default")
    cases: dict[str, tuple[WorkerDatabase, tuple[str, ...], bool]] = {
        # What a production user writes behind a transaction pooler: nothing to say.
        "pooled, production settings": (pooled_database(pgbouncer), with_database, False),
        # Django's pooler advice followed, django_reactor's forgotten: from the settings alone.
        "pooled, prepared on": (pooled_database(pgbouncer, prepared=True), (), True),
        # Only HOST/PORT point at PgBouncer: the settings cannot tell...
        "pooled via port only, settings": (prepared_only, (), False),
        # ...the connection can: PgBouncer announced a backend pid that is not the server's.
        "pooled via port only, database": (prepared_only, with_database, True),
        # And a direct connection is not mistaken for a pooler.
        "direct, database": (direct_database(), with_database, False),
    }
    started = {name: deploy_check(db, tmp_path, *opts) for name, (db, opts, _) in cases.items()}
    found = {}
    for name, process in started.items():
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0, f"{name}:\n{output}"
        found[name] = (set(re.findall(r"\((django_reactor\.[EW]\d{3})\)", output)), output)
    for name, (_, _, warned) in cases.items():
        ids, output = found[name]
        assert ("django_reactor.W003" in ids) == warned, f"{name}:\n{output}"
    assert "DISABLE_SERVER_SIDE_CURSORS suggests" in found["pooled, prepared on"][1]
    assert "reached through a connection pooler" in found["pooled via port only, database"][1]


# ---------------------------------------------------------------------------- lost connections


def terminate_server_backends() -> list[int]:
    """``pg_terminate_backend`` every backend of the test database but the test process's."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return [pid for pid, terminated in cursor.fetchall() if terminated]


def lock_waiters() -> int:
    """How many backends of the test database wait for a lock (all behind the test's own: no
    other process uses this database)."""
    with connection.cursor() as cursor:
        # Inside a transaction the activity view is a snapshot taken once: take a new one.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


def test_runs_survive_server_connections_dropped_under_running_workers(
    start_worker: Callable[..., Worker], pgbouncer: PgBouncer
) -> None:
    assert connection.settings_dict["NAME"] == pgbouncer.database
    db = pgbouncer.database
    workers = [start_worker(concurrency=2), start_worker(concurrency=2)]
    in_flight: list[Any] = []

    def reconnect() -> None:  # close every server connection once it is released
        pgbouncer.admin(f"RECONNECT {db}")

    def terminate() -> None:  # kill the server backends: their statements roll back
        assert terminate_server_backends()

    def kill_and_resume() -> None:  # drop every client and server connection at once
        pgbouncer.admin(f"KILL {db}")
        pgbouncer.admin(f"RESUME {db}")

    def kill_mid_statement() -> None:
        # A backend waiting for a lock does not notice that KILL closed its socket: its
        # checkpoint commits when the lock is released, after the worker saw the connection
        # fail. Keep the lock until each worker has reconnected, re-read its run (s3 not
        # recorded yet) and queued its own checkpoint of s3 behind the one cut off.
        kill_and_resume()
        wait_until(
            lambda: lock_waiters() >= 2 * len(in_flight),
            what="the retried checkpoints to queue behind the ones KILL cut off",
        )

    # (name, fault, whether it strikes while the in-flight runs' checkpoints are executing)
    phases: list[tuple[str, Callable[[], None], bool]] = [
        ("RECONNECT", reconnect, True),
        ("pg_terminate_backend", terminate, True),
        ("KILL between statements", kill_and_resume, False),
        ("KILL mid-statement", kill_mid_statement, True),
    ]
    for name, inject, mid_statement in phases:
        lines_before = {w.name: len(w.log().splitlines()) for w in workers}
        # Runs in flight: each of the 4 worker processes is inside a slow s3 (2 s)...
        slow = Effect.objects.create(key=f"slow-{name}", execution_id=uuid.uuid4(), step="slow-s3")
        in_flight[:] = start_runs(Five, {}, 4)
        wait_until(
            lambda: Effect.objects.filter(execution_id__in=in_flight, step="s3").count() == 4,
            what=f"4 runs to be inside s3 before {name}",
        )
        if not mid_statement:
            inject()  # the processes hold their (idle) client connections
        else:
            with transaction.atomic(), connection.cursor() as cursor:
                # ...and then, once the step is done, blocked in its s3 checkpoint (which
                # records the step) on the lock this takes: the fault finds their server
                # connections in the middle of a statement. Lease heartbeats are not held up.
                cursor.execute(f"LOCK TABLE {StepRecord._meta.db_table} IN EXCLUSIVE MODE")
                wait_until(
                    lambda: lock_waiters() >= len(in_flight),
                    what=f"the in-flight runs' checkpoints to block before {name}",
                )
                inject()
        slow.delete()
        after = start_runs(Five, {}, 4)  # new runs, on the connections the fault left
        rows = wait_finished([*in_flight, *after], timeout=45, sweep=True)
        logged = phase_log(workers, lines_before)
        broken = {str(r.id): (r.status, r.failure) for r in rows if r.status != "completed"}
        assert broken == {}, f"after {name}: {broken}\n{logged}"
        for execution_id in [*in_flight, *after]:
            assert effects(execution_id) == FIVE_EFFECTS, (name, execution_id)
        for execution_id in in_flight:  # committed before the fault: never run again
            runs = body_runs(execution_id)
            assert (runs["s1"], runs["s2"]) == (1, 1), (name, runs)
        for execution_id in after:
            assert body_runs(execution_id) == dict.fromkeys(FIVE_EFFECTS, 1), name
        failed = [line for line in logged.splitlines() if FAILED_TASK.search(line)]
        assert len(failed) <= 1, f"{name}: {len(failed)} failed tasks\n{logged}"
    assert all(w.process is not None and w.process.poll() is None for w in workers)


def phase_log(workers: list[Worker], lines_before: dict[str, int]) -> str:
    """The workers' WARNING and ERROR lines since ``lines_before`` (a line count per worker)."""
    return "\n".join(
        f"{w.name}: {line}"
        for w in workers
        for line in w.log().splitlines()[lines_before[w.name] :]
        if re.search(r"(WARNING|ERROR)/", line)
    )
