"""Operators' pauses: the ``Pause`` rows of reactors and runs, runs suspended and released.

A pause is a row; what it does is read where a run moves on: a checkpoint (the executor then
stops at that step boundary), a worker's claim (the worker suspends the run instead of running
it) and an inline start (the run is stored, not started). A run nobody runs (waiting for a
worker, a wake-up, a retry's backoff) is suspended at once by a pause of its own; a pause of a
reactor reaches such runs when they would move. Only root runs are paused: a composed child or
an async unit goes on with (or for) its parent.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from ..engine.actors import Steering
from ..engine.journal import Event, StopRequest
from ..engine.serialization import JSONValue
from ..exceptions import ExecutionNotFound, InvalidTransition
from ..models import Dispatch, Execution, ExecutionEvent, Pause
from ..states import EventKind, ExecutionStatus
from . import audit
from .db import using
from .outbox import QueuedDispatch, publish_on_commit, queue_dispatch
from .reads import last_seq

#: What a run of a paused reactor or a paused run says it waits for, when the pause gave no
#: reason.
NO_REASON = "paused by an operator"


def pause_request(stored: Any) -> StopRequest | None:
    """The engine's request to pause, from the ``[reason, paused_by, of the reactor]`` a claim
    or a checkpoint read (``sql.PAUSE_OF_RUN``), or None."""
    if not stored:
        return None
    reason, by, of_reactor = stored
    data: dict[str, JSONValue] = {}
    if by:
        data["by"] = by
    if of_reactor:
        data["reactor_paused"] = True
    return StopRequest("pause", reason or NO_REASON, data)


def pause_for(
    reactor: str, execution_id: uuid.UUID, *, parent_id: object = None
) -> StopRequest | None:
    """The pause that applies to a run of ``reactor`` (its own first, else its reactor's), as
    the engine's request, or None. A child run (``parent_id``) is never paused."""
    if parent_id is not None:
        return None
    rows = list(
        Pause.objects.using(using())
        .filter(Q(reactor=reactor) & (Q(execution__isnull=True) | Q(execution_id=execution_id)))
        .values_list("execution_id", "reason", "paused_by")
    )
    if not rows:
        return None
    rows.sort(key=lambda row: row[0] is None)  # the run's own pause first
    run, reason, by = rows[0]
    return pause_request([reason, by, run is None])


def suspended_at_start(pause: Pause, seq: int) -> Event:
    """The trace entry of a run of a paused reactor stored without starting."""
    data: dict[str, JSONValue] = {"reason": pause.reason or NO_REASON, "reactor_paused": True}
    if pause.paused_by:
        data["by"] = pause.paused_by
    return Event(seq, EventKind.SUSPEND, timezone.now(), data=data)


def reactor_pause(reactor: str) -> Pause | None:
    """The pause of ``reactor`` (every run of it), or None."""
    return Pause.objects.using(using()).filter(reactor=reactor, execution__isnull=True).first()


def run_pause(execution_id: uuid.UUID) -> Pause | None:
    """The pause of one run, or None."""
    return Pause.objects.using(using()).filter(execution_id=execution_id).first()


def paused_reactors() -> list[Pause]:
    """The reactors paused as a whole, the most recent pause first."""
    return list(Pause.objects.using(using()).filter(execution__isnull=True))


def paused_runs(limit: int = 100) -> list[Pause]:
    """Runs paused one by one (not ended), the most recent pause first."""
    return list(
        Pause.objects.using(using())
        .filter(execution__isnull=False)
        .exclude(execution__status__in=_ENDED)
        .select_related("execution")[:limit]
    )


_ENDED = [
    ExecutionStatus.COMPLETED,
    ExecutionStatus.FAILED,
    ExecutionStatus.HALTED,
    ExecutionStatus.CANCELLED,
]


def _event(execution_id: uuid.UUID, kind: str, now: dt.datetime, data: dict[str, object]) -> None:
    ExecutionEvent.objects.using(using()).create(
        execution_id=execution_id, seq=last_seq(execution_id) + 1, kind=kind, at=now, data=data
    )


def pause_run(
    execution_id: uuid.UUID, *, steering: Steering, suspendable: Iterable[str]
) -> tuple[str, bool]:
    """Pause one run: keep its pause, and suspend it at once when nobody runs it and it is in
    ``suspendable`` (waiting for a worker, a wake-up or a retry's backoff, or running with its
    process gone). Returns the status it had and whether it was paused already.

    A run a live process is running, or that waits at an interrupt, stops at its next step
    boundary. Raises InvalidTransition for a run that ended, rolls back, or is a child.
    """
    now = timezone.now()
    suspendable = list(suspendable)
    with transaction.atomic(using=using()):
        row = Execution.objects.using(using()).select_for_update().filter(pk=execution_id).first()
        if row is None:
            raise ExecutionNotFound(f"no execution with id {execution_id}")
        previous = row.status
        if row.status in _ENDED or row.status in (
            ExecutionStatus.ROLLING_BACK,
            ExecutionStatus.ABORTED,
            ExecutionStatus.NEEDS_ATTENTION,
        ):
            raise InvalidTransition(
                f"cannot pause execution {execution_id}: it is {row.status}; only runs that "
                "will go on can be paused (pending, scheduled, running, paused at an "
                "interrupt)",
                status=row.status,
            )
        try:
            with transaction.atomic(using=using()):
                Pause.objects.using(using()).create(
                    reactor=row.reactor,
                    execution_id=row.id,
                    reason=steering.reason,
                    paused_by=steering.actor.who,
                )
        except IntegrityError:
            return previous, True
        live = row.lease_owner is not None and (
            row.lease_expires_at is not None and row.lease_expires_at >= now
        )
        suspended = not live and row.status in suspendable
        if suspended:
            _suspend_row(row, now, steering.trace_data())
        audit.write(steering, previous_status=previous, suspended=suspended)
    return previous, False


def _suspend_row(row: Execution, now: dt.datetime, said: dict[str, str]) -> None:
    """Suspend a run nobody runs (its row locked): it keeps its cursor and its wake-up time;
    ``said``: who paused it and why, for its trace entry."""
    Execution.objects.using(using()).filter(pk=row.id).update(
        status=ExecutionStatus.SUSPENDED,
        lease_owner=None,
        lease_expires_at=None,
        fence=F("fence") + 1,
        updated_at=now,
    )
    Dispatch.objects.using(using()).filter(execution_id=row.id, sent_at__isnull=True).delete()
    data: dict[str, object] = {
        **said,
        "reason": said.get("reason") or NO_REASON,
        "previous_status": row.status,
    }
    _event(row.id, EventKind.SUSPEND, now, data)


def pause_reactor(reactor: str, *, steering: Steering) -> tuple[Pause, bool]:
    """Pause every run of ``reactor``: returns the pause and whether it is new (recorded in
    the steering history with it). Runs stop at their next step boundary; new ones are stored
    and not started."""
    try:
        with transaction.atomic(using=using()):
            created = Pause.objects.using(using()).create(
                reactor=reactor, reason=steering.reason, paused_by=steering.actor.who
            )
            audit.write(steering)
            return created, True
    except IntegrityError:
        existing = reactor_pause(reactor)
        if existing is None:  # unpaused in between: pause again
            return pause_reactor(reactor, steering=steering)
        return existing, False


def unpause_run(execution_id: uuid.UUID, *, steering: Steering | None) -> tuple[bool, bool]:
    """Take a run's own pause away and release it if it is suspended (its reactor not
    paused): a worker takes it now, or at its wake-up time. Returns (it had a pause, it was
    released). ``steering`` (None for the system's own release of a fork) is recorded when
    anything changed."""
    now = timezone.now()
    with transaction.atomic(using=using()):
        row = Execution.objects.using(using()).select_for_update().filter(pk=execution_id).first()
        if row is None:
            raise ExecutionNotFound(f"no execution with id {execution_id}")
        had, _ = Pause.objects.using(using()).filter(execution_id=row.id).delete()
        released = row.status == ExecutionStatus.SUSPENDED and reactor_pause(row.reactor) is None
        said = steering.trace_data() if steering is not None else {}
        if released:
            _release(row.id, row.wake_at, now, said=said, at=None)
        if steering is not None and (had or released):
            audit.write(steering, released=released)
    return bool(had), released


def _release(
    execution_id: uuid.UUID,
    wake_at: dt.datetime | None,
    now: dt.datetime,
    *,
    said: dict[str, str],
    at: dt.datetime | None,
) -> None:
    """A suspended run (row locked) becomes pending: dispatched now, or woken by the sweeper
    at ``at`` (its place in a release at a bounded rate) or its own wake-up time, the later."""
    due = max((t for t in (wake_at, at) if t is not None), default=None)
    if due is not None and due <= now:
        due = None
    Execution.objects.using(using()).filter(pk=execution_id).update(
        status=ExecutionStatus.PENDING, wake_at=due if due is not None else wake_at, updated_at=now
    )
    data: dict[str, object] = dict(said)
    if due is not None:
        data["wake_at"] = due.isoformat()
    _event(execution_id, EventKind.UNPAUSE, now, data)
    if due is None:
        queue_dispatch(execution_id, Dispatch.Reason.UNPAUSE)


def unpause_reactor(
    reactor: str, *, steering: Steering, rate: float, batch: int = 500
) -> tuple[bool, int]:
    """Take ``reactor``'s pause away (recorded in the steering history with it) and release
    its suspended runs (those without a pause of their own), oldest first, at most ``rate`` a
    second: the first second's worth now, the others at wake-up times the sweeper keeps.
    Returns (it was paused, runs released)."""
    with transaction.atomic(using=using()):
        deleted, _ = (
            Pause.objects.using(using()).filter(reactor=reactor, execution__isnull=True).delete()
        )
        if deleted:
            audit.write(steering)
    said = steering.trace_data()
    now = timezone.now()
    own = Pause.objects.using(using()).filter(execution_id=OuterRef("pk"))
    suspended = (
        Execution.objects.using(using())
        .filter(reactor=reactor, status=ExecutionStatus.SUSPENDED, parent__isnull=True)
        .exclude(Exists(own))
    )
    released = 0
    per_second = max(1.0, float(rate))
    while True:
        with transaction.atomic(using=using()):
            rows = list(
                suspended.select_for_update(skip_locked=True)
                .order_by("created_at", "id")
                .values_list("id", "wake_at")[:batch]
            )
            if not rows:
                break
            queued: list[QueuedDispatch] = []
            for execution_id, wake_at in rows:
                at = now + dt.timedelta(seconds=int(released / per_second))
                if at <= now and (wake_at is None or wake_at <= now):
                    # Due now: published with the batch (one statement for the dispatches).
                    Execution.objects.using(using()).filter(pk=execution_id).update(
                        status=ExecutionStatus.PENDING, updated_at=now
                    )
                    _event(execution_id, EventKind.UNPAUSE, now, dict(said))
                    row = Dispatch.objects.using(using()).create(
                        execution_id=execution_id, reason=Dispatch.Reason.UNPAUSE
                    )
                    queued.append(QueuedDispatch(row.id, execution_id))
                else:
                    _release(execution_id, wake_at, now, said=said, at=at)
                released += 1
            publish_on_commit(queued)
    return bool(deleted), released


def forget_run_pause(execution_id: uuid.UUID) -> None:
    """Drop a run's own pause (it was cancelled, undone or forked: it will not go on)."""
    Pause.objects.using(using()).filter(execution_id=execution_id).delete()


def suspended_count(reactor: str, cap: int = 10_000) -> int:
    """How many runs of ``reactor`` are suspended (counted up to ``cap``)."""
    ids = (
        Execution.objects.using(using())
        .filter(reactor=reactor, status=ExecutionStatus.SUSPENDED)
        .values_list("id", flat=True)[:cap]
    )
    return len(list(ids))
