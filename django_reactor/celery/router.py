"""The Celery side of the outbox: the publisher that turns queued dispatches into tasks.

``AppConfig.ready()`` registers :class:`CeleryPublisher` with :mod:`django_reactor.store.outbox`
when Celery is installed; the store then hands it the dispatches each committed transaction
queued (and the sweeper the ones a crash left unsent), and marks sent the ones it returns.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence

from celery import Task

from ..conf import reactor_settings
from ..engine.routing import DEFAULT_ROUTE, Route
from ..store.identity import this_database
from ..store.outbox import QueuedDispatch
from . import tasks
from .priorities import broker_priority_scale
from .tasks import database_headers

try:  # the trace context for the tasks' headers, when OpenTelemetry is installed
    from ..otel import trace_headers
except ImportError:
    trace_headers = None  # type: ignore[assignment]

logger = logging.getLogger("django_reactor.celery")

#: The task each dispatch kind becomes; its only argument is the execution id (or the map id);
#: its headers name the run's database (``tasks.DATABASE_HEADER``).
TASKS = {
    "resume": tasks.resume,
    "map": tasks.map_elements,
    "map_undo": tasks.map_rollback,
}


#: Runs resumed by one ``django_reactor.resume_many`` task when many are due at once.
BATCH = 50


class CeleryPublisher:
    """Sends one task per dispatch: ``django_reactor.resume``, or a map's element task, to the
    run's queue with its priority; runs due together on one route (the sweeper's wake-ups) go
    ``BATCH`` at a time to a ``django_reactor.resume_many`` task: 10,000 wake-ups are 200
    messages."""

    def publish(self, dispatches: Sequence[QueuedDispatch]) -> list[int]:
        """Send each dispatch (most urgent first, as the outbox orders them); return the ids
        sent. One the broker refuses is logged and left unsent, for the sweeper to publish
        again."""
        # Metadata only (the run's database, W3C traceparent/tracestate): the messages' bodies
        # stay identity-only.
        database = this_database()
        headers = {
            **(database_headers(database) if database is not None else {}),
            **((trace_headers() or {}) if trace_headers is not None else {}),
        }
        base: dict[str, object] = {"headers": headers} if headers else {}
        scale = broker_priority_scale(tasks.resume.app)
        together: dict[Route, list[QueuedDispatch]] = {}
        if len(dispatches) > 1:
            for d in dispatches:
                if d.task == "resume" and d.countdown <= 0:
                    together.setdefault(d.route or DEFAULT_ROUTE, []).append(d)
        sent: list[int] = []
        for route, batch in together.items():
            options = {**base, **route_options(route, scale)}
            for start in range(0, len(batch), BATCH):
                chunk = batch[start : start + BATCH]
                ids = [str(item.execution_id) for item in chunk]
                if _send(tasks.resume_many, ids, options, f"{len(chunk)} executions"):
                    sent.extend(item.dispatch_id for item in chunk)
        alone = {id(item) for batch in together.values() for item in batch}
        for item in dispatches:
            if id(item) in alone:
                continue
            task = TASKS.get(item.task, tasks.resume)
            target = item.map_id if task is not tasks.resume else item.execution_id
            options = {**base, **route_options(item.route or DEFAULT_ROUTE, scale)}
            if item.countdown > 0:
                options["countdown"] = item.countdown
            if _send(task, str(target), options, f"execution {item.execution_id}"):
                sent.append(item.dispatch_id)
        return sent

    def publish_operation(self, operation_id: uuid.UUID) -> bool:
        """Send a bulk operation's task (``django_reactor.bulk``); False when the broker
        refused it (the sweeper sends it again)."""
        queue = reactor_settings.CELERY_QUEUE
        database = this_database()
        options: dict[str, object] = {"queue": queue} if queue else {}
        if database is not None:
            options["headers"] = database_headers(database)
        return _send(tasks.bulk, str(operation_id), options, f"bulk operation {operation_id}")


def route_options(route: Route, scale: Callable[[int], int]) -> dict[str, object]:
    """``apply_async`` options for a run's route: its queue (else ``REACTOR["CELERY_QUEUE"]``,
    else Celery's default) and its priority on the broker's scale."""
    options: dict[str, object] = {"priority": scale(route.priority)}
    queue = route.queue or reactor_settings.CELERY_QUEUE
    if queue:
        options["queue"] = queue
    return options


def _send(task: Task, argument: object, options: dict[str, object], what: str) -> bool:
    """Publish one message; False when the broker refused it.

    The dispatch stays in the outbox, so the run is safe: one WARNING line says so, and the
    traceback (kombu's, chained through its retries) goes to DEBUG.
    """
    try:
        task.apply_async(args=[argument], **options)
    except Exception as exc:
        logger.warning(
            "could not publish the task for %s (%s: %s); the run is safe in the database and "
            "the sweeper will publish it again once the broker answers",
            what,
            type(exc).__name__,
            (str(exc).strip().splitlines() or [""])[0][:200],
        )
        logger.debug("publishing the task for %s failed", what, exc_info=True)
        return False
    return True
