"""The Celery tasks. Their messages carry an execution id (or a map id) and nothing else; their
headers name the database the run was written to (:data:`DATABASE_HEADER`, see
``store.identity``) and, with OpenTelemetry installed, carry the publisher's trace context.

A worker configured with another database than the message's refuses it: an ERROR naming both
databases, and the message rejected (never run, never taken as done; the sweeper of the right
database publishes the work again). A message without the header (an older publisher) is taken
as before."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Reject

from .. import services
from ..conf import reactor_settings
from ..exceptions import WrongDatabase
from ..runtime import maps
from ..store import DatabaseMark, refresh_connections
from . import heartbeats  # noqa: F401  (workers' heartbeats: connects Celery's signals)

try:  # join the publisher's trace while the task runs, when OpenTelemetry is installed
    from ..otel import task_context
except ImportError:
    from contextlib import nullcontext as task_context  # type: ignore[assignment]

logger = logging.getLogger("django_reactor.celery")

#: The header naming the identity of the database a message's run was written to, and the one
#: naming that database for people (``NAME on HOST:PORT``).
DATABASE_HEADER = "django_reactor_database"
DATABASE_NAME_HEADER = "django_reactor_database_name"


def database_headers(mark: DatabaseMark) -> dict[str, str]:
    """The headers a message for a run written to the database ``mark`` carries."""
    return {DATABASE_HEADER: mark.identity, DATABASE_NAME_HEADER: mark.name}


def published_for(request: Any) -> DatabaseMark | None:
    """The database a task's message was published for (from its headers, which Celery gives
    as the request's ``headers`` or copies onto its attributes); None without one."""
    headers = getattr(request, "headers", None)

    def header(name: str) -> object:
        value = headers.get(name) if isinstance(headers, Mapping) else None
        return getattr(request, name, None) if value is None else value

    identity = header(DATABASE_HEADER)
    if not isinstance(identity, str) or not identity:
        return None
    name = header(DATABASE_NAME_HEADER)
    return DatabaseMark(identity, name if isinstance(name, str) and name else "(unnamed)")


@contextlib.contextmanager
def _refusing_other_databases() -> Iterator[None]:
    """A message for another database is logged at ERROR and rejected: not run, and not
    acknowledged as done (on a broker with dead-lettering, it goes there)."""
    try:
        yield
    except WrongDatabase as exc:
        logger.error("%s", exc)
        refused = "the message is for another database (see the ERROR before)"
        raise Reject(refused, requeue=False) from None


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
    with _task_connections(), task_context(self.request), _refusing_other_databases():
        services.resume(execution_id, published_for=published_for(self.request))


@shared_task(
    name="django_reactor.resume_many",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def resume_many(self: Task, execution_ids: list[str]) -> None:
    """``resume`` each run, one after the other (the sweeper's wake-ups come in batches),
    claiming several in one round trip (``services.resume_many``). A run that raises is logged
    and the others go on; a worker that dies leaves the rest to the sweeper, which publishes
    their dispatches again (the runs it had claimed, once their leases run out)."""
    with _task_connections(), task_context(self.request), _refusing_other_databases():
        services.resume_many(execution_ids, published_for=published_for(self.request))


@shared_task(
    name="django_reactor.map_elements",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def map_elements(self: Task, map_id: str) -> None:
    """Run pending elements of a fanned-out map, a chunk at a time, until none is left."""
    with _task_connections(), task_context(self.request), _refusing_other_databases():
        maps.work(map_id, forward=True, published_for=published_for(self.request))


@shared_task(
    name="django_reactor.map_rollback",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def map_rollback(self: Task, map_id: str) -> None:
    """Undo succeeded elements of a fanned-out map, highest index first, until none is left."""
    with _task_connections(), task_context(self.request), _refusing_other_databases():
        maps.work(map_id, forward=False, published_for=published_for(self.request))


@shared_task(
    name="django_reactor.bulk",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def bulk(self: Task, operation_id: str) -> None:
    """Work through a bulk operation's items (if no live process holds it) until none is
    left, it is stopped, or this worker stops (the sweeper hands the rest on)."""
    with _task_connections(), task_context(self.request), _refusing_other_databases():
        services.run_bulk(operation_id, published_for=published_for(self.request))


@shared_task(name="django_reactor.sweep", ignore_result=True)
def sweep(follow: bool = True) -> dict[str, Any]:
    """Republish lost work: unsent dispatches, runs whose worker died, due wake-ups.

    A sweep cut short by full batches queues the next sweep at once. A sweep with ``follow``
    (the beat's) that ends before the next wake-up or schedule tick, when that comes within
    ``SWEEP_INTERVAL``, queues one sweep for that time, which queues none for its own next
    (the beat's next tick does): the beat never gains more than one timed sweep per tick.
    """
    with _task_connections():
        report = services.sweep()
    interval = reactor_settings.SWEEP_INTERVAL
    pause = services.next_sweep_in(report, interval)
    if report.cut_short or (follow and pause < interval):
        options: dict[str, Any] = {"kwargs": {"follow": follow and report.cut_short}}
        if pause > 0:
            options["countdown"] = pause
        if reactor_settings.CELERY_QUEUE:
            options["queue"] = reactor_settings.CELERY_QUEUE
        try:
            sweep.apply_async(**options)
        except Exception:  # the beat's next tick sweeps anyway
            logger.warning("could not queue the next sweep", exc_info=True)
    return report.as_dict()
