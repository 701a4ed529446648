"""The outbox: dispatches written with the state change that needs them, and the port through
which they are published.

A dispatch is a ``Dispatch`` row ("a task must resume run X", or run map Y's elements) written
in the transaction that makes it necessary; after that transaction commits, the registered
:class:`Publisher` sends it. The worker that takes the task marks the row sent in the statement
of its claim (so the caller writes nothing after its commit); the sweeper publishes again, once,
a row nobody took within a sweep interval of its due time (a crash between the commit and the
publish, a lost message), and marks it sent. The store knows nothing of Celery: the Celery
bridge registers its publisher when Django starts (``AppConfig.ready``), and the test helpers
register one that captures the tasks.

The same port carries the other after-commit signal of the store: an async unit finished, so
whoever waits for it (a Redis pub/sub channel) may look now (:func:`on_finished`).
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from ..conf import reactor_settings
from ..engine import probes
from ..engine.routing import DEFAULT_ROUTE, Route
from ..models import Dispatch, Execution
from . import sql
from .db import logger, using


@dataclass(frozen=True, slots=True)
class QueuedDispatch:
    """An outbox row to publish: the run to resume, and how long to wait first."""

    dispatch_id: int
    execution_id: uuid.UUID
    countdown: float = 0.0
    # "resume" for the run itself; "map" / "map_undo" run or undo elements of map ``map_id``.
    task: str = "resume"
    map_id: uuid.UUID | None = None
    # Where the task goes and how urgent it is; None: the run's stored route, read by
    # :func:`publish` (one query for all the dispatches that lack it).
    route: Route | None = None


class Publisher(Protocol):
    """Sends queued dispatches to the workers (the Celery bridge's ``CeleryPublisher``)."""

    def publish(self, dispatches: Sequence[QueuedDispatch]) -> list[int]:
        """Send each dispatch; return the ids of those sent (the rest stay for the sweeper)."""
        ...


@dataclass(slots=True)
class _Registration:
    publisher: Publisher | None = None
    after_commit: bool = True


_registered = _Registration()
_finished: list[Callable[[uuid.UUID, str], None]] = []
_progress: list[Callable[[uuid.UUID], None]] = []


def register_publisher(
    publisher: Publisher | None, *, after_commit: bool = True
) -> tuple[Publisher | None, bool]:
    """Make ``publisher`` the one that sends dispatches; return the previous registration.

    ``after_commit=False`` hands dispatches over as they are queued instead of after the
    transaction commits (for tests wrapped in a transaction, whose commit never comes).
    """
    previous = (_registered.publisher, _registered.after_commit)
    _registered.publisher, _registered.after_commit = publisher, after_commit
    return previous


def queue_dispatch(
    execution_id: uuid.UUID, reason: str, delay: float = 0.0, *, route: Route | None = None
) -> None:
    """Write an outbox row for a task resuming the run; it is published after the commit.

    Call inside the transaction that makes the task necessary. Delays longer than
    ``RETRY_COUNTDOWN_LIMIT`` are not published with a countdown: the run's wake-up time is
    stored instead and the sweeper dispatches it when due. ``route``: the run's, when the
    caller knows it (else read when published).
    """
    if delay > reactor_settings.RETRY_COUNTDOWN_LIMIT:
        return
    not_before = timezone.now() + dt.timedelta(seconds=delay) if delay > 0 else None
    row = Dispatch.objects.using(using()).create(
        execution_id=execution_id, reason=reason, not_before=not_before
    )
    publish_on_commit([QueuedDispatch(row.id, execution_id, delay, route=route)])


def publish_on_commit(dispatches: Sequence[QueuedDispatch], *, mark: bool = False) -> None:
    """Publish after the current transaction commits (at once outside a transaction).

    A failure to publish is logged and left to the sweeper, which republishes unsent rows.
    ``mark``: the rows the publisher sent are marked sent now, not when a worker takes them
    (the sweeper's wake-ups: a backlog bigger than the workers take within a sweep interval
    is not published again; a lost message is woken again after ``REDISPATCH_AFTER``).
    """
    if not dispatches:
        return

    def send() -> None:
        sent = publish(dispatches)
        if mark:
            mark_sent(sent)

    if not _registered.after_commit:
        send()
        return
    transaction.on_commit(send, using=using(), robust=True)


def publish(dispatches: Sequence[QueuedDispatch]) -> list[int]:
    """Send ``dispatches`` through the registered publisher now, each with its run's route,
    most urgent first; return the ids sent.

    The rows are marked sent by the worker that takes them (or by the sweeper, with
    :func:`mark_sent`, when it publishes them again).
    """
    if probes.active is not None:
        probes.active("before_publish", "")
    publisher = _registered.publisher
    if publisher is None:
        logger.warning(
            "no task publisher is registered (is Celery installed, and is django_reactor in "
            "INSTALLED_APPS?): %d dispatch(es) stay in the outbox for the sweeper",
            len(dispatches),
        )
        return []
    return publisher.publish(routed(dispatches))


def routed(dispatches: Sequence[QueuedDispatch]) -> list[QueuedDispatch]:
    """``dispatches`` each with its run's route (those without one read in one query), the
    highest priority first and, within a priority, in the order given."""
    missing = {d.execution_id for d in dispatches if d.route is None}
    routes: dict[uuid.UUID, Route] = {}
    if missing:
        try:
            routes = {
                pk: Route(queue, priority)
                for pk, queue, priority in Execution.objects.using(using())
                .filter(pk__in=missing)
                .values_list("pk", "queue", "priority")
            }
        except DatabaseError:
            # Sent to no queue rather than the wrong one: they stay in the outbox, and the
            # sweeper publishes them again once the database answers.
            logger.warning(
                "could not read the queues of %d run(s) to publish their tasks; they stay in "
                "the outbox for the sweeper",
                len(missing),
            )
            return [d for d in dispatches if d.route is not None]
    complete = [
        d if d.route is not None else replace(d, route=routes.get(d.execution_id, DEFAULT_ROUTE))
        for d in dispatches
    ]
    complete.sort(key=lambda d: -(d.route or DEFAULT_ROUTE).priority)
    return complete


def publish_operation_on_commit(operation_id: uuid.UUID) -> None:
    """Send a bulk operation's task once the current transaction commits, through the
    registered publisher's ``publish_operation`` (a publisher without one, or a refusal,
    leaves it to the sweeper, which hands operations nobody took to a worker again)."""

    def send() -> None:
        send_operation = getattr(_registered.publisher, "publish_operation", None)
        if send_operation is None:
            logger.warning(
                "no task publisher takes bulk operations (is Celery installed?): operation %s "
                "waits for the sweeper or reactor_bulk --continue",
                operation_id,
            )
            return
        send_operation(operation_id)

    if not _registered.after_commit:
        send()
        return
    transaction.on_commit(send, using=using(), robust=True)


def mark_taken(*, execution_id: uuid.UUID | None = None, map_id: uuid.UUID | None = None) -> None:
    """A task took its work: the run's (or the map's) unsent dispatches are sent, and the
    sweeper leaves them. On PostgreSQL the claims do this in their own statement
    (``claim_sql.CLAIM_FOR_WORKER``, ``sql.CLAIM_CHUNK``)."""
    unsent = Dispatch.objects.using(using()).filter(sent_at__isnull=True)
    if map_id is not None:
        unsent = unsent.filter(map_run_id=map_id)
    elif execution_id is not None:
        unsent = unsent.filter(execution_id=execution_id, map_run__isnull=True)
    else:
        raise TypeError("mark_taken() needs the execution_id or the map_id whose task ran")
    unsent.update(sent_at=timezone.now())


def mark_sent(dispatch_ids: Sequence[int]) -> None:
    """Record that these dispatches went out (the sweeper's republish, its wake-ups)."""
    if not dispatch_ids:
        return
    connection = connections[using()]
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(
            sql.MARK_SENT.format(ids=", ".join(["%s"] * len(dispatch_ids))),
            [now, *dispatch_ids],
        )


def on_finished(listener: Callable[[uuid.UUID, str], None]) -> None:
    """Call ``listener(execution_id, status)`` after an async unit's final commit (once per
    listener, however often it is registered)."""
    if listener not in _finished:
        _finished.append(listener)


def on_progress(listener: Callable[[uuid.UUID], None]) -> None:
    """Call ``listener(execution_id)`` after a commit that someone following the run wants
    at once (a step published values, the run paused)."""
    if listener not in _progress:
        _progress.append(listener)


def announce_progress(execution_id: uuid.UUID) -> None:
    """Tell the progress listeners about the run once the transaction commits."""
    for listener in list(_progress):
        transaction.on_commit(functools.partial(listener, execution_id), using=using(), robust=True)


def announce_finished(execution_id: uuid.UUID, status: str) -> None:
    """Tell the listeners, once the transaction recording it commits, that a unit finished."""
    for listener in list(_finished):
        transaction.on_commit(
            functools.partial(listener, execution_id, status), using=using(), robust=True
        )
