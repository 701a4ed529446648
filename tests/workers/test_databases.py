"""A worker configured with another database than the web process that published its task:
the message carries its run's database, and the worker refuses it out loud (an ERROR naming
both databases, the message rejected, not run and not acknowledged as done) instead of
ignoring an "unknown execution"; the sweeper of the right database publishes the run again,
and a worker on that database completes it. Messages without the header (an older publisher)
are taken as before, and a run the worker finds is run whatever the header says."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from celery import states
from django.conf import settings
from django.db import connection

from django_reactor import Dispatched, services, store
from django_reactor.celery import tasks
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.workers.conftest import WorkerDatabase, _process_env
from tests.workers.harness import ROOT, Worker, start_sweeper, stop_process, wait_until
from tests.workers.reactors import Five
from tests.workers.test_background import body_runs, finished

FIVE_TRACE = [
    ("start", ""), ("resume", ""),
    ("run", "s1"), ("run", "s2"), ("run", "s3"), ("run", "s4"), ("run", "s5"),
    ("complete", ""),
]  # fmt: skip


def trace(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace]


def _server() -> str:
    db = settings.DATABASES["default"]
    return f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER']}"


@pytest.fixture
def other_database(transactional_db: Any, tmp_path: Path) -> Iterator[WorkerDatabase]:
    """A second database on the test server, migrated: its own django_reactor identity."""
    name = f"{connection.settings_dict['NAME']}_elsewhere"
    with psycopg.connect(f"{_server()} dbname=postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    db = settings.DATABASES["default"]
    elsewhere = WorkerDatabase(f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{name}")
    migrated = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--skip-checks", "-v", "0"],
        cwd=ROOT, env=_process_env(tmp_path, database=elsewhere), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    yield elsewhere
    with psycopg.connect(f"{_server()} dbname=postgres", autocommit=True) as admin:
        # Only this test's own database: its workers have stopped, their backends may linger.
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name]
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


def _identity(database: WorkerDatabase) -> str:
    dbname = database.url.rsplit("/", 1)[1]
    with psycopg.connect(f"{_server()} dbname={dbname}") as conn:
        row = conn.execute("SELECT identity FROM django_reactor_database").fetchone()
    assert row is not None
    return str(row[0])


def _refusals(log: str, key: Any) -> list[str]:
    """The worker's ERROR lines refusing the message of execution ``key``."""
    return [
        line
        for line in log.splitlines()
        if "ERROR/" in line and "was published for the" in line and str(key) in line
    ]


def _refused(log: str, key: Any) -> bool:
    """Whether the worker refused ``key``'s message and then rejected it."""
    lines = _refusals(log, key)
    return bool(lines) and "reject requeue=False" in log.split(lines[0], 1)[1]


def test_a_worker_on_another_database_refuses_the_task_and_the_sweeper_republishes_it(
    other_database: WorkerDatabase, start_worker: Any, tmp_path: Path
) -> None:
    here = store.this_database(fresh=True)
    assert here is not None
    elsewhere = _identity(other_database)
    assert elsewhere != here.identity
    wrong = Worker(
        env=_process_env(tmp_path, database=other_database),
        queue=settings.REACTOR["CELERY_QUEUE"],
        log_dir=tmp_path,
    ).start()
    try:
        outcome = Five.run({})
        assert isinstance(outcome, Dispatched)
        key = outcome.execution_id
        # This run's refusal and the rejection after it: a message another test left in the
        # queue may be refused (and rejected) first.
        wait_until(lambda: _refused(wrong.log(), key), what="this run's message rejected")
        log = wrong.log()
    finally:
        wrong.stop()
    # One ERROR (the worker's log shows it at ERROR, and bare through the test settings'
    # handler), then Celery's WARNING that it rejected the message.
    (line,) = _refusals(log, key)
    assert f"the task resuming execution {key}" in line
    assert f"{here.name} (identity {here.identity})" in line  # the message's database
    assert f"(identity {elsewhere})" in line  # and the worker's
    assert f"{connection.settings_dict['NAME']}_elsewhere" in line
    assert "whose sweeper publishes its work again" in line
    assert "reject requeue=False: the message is for another database" in log.split(line, 1)[1]
    # Nothing happened to the run: still waiting for a worker, its task unclaimed.
    row = Execution.objects.get(pk=key)
    assert row.status == ExecutionStatus.PENDING
    assert row.lease_owner is None
    assert row.dispatches.get().sent_at is None
    # The sweeper of the run's database publishes it again; a worker on it completes it.
    start_worker()
    sweeper = start_sweeper(
        {**_process_env(tmp_path), "PYTHONUNBUFFERED": "1"}, tmp_path / "sweeper.log"
    )
    try:
        done = wait_until(lambda: finished(key), timeout=60, what="the run to complete")
    finally:
        stop_process(sweeper, signal.SIGINT)
    assert done.status == ExecutionStatus.COMPLETED
    assert body_runs(key) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1}
    assert trace(key) == FIVE_TRACE
    assert "'republished': 1" in (tmp_path / "sweeper.log").read_text()


# ---------------------------------------------------------------------------- the task itself


def _deliver(execution_id: Any, headers: dict[str, str] | None) -> Any:
    """Run the resume task as a worker runs a message with ``headers``."""
    return tasks.resume.apply(args=[str(execution_id)], headers=headers)


FOREIGN = {
    tasks.DATABASE_HEADER: str(uuid.uuid4()),
    tasks.DATABASE_NAME_HEADER: "shop on db-primary:5432",
}


@pytest.mark.parametrize(
    ("task", "argument", "work"),
    [
        (tasks.resume, lambda key: str(key), "the task resuming execution {key}"),
        (
            tasks.resume_many,
            lambda key: [str(key), str(uuid.uuid4())],
            "the task resuming execution {key}",
        ),
        (tasks.map_elements, lambda key: str(key), "the task for the elements of map {key}"),
        (tasks.map_rollback, lambda key: str(key), "the task for the elements of map {key}"),
    ],
    ids=["resume", "resume_many", "map_elements", "map_rollback"],
)
def test_a_message_for_another_database_is_rejected_with_an_error(
    transactional_db: Any, caplog: pytest.LogCaptureFixture, task: Any, argument: Any, work: str
) -> None:
    missing = uuid.uuid4()
    with caplog.at_level(logging.INFO, logger="django_reactor"):
        result = task.apply(args=[argument(missing)], headers=FOREIGN)
    assert result.state == states.REJECTED
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.name == "django_reactor.celery"
    message = error.getMessage()
    assert message.startswith(f"{work.format(key=missing)} was published for the ")
    assert "shop on db-primary:5432" in message
    assert f"(identity {FOREIGN[tasks.DATABASE_HEADER]})" in message
    assert connection.settings_dict["NAME"] in message  # the database this process is on
    assert "unknown execution" not in caplog.text
    assert "no longer exists" not in caplog.text


def test_messages_without_the_header_or_for_this_database_are_taken_as_before(
    transactional_db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    here = store.this_database()
    assert here is not None
    mine = tasks.database_headers(here)
    with caplog.at_level(logging.INFO, logger="django_reactor"):
        for headers in (None, mine):  # an older publisher's message; one of this database
            missing = uuid.uuid4()
            assert _deliver(missing, headers).state == states.SUCCESS
            assert f"resume task for unknown execution {missing}; ignored" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_run_this_database_has_is_run_whatever_the_header_says(transactional_db: Any) -> None:
    # A publisher's identity can be stale (a database recreated under a running process): a
    # run the worker finds is this database's (its id is a UUID), so it runs.
    outcome = Five.run({})
    stale = {tasks.DATABASE_HEADER: str(uuid.uuid4()), tasks.DATABASE_NAME_HEADER: "old"}
    assert _deliver(outcome.execution_id, stale).state == states.SUCCESS
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED
    assert trace(row.id) == FIVE_TRACE


def test_the_publisher_stamps_the_run_s_database_on_every_message(
    transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_reactor.celery.router import CeleryPublisher

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(tasks.resume, "apply_async", lambda **options: sent.append(options))
    monkeypatch.setattr(tasks.resume_many, "apply_async", lambda **options: sent.append(options))
    first, second = uuid.uuid4(), uuid.uuid4()
    CeleryPublisher().publish([store.QueuedDispatch(1, first)])
    CeleryPublisher().publish([store.QueuedDispatch(2, first), store.QueuedDispatch(3, second)])
    here = store.this_database()
    assert here is not None
    assert [options["headers"] for options in sent] == [tasks.database_headers(here)] * 2
    # For people: the database as this process's settings name it, never a password.
    assert here.name.startswith(f"{connection.settings_dict['NAME']} on ")
    assert str(connection.settings_dict["HOST"]) in here.name
