"""Fixtures that start real Celery workers against the test database and Redis broker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests.workers.harness import Worker

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


@pytest.fixture
def start_worker(transactional_db: Any, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start a worker: ``start_worker(faults="after_step_commit@s3=kill:once")``."""
    started: list[Worker] = []
    db = settings.DATABASES["default"]
    database_url = (
        f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/"
        f"{connection.settings_dict['NAME']}"
    )

    def start(**options: Any) -> Worker:
        worker = Worker(
            database_url=database_url,
            broker_url=settings.CELERY_BROKER_URL,
            queue=settings.REACTOR["CELERY_QUEUE"],
            reactor_settings={
                **WORKER_REACTOR_SETTINGS,
                "CELERY_QUEUE": settings.REACTOR["CELERY_QUEUE"],
            },
            log_dir=tmp_path,
            **options,
        )
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()
