"""The Celery tasks. Their messages carry an execution id and nothing else (plus, with
OpenTelemetry installed, the publisher's trace context in the headers)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from celery import Task, shared_task

from .. import services
from ..runtime import maps
from ..store import refresh_connections

try:  # join the publisher's trace while the task runs, when OpenTelemetry is installed
    from ..otel import task_context
except ImportError:
    from contextlib import nullcontext as task_context  # type: ignore[assignment]

logger = logging.getLogger("django_reactor.celery")


@contextlib.contextmanager
def _task_connections() -> Iterator[None]:
    """Around every task, what Django does around every request: drop database connections
    that broke or outlived ``CONN_MAX_AGE``, and arm ``CONN_HEALTH_CHECKS`` again.

    Celery's own fixup does this only every ``CELERY_DB_REUSE_MAX`` tasks, so a connection
    the server dropped would fail every task of the process until then.
    """
    refresh_connections()
    try:
        yield
    finally:
        refresh_connections()


@shared_task(
    name="django_reactor.resume",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def resume(self: Task, execution_id: str) -> None:
    """Take the run over (if nobody owns it) and execute it from its last checkpoint."""
    with _task_connections(), task_context(self.request):
        services.resume(execution_id)


@shared_task(
    name="django_reactor.resume_many",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def resume_many(self: Task, execution_ids: list[str]) -> None:
    """``resume`` each run, one after the other (the sweeper's wake-ups come in batches). A
    run that raises is logged and the others go on; a worker that dies leaves the rest to the
    sweeper, which publishes their dispatches again."""
    with _task_connections(), task_context(self.request):
        for execution_id in execution_ids:
            try:
                services.resume(execution_id)
            except Exception:
                logger.exception("resuming execution %s failed", execution_id)
            refresh_connections()


@shared_task(
    name="django_reactor.map_elements",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def map_elements(self: Task, map_id: str) -> None:
    """Run pending elements of a fanned-out map, a chunk at a time, until none is left."""
    with _task_connections(), task_context(self.request):
        maps.work(map_id, forward=True)


@shared_task(
    name="django_reactor.map_rollback",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def map_rollback(self: Task, map_id: str) -> None:
    """Undo succeeded elements of a fanned-out map, highest index first, until none is left."""
    with _task_connections(), task_context(self.request):
        maps.work(map_id, forward=False)


@shared_task(name="django_reactor.sweep", ignore_result=True)
def sweep() -> dict[str, Any]:
    """Republish lost work: unsent dispatches, runs whose worker died, due wake-ups."""
    with _task_connections():
        report = services.sweep()
    return report.as_dict()
