"""Publishing queued dispatches (outbox rows) to Celery, after the transaction that wrote them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from django.db import connections, transaction
from django.utils import timezone

from ..engine import probes

try:  # the trace context for the tasks' headers, when OpenTelemetry is installed
    from ..otel import trace_headers
except ImportError:
    trace_headers = None  # type: ignore[assignment]

logger = logging.getLogger("django_reactor.celery")


@dataclass(frozen=True, slots=True)
class QueuedDispatch:
    """An outbox row to publish: the run to resume, and how long to wait first."""

    dispatch_id: int
    execution_id: UUID
    countdown: float = 0.0
    # "resume" for the run itself; "map" / "map_undo" run or undo elements of map ``map_id``.
    task: str = "resume"
    map_id: UUID | None = None


def publish_on_commit(dispatches: Sequence[QueuedDispatch], using: str) -> None:
    """Publish after the current transaction commits (at once outside a transaction).

    A failure to publish is logged and left to the sweeper, which republishes unsent rows.
    """
    if dispatches:
        transaction.on_commit(lambda: publish(dispatches, using), using=using, robust=True)


def publish(dispatches: Sequence[QueuedDispatch], using: str) -> list[int]:
    """Send one task per dispatch (``django_reactor.resume``, or a map's element task); mark
    the ones sent. Returns them."""
    from ..conf import reactor_settings
    from ..models import Dispatch
    from .tasks import map_elements, map_rollback, resume

    tasks = {"resume": resume, "map": map_elements, "map_undo": map_rollback}

    queue = reactor_settings.CELERY_QUEUE
    sent: list[int] = []
    if probes.active is not None:
        probes.active("before_publish", "")
    # Metadata only (W3C traceparent/tracestate): the messages stay identity-only.
    headers = trace_headers() if trace_headers is not None else None
    for item in dispatches:
        options: dict[str, object] = {}
        if queue:
            options["queue"] = queue
        if headers:
            options["headers"] = headers
        if item.countdown > 0:
            options["countdown"] = item.countdown
        task = tasks.get(item.task, resume)
        target = item.map_id if task is not resume else item.execution_id
        try:
            task.apply_async(args=[str(target)], **options)
        except Exception:
            logger.warning(
                "could not publish the task for execution %s; the sweeper will publish it",
                item.execution_id,
                exc_info=True,
            )
            continue
        sent.append(item.dispatch_id)
    if sent:
        # Raw SQL: this runs once per published task, and the ORM's update costs more here
        # than the statement itself.
        connection = connections[using]
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        placeholders = ", ".join(["%s"] * len(sent))
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Dispatch._meta.db_table} SET sent_at = %s WHERE id IN ({placeholders})",
                [now, *sent],
            )
    return sent
