"""Event rows and what they match: the waits that take them, the runs they cancel.

The only code that reads or writes :class:`~django_reactor.models.Event` and
:class:`~django_reactor.models.CancelSubscription` rows. An emit and a run reaching a
``wait_for_event`` step take turns on the event's key (``Dialect.lock_event_keys``: shared for
emits, exclusive for a wait) in the transactions that write their rows, and each reads after it
wrote: an emit sees every wait that began before it, and a wait's look back sees every event
emitted before it began. An event reaches a run as a message of its mailbox (kind ``event``,
idempotency key ``event:<event row id>``), taken as the step's payload exactly once.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..engine.journal import EventWaitWrite
from ..engine.serialization import encode
from ..exceptions import InvalidEvent
from ..models import CancelSubscription, Event, Interrupt, Message
from ..states import InterruptStatus, MessageKind
from .db import using
from .dialects import dialect
from .interrupts import MOVING, above

#: How many events emitted before a wait began its look back gives the run, the earliest first.
LOOKBACK_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Recorded:
    """An emit's row and what it matched: ``replay`` when the event id was kept before (with
    the same payload); ``waits`` (waiting interrupts) and ``cancels`` (runs in flight) when the
    event still has to be handled."""

    event: Event
    replay: bool = False
    waits: list[Interrupt] = field(default_factory=list)
    cancels: list[uuid.UUID] = field(default_factory=list)


def _keyed(name: str, key: str) -> str:
    return f"{name}\x1f{key}"


def _any_key(name: str) -> str:
    return f"{name}\x1e"


def _lock_keys(name: str, key: str | None) -> list[str]:
    return [_any_key(name)] + ([_keyed(name, key)] if key is not None else [])


def record(
    name: str,
    payload: Any,
    *,
    key: str | None,
    event_id: str,
    source: str = "",
    waits: bool = True,
    cancels: bool = True,
) -> Recorded:
    """Keep the event (``payload`` stored JSON) once per ``(name, event_id)`` and read what it
    matches (``waits``, ``cancels``: whether any reactor waits for or cancels on the name), in
    one transaction.

    A repeat of ``event_id`` with the same key and payload keeps nothing new (``replay``; its
    matches are read again if it was not handled yet); with another, InvalidEvent.
    """
    events = Event.objects.using(using())
    with transaction.atomic(using=using()):
        if waits or cancels:  # a wait's arrival and a run's subscription take turns with it
            dialect().lock_event_keys(_lock_keys(name, key), shared=True)
        # One statement whether the id is new or not (no savepoint): the row is read back.
        kept = Event(name=name, key=key, event_id=event_id, payload=payload, source=source)
        events.bulk_create([kept], ignore_conflicts=True)
        event = events.get(name=name, event_id=event_id)
        # Ours when it carries the time this insert gave it (auto_now_add, to the microsecond).
        replay = event.created_at != kept.created_at
        if replay:
            if event.key != key or encode(event.payload) != encode(payload):
                raise InvalidEvent(
                    f"event id {event_id!r} of {name!r} was first emitted with another key or "
                    "payload; an event id names one event: give a new one for another event"
                )
            if event.handled_at is not None:
                return Recorded(event, replay=True)
        return Recorded(
            event,
            replay,
            waits_for(event) if waits else [],
            cancels_for(event) if cancels else [],
        )


def waits_for(event: Event) -> list[Interrupt]:
    """The interrupts waiting for ``event``: a ``wait_for_event`` of its name that matches its
    key, or any key (by the index on name and key)."""
    matching = Q(event_key__isnull=True)
    if event.key is not None:
        matching |= Q(event_key=event.key)
    return list(
        Interrupt.objects.using(using())
        .filter(matching, event_name=event.name, status=InterruptStatus.WAITING)
        .order_by("id")
    )


def cancels_for(event: Event) -> list[uuid.UUID]:
    """The runs in flight that ``Meta.cancel_on`` subscribed to ``event``'s name and key."""
    if event.key is None:
        return []
    return list(
        CancelSubscription.objects.using(using())
        .filter(name=event.name, key=event.key, execution__status__in=MOVING)
        .order_by("execution_id")
        .values_list("execution_id", flat=True)
    )


def subscribe_cancels(execution_id: uuid.UUID, keys: Sequence[tuple[str, str]]) -> None:
    """Subscribe a run being started (in its transaction) to the events that cancel it."""
    dialect().lock_event_keys([_keyed(name, key) for name, key in keys], shared=False)
    CancelSubscription.objects.using(using()).bulk_create(
        [CancelSubscription(execution_id=execution_id, name=name, key=key) for name, key in keys]
    )


def fire(execution_id: uuid.UUID) -> None:
    """An event asked the run to stop while a live process had it in a step: it is rolled
    back once it has stopped (:func:`fired`)."""
    CancelSubscription.objects.using(using()).filter(
        execution_id=execution_id, fired_at__isnull=True
    ).update(fired_at=timezone.now())


def fired(limit: int) -> list[tuple[uuid.UUID, str]]:
    """Runs an event asked to stop that have not been rolled back yet, with their status."""
    return list(
        CancelSubscription.objects.using(using())
        .filter(fired_at__isnull=False)
        .order_by("execution_id")
        .values_list("execution_id", "execution__status")
        .distinct()[:limit]
    )


def unsubscribe(execution_id: uuid.UUID) -> None:
    """The run is cancelled (being rolled back) or ended: no event cancels it any more."""
    CancelSubscription.objects.using(using()).filter(execution_id=execution_id).delete()


def reach(execution_id: uuid.UUID, step: str, wait: EventWaitWrite) -> int:
    """A run reaches a ``wait_for_event`` (in the checkpoint's transaction, before its
    interrupt row is written): take the key, then give the run the events emitted since
    ``wait.since`` (at most LOOKBACK_LIMIT, the earliest first) as mailbox messages; how many.
    """
    dialect().lock_event_keys(
        [_keyed(wait.name, wait.key) if wait.key is not None else _any_key(wait.name)],
        shared=False,
    )
    events = Event.objects.using(using()).filter(name=wait.name, created_at__gte=wait.since)
    if wait.key is not None:
        events = events.filter(key=wait.key)
    earlier = list(events.order_by("id").values_list("id", "payload")[:LOOKBACK_LIMIT])
    if not earlier:
        return 0
    where = above(execution_id, step)
    Message.objects.using(using()).bulk_create(
        [
            Message(
                execution_id=where.top_id,
                kind=MessageKind.EVENT,
                topic=where.path,
                payload=payload,
                idempotency_key=message_key(event_pk),
            )
            for event_pk, payload in earlier
        ],
        ignore_conflicts=True,
    )
    return len(earlier)


def message_key(event_pk: int) -> str:
    """The idempotency key of the message that gives the event row ``event_pk`` to a run."""
    return f"event:{event_pk}"


def mark_handled(event: Event, errors: list[str] | None = None) -> None:
    """The event's waits, triggers and cancellations were seen to (``errors``: what could not
    be done, such as a trigger's inputs its reactor refused)."""
    with transaction.atomic(using=using()):
        # Durable with the next durable commit; lost in a crash, the event is handled again.
        dialect().commit_lazily()
        Event.objects.using(using()).filter(pk=event.pk, handled_at__isnull=True).update(
            handled_at=timezone.now(), errors=errors or None
        )


def unhandled(limit: int, *, older_than: float) -> list[Event]:
    """Events emitted more than ``older_than`` seconds ago and not handled: their emitter
    stopped before it saw to them (the sweeper's fallback)."""
    cutoff = timezone.now() - dt.timedelta(seconds=older_than)
    return list(
        Event.objects.using(using())
        .filter(handled_at__isnull=True, created_at__lt=cutoff)
        .order_by("id")[:limit]
    )


def prune_before(cutoff: dt.datetime, batch_size: int) -> int:
    """Delete the handled events emitted before ``cutoff``, ``batch_size`` per transaction;
    how many (with the runs ``reactor_prune`` deletes: a look back never reaches that far)."""
    deleted = 0
    while True:
        with transaction.atomic(using=using()):
            ids = list(
                Event.objects.using(using())
                .filter(created_at__lt=cutoff, handled_at__isnull=False)
                .order_by("id")
                .values_list("id", flat=True)[:batch_size]
            )
            if ids:
                Event.objects.using(using()).filter(id__in=ids).delete()
        deleted += len(ids)
        if len(ids) < batch_size:
            return deleted

