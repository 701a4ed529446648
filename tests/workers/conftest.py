"""Fixtures that start real Celery workers (and "web processes") on the test database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests.workers.harness import ROOT, Worker

WORKER_REACTOR_SETTINGS = {
    "LEASE_SECONDS": 2,
    "MAX_RECOVERY_ATTEMPTS": 2,
    "SWEEP_INTERVAL": 1.0,
    "REDISPATCH_AFTER": 3.0,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/workers/" in str(item.fspath):
            item.add_marker(pytest.mark.postgres)
            item.add_marker(pytest.mark.redis)


def _database_url() -> str:
    db = settings.DATABASES["default"]
    return (
        f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/"
        f"{connection.settings_dict['NAME']}"
    )


def _process_env(tmp_path: Path, faults: str = "") -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.workers.settings",
        "DATABASE_URL": _database_url(),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "REACTOR_SETTINGS_JSON": json.dumps(
            {**WORKER_REACTOR_SETTINGS, "CELERY_QUEUE": settings.REACTOR["CELERY_QUEUE"]}
        ),
        "PYTHONPATH": str(ROOT),
        "REACTOR_FAULTS_STATE": str(tmp_path),
    }
    env.pop("REACTOR_FAULTS", None)
    if faults:
        env["REACTOR_FAULTS"] = faults
    return env


@pytest.fixture
def start_worker(transactional_db: Any, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start a worker: ``start_worker(faults="after_step_commit@s3=kill:once")``."""
    started: list[Worker] = []

    def start(*, faults: str = "", concurrency: int = 2) -> Worker:
        worker = Worker(
            env=_process_env(tmp_path, faults),
            queue=settings.REACTOR["CELERY_QUEUE"],
            log_dir=tmp_path,
            concurrency=concurrency,
        )
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def run_in_subprocess(transactional_db: Any, tmp_path: Path) -> Callable[..., int]:
    """Run Python code as a separate "web process" on the test database; return its exit code."""

    def run(code: str, *, faults: str = "") -> int:
        script = "import django\ndjango.setup()\n" + code
        result = subprocess.run(
            [sys.executable, "-c", script],
            env=_process_env(tmp_path, faults),
            cwd=ROOT,
            timeout=120,
            capture_output=True,
        )
        return result.returncode

    return run
