"""Fixtures that start real Celery workers (and "web processes") on the test database.

Tests marked ``behind_pgbouncer`` run twice: ``[direct]``, and ``[pgbouncer]`` with the worker
and "web" processes connected through a transaction-pooling PgBouncer (``pgbouncer.py``) with the
settings production uses behind one. The test process itself stays on a direct connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from tests.workers.harness import ROOT, Worker, wait_until
from tests.workers.pgbouncer import (
    POOLED_DATABASE_OPTIONS,
    POOLED_REACTOR_SETTINGS,
    PgBouncer,
    pgbouncer_binary,
)

WORKER_REACTOR_SETTINGS = {
    "LEASE_SECONDS": 2,
    "MAX_RECOVERY_ATTEMPTS": 2,
    "SWEEP_INTERVAL": 1.0,
    "REDISPATCH_AFTER": 3.0,
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "behind_pgbouncer: run the worker test a second time with its worker processes behind "
        "a transaction-pooling PgBouncer (tests/workers/pgbouncer.py)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("behind_pgbouncer") is None:
        return
    if "worker_database" not in metafunc.fixturenames:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid} is marked behind_pgbouncer but starts no worker "
            "(it uses no fixture that depends on worker_database)"
        )
    metafunc.parametrize("worker_database", ["direct", "pgbouncer"], indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # PostgreSQL's, but for those marked ``mariadb`` (the MariaDB pass runs them too).
    for item in items:
        if "tests/workers/" in str(item.fspath):
            item.add_marker(pytest.mark.postgres)
            item.add_marker(pytest.mark.redis)


def _database_url() -> str:
    db = settings.DATABASES["default"]
    if connection.vendor == "mysql":  # the MariaDB pass
        return (
            f"mysql://{db['USER']}@{db['HOST']}:{db['PORT'] or 3306}/"
            f"{connection.settings_dict['NAME']}"
        )
    return (
        f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/"
        f"{connection.settings_dict['NAME']}"
    )


@dataclass(frozen=True)
class WorkerDatabase:
    """How the worker (and "web") processes reach the test database."""

    url: str
    #: Merged into their ``DATABASES["default"]``.
    options: dict[str, Any] = field(default_factory=dict)
    #: Merged into their ``REACTOR`` setting.
    reactor: dict[str, Any] = field(default_factory=dict)
    #: The pooler in between, if any.
    pgbouncer: PgBouncer | None = None


def direct_database() -> WorkerDatabase:
    """Straight to the test database's server."""
    return WorkerDatabase(_database_url())


def pooled_database(pgbouncer: PgBouncer, *, prepared: bool = False) -> WorkerDatabase:
    """Through ``pgbouncer``, configured as production behind a transaction pooler would be;
    ``prepared=True`` leaves the prepared checkpoint statement on (the default setting)."""
    reactor = dict(POOLED_REACTOR_SETTINGS)
    if prepared:
        reactor["CHECKPOINT_PREPARED_STATEMENTS"] = True
    return WorkerDatabase(
        pgbouncer.url(), dict(POOLED_DATABASE_OPTIONS), reactor, pgbouncer=pgbouncer
    )


def _process_env(
    tmp_path: Path,
    faults: str = "",
    database: WorkerDatabase | None = None,
    broker: str | None = None,
) -> dict[str, str]:
    database = database or direct_database()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.workers.settings",
        "DATABASE_URL": database.url,
        "REACTOR_DATABASE_JSON": json.dumps(database.options),
        "CELERY_BROKER_URL": broker or settings.CELERY_BROKER_URL,
        "REACTOR_SETTINGS_JSON": json.dumps(
            {
                **WORKER_REACTOR_SETTINGS,
                "CELERY_QUEUE": settings.REACTOR["CELERY_QUEUE"],
                **database.reactor,
            }
        ),
        "PYTHONPATH": str(ROOT),
        "REACTOR_FAULTS_STATE": str(tmp_path),
    }
    env.pop("REACTOR_FAULTS", None)
    if faults:
        env["REACTOR_FAULTS"] = faults
    return env


def missing_service(why: str) -> NoReturn:
    """Skip the test because a program it needs is not installed, or fail it with
    ``REACTOR_REQUIRE_SERVICES=1``."""
    if getattr(settings, "REQUIRE_SERVICES", False):
        pytest.fail(f"REACTOR_REQUIRE_SERVICES=1 but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup: Any, django_db_blocker: Any) -> Iterator[PgBouncer]:
    """A transaction-pooling PgBouncer in front of the test database, for the whole session.

    Skipped when pgbouncer is not installed (failed with ``REACTOR_REQUIRE_SERVICES=1``)."""
    binary = pgbouncer_binary()
    if binary is None:
        missing_service(
            "needs pgbouncer: not installed (apt-get install pgbouncer, or set PGBOUNCER to "
            "its path)"
        )
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            pytest.skip("PgBouncer tests need PostgreSQL")
        db = connection.settings_dict
    bouncer = PgBouncer(
        binary=str(binary),
        database=str(db["NAME"]),
        server_host=str(db["HOST"] or "127.0.0.1"),
        server_port=int(db["PORT"] or 5432),
        user=str(db["USER"] or "postgres"),
    )
    try:
        bouncer.start()
    except RuntimeError as exc:
        bouncer.remove()
        missing_service(f"pgbouncer at {binary} would not start: {exc}")
    yield bouncer
    backends = set()
    with contextlib.suppress(psycopg.Error):
        backends = {s.remote_pid for s in bouncer.servers()}
    bouncer.stop()
    bouncer.remove()
    # Its server connections close with it: wait for their backends to be gone, so that
    # dropping the test database at the end of the session does not find them.
    server = f"host={bouncer.server_host} port={bouncer.server_port} user={bouncer.user}"
    with psycopg.connect(f"{server} dbname=postgres", autocommit=True) as conn:

        def gone() -> bool:
            query = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)"
            return conn.execute(query, [list(backends)]).fetchone() == (0,)

        wait_until(gone, timeout=15, what="PgBouncer's server backends to exit")


@pytest.fixture
def worker_database(
    request: pytest.FixtureRequest, transactional_db: Any
) -> Iterator[WorkerDatabase]:
    """Direct, or through PgBouncer for the ``[pgbouncer]`` run of a ``behind_pgbouncer`` test
    (which then checks that the test's processes did go through it)."""
    if getattr(request, "param", "direct") == "direct":
        yield direct_database()
        return
    if connection.vendor != "postgresql":
        pytest.skip("PgBouncer pools PostgreSQL connections (this is the MariaDB pass)")
    bouncer: PgBouncer = request.getfixturevalue("pgbouncer")
    before = bouncer.transactions()
    yield pooled_database(bouncer)
    assert bouncer.transactions() > before, "no transaction went through PgBouncer"


@pytest.fixture
def start_worker(
    transactional_db: Any, tmp_path: Path, worker_database: WorkerDatabase
) -> Iterator[Callable[..., Worker]]:
    """Start a worker: ``start_worker(faults="after_step_commit@s3=kill:once")``; ``queues``:
    the queues it consumes (the tests' queue by default), ``broker``: another broker's URL."""
    started: list[Worker] = []

    def start(
        *,
        faults: str = "",
        concurrency: int = 2,
        queues: Sequence[str] = (),
        broker: str | None = None,
    ) -> Worker:
        worker = Worker(
            env=_process_env(tmp_path, faults, worker_database, broker),
            queue=",".join(queues) or settings.REACTOR["CELERY_QUEUE"],
            log_dir=tmp_path,
            concurrency=concurrency,
        )
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def run_in_subprocess(
    transactional_db: Any, tmp_path: Path, worker_database: WorkerDatabase
) -> Callable[..., int]:
    """Run Python code as a separate "web process" on the test database; return its exit code.
    ``broker``: publish to another broker than the tests'."""

    def run(code: str, *, faults: str = "", broker: str | None = None) -> int:
        script = "import django\ndjango.setup()\n" + code
        result = subprocess.run(
            [sys.executable, "-c", script],
            env=_process_env(tmp_path, faults, worker_database, broker),
            cwd=ROOT,
            timeout=120,
            capture_output=True,
        )
        return result.returncode

    return run
