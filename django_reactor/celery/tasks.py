"""The Celery tasks. Their messages carry an execution id and nothing else (plus, with
OpenTelemetry installed, the publisher's trace context in the headers)."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task

try:  # join the publisher's trace while the task runs, when OpenTelemetry is installed
    from ..otel import task_context
except ImportError:
    from contextlib import nullcontext as task_context  # type: ignore[assignment]

logger = logging.getLogger("django_reactor.celery")


@shared_task(
    name="django_reactor.resume",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def resume(self: Task, execution_id: str) -> None:
    """Take the run over (if nobody owns it) and execute it from its last checkpoint."""
    from .. import services

    with task_context(self.request):
        services.resume(execution_id)


@shared_task(
    name="django_reactor.map_elements",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def map_elements(self: Task, map_id: str) -> None:
    """Run pending elements of a fanned-out map, a chunk at a time, until none is left."""
    from .. import maps

    with task_context(self.request):
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
    from .. import maps

    with task_context(self.request):
        maps.work(map_id, forward=False)


@shared_task(name="django_reactor.sweep", ignore_result=True)
def sweep() -> dict[str, Any]:
    """Republish lost work: unsent dispatches, runs whose worker died, due wake-ups."""
    from .. import services

    report = services.sweep()
    return report.as_dict()
