"""Concurrency keys in the database: admitting runs of a key up to its limit, queueing the rest
in arrival order, and admitting them as runs of the key end (``engine.flow``).

Every decision takes the key's lock (an advisory lock on PostgreSQL, its ``FlowKey`` row
elsewhere) and counts the key's runs in flight
from the runs themselves (``Execution.concurrency_key``, statuses in :data:`HOLDING`), in the
same transaction: two starts never both take the last slot, and a process that dies holds its
slot exactly as long as its run stays in flight (until the run is recovered and ends), with
no counter to drift.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from django.db import connections, transaction
from django.db.models import Count, Min, Q
from django.utils import timezone

from ..engine.routing import Route
from ..models import Dispatch, Execution, ExecutionEvent, FlowKey
from ..states import IN_FLIGHT_STATUSES, EventKind, ExecutionStatus
from . import sql
from .db import using
from .dialects import dialect
from .outbox import QueuedDispatch, publish_on_commit
from .reads import last_seq

#: Statuses of a run that holds its key's slot: created and not ended (nor queued).
HOLDING = IN_FLIGHT_STATUSES

#: How many keys with queued runs one look reads (the sweeper's backstop).
WAITING_READ = 1_000


@dataclass(frozen=True)
class KeyState:
    """A key as an admission saw it, under its lock: the runs holding it (oldest first) and
    whether runs are queued for it."""

    holders: list[uuid.UUID]
    queued: bool

    def has_room(self, limit: int) -> bool:
        """A new run may start now: a slot is free and nobody queued before it."""
        return len(self.holders) < limit and not self.queued


#: A run's insert found its concurrency key without room (``holds_on_insert``).
KeyFull = sql.KeyFull


def holds_on_insert() -> bool:
    """Whether a run's insert can take its concurrency key's room itself, in its own statement
    (``create_execution(hold_limit=...)``, raising :data:`KeyFull` when there is none): on
    PostgreSQL, outside a caller's transaction."""
    return dialect().holds_key_on_insert()


def prepare_key(reactor: str, key: str, kind: str = FlowKey.Kind.CONCURRENCY) -> None:
    """Before the transaction that takes the key's lock: what the lock needs (its row, on
    databases without advisory locks)."""
    dialect().prepare_flow_key(reactor, kind, key)


def lock_key(reactor: str, key: str, kind: str = FlowKey.Kind.CONCURRENCY) -> None:
    """Take the key's lock until the current transaction ends (an advisory lock on
    PostgreSQL, the key's ``FlowKey`` row elsewhere)."""
    dialect().lock_flow_key(reactor, kind, key)


@dataclass(frozen=True)
class Seen:
    """A new run's keys as their locks found them: its concurrency key's state, and its
    throttle key's latest start slots, newest first (None: the run has no such key)."""

    concurrency: KeyState | None = None
    throttle_slots: list[dt.datetime] | None = None
    # The run waiting for the new run's debounce key (its id and latest start), locked.
    debounced: tuple[uuid.UUID, dt.datetime | None] | None = None


@contextlib.contextmanager
def deciding(
    reactor: str,
    *,
    concurrency_key: str = "",
    throttle_key: str = "",
    throttle_limit: int = 0,
    debounce_key: str = "",
) -> Iterator[Seen]:
    """A transaction holding the new run's key locks (always in one order: debounce,
    concurrency, throttle; so two starts never wait for each other's), with what they found,
    for deciding on the run and writing it in it; no transaction for a run without keys."""
    if not concurrency_key and not throttle_key and not debounce_key:
        yield Seen()
        return
    for kind, key in (
        (FlowKey.Kind.DEBOUNCE, debounce_key),
        (FlowKey.Kind.CONCURRENCY, concurrency_key),
        (FlowKey.Kind.THROTTLE, throttle_key),
    ):
        if key:
            prepare_key(reactor, key, kind)
    with transaction.atomic(using=using()):
        state = slots = debounced = None
        if debounce_key:
            lock_key(reactor, debounce_key, FlowKey.Kind.DEBOUNCE)
            debounced = (
                Execution.objects.using(using())
                .select_for_update()
                .filter(
                    reactor=reactor, debounce_key=debounce_key, status=ExecutionStatus.SCHEDULED
                )
                .order_by("created_at")
                .values_list("id", "debounce_latest")
                .first()
            )
        if concurrency_key:
            lock_key(reactor, concurrency_key)
            state = key_state(reactor, concurrency_key)
        if throttle_key:
            lock_key(reactor, throttle_key, FlowKey.Kind.THROTTLE)
            slots = [
                slot
                for slot in Execution.objects.using(using())
                .filter(reactor=reactor, throttle_key=throttle_key, throttle_slot__isnull=False)
                .order_by("-throttle_slot")
                .values_list("throttle_slot", flat=True)[:throttle_limit]
                if slot is not None
            ]
        yield Seen(state, slots, debounced)


def key_state(reactor: str, key: str) -> KeyState:
    """The key's holders and whether runs are queued for it, in one statement; call under
    :func:`lock_key`."""
    runs = Execution.objects.using(using()).filter(reactor=reactor, concurrency_key=key)
    holding = runs.filter(status__in=HOLDING).values_list("id", "created_at", "status")
    first_queued = runs.filter(status=ExecutionStatus.QUEUED).values_list(
        "id", "created_at", "status"
    )[:1]
    if connections[using()].features.supports_slicing_ordering_in_compound:
        rows = list(holding.union(first_queued, all=True))
    else:  # SQLite: no LIMIT inside a UNION
        rows = [*holding, *first_queued]
    holders = [
        run for run, _, status in sorted(rows, key=lambda r: (r[1], r[0])) if status in HOLDING
    ]
    return KeyState(holders, len(holders) < len(rows))


def admit_queued(reactor: str, key: str, limit: int) -> list[uuid.UUID]:
    """Admit the key's queued runs, oldest first, into its free slots: each becomes ``pending``
    with a dispatch (published after the commit) and an ``admit`` entry. Returns their ids."""
    with transaction.atomic(using=using()):
        lock_key(reactor, key)
        runs = Execution.objects.using(using()).filter(reactor=reactor, concurrency_key=key)
        free = limit - runs.filter(status__in=HOLDING).count()
        if free <= 0:
            return []
        waiting = list(
            runs.filter(status=ExecutionStatus.QUEUED)
            .order_by("created_at", "id")
            .values_list("id", "queue", "priority")[:free]
        )
        if not waiting:
            return []
        ids = [run for run, _, _ in waiting]
        now = timezone.now()
        runs.filter(pk__in=ids, status=ExecutionStatus.QUEUED).update(
            status=ExecutionStatus.PENDING, handed_off=True, updated_at=now
        )
        ExecutionEvent.objects.using(using()).bulk_create(
            [
                ExecutionEvent(
                    execution_id=run,
                    seq=last_seq(run) + 1,
                    kind=EventKind.ADMIT,
                    at=now,
                    data={"key": key, "limit": limit},
                )
                for run in ids
            ]
        )
        rows = Dispatch.objects.using(using()).bulk_create(
            [Dispatch(execution_id=run, reason=Dispatch.Reason.ADMIT) for run in ids]
        )
        routes = {run: Route(queue, priority) for run, queue, priority in waiting}
        publish_on_commit(
            [
                QueuedDispatch(row.id, row.execution_id, route=routes[row.execution_id])
                for row in rows
            ]
        )
    return ids


def waiting_keys(limit: int = WAITING_READ) -> list[tuple[str, str]]:
    """The (reactor, key) pairs with queued runs, the one whose oldest run waits longest first
    (at most ``limit`` keys, however deep each one's queue)."""
    return [
        (row["reactor"], row["concurrency_key"])
        for row in Execution.objects.using(using())
        .filter(status=ExecutionStatus.QUEUED)
        .values("reactor", "concurrency_key")
        .annotate(oldest=Min("created_at"))
        .order_by("oldest")[:limit]
    ]


def has_queued(reactor: str, key: str) -> bool:
    """Whether runs are queued for the key (read without its lock: see
    ``services.flow.ended`` for why that is enough). Every run of a key asks as it ends."""
    return dialect().key_has_queued(reactor, key)


@dataclass(frozen=True)
class KeyFigures:
    """One concurrency key as the coordination page shows it."""

    reactor: str
    key: str
    in_flight: int
    queued: int


def key_figures(reactors: Sequence[str] = (), limit: int = 200) -> list[KeyFigures]:
    """Keys with runs in flight or queued (of ``reactors``, or all), the most queued first."""
    runs = Execution.objects.using(using()).exclude(concurrency_key="")
    if reactors:
        runs = runs.filter(reactor__in=reactors)
    rows = (
        runs.filter(status__in=[*HOLDING, ExecutionStatus.QUEUED])
        .values("reactor", "concurrency_key")
        .annotate(
            in_flight=Count("id", filter=Q(status__in=HOLDING)),
            queued=Count("id", filter=Q(status=ExecutionStatus.QUEUED)),
        )
        .order_by("-queued", "-in_flight", "reactor", "concurrency_key")[:limit]
    )
    return [
        KeyFigures(r["reactor"], r["concurrency_key"], r["in_flight"], r["queued"]) for r in rows
    ]


def position(reactor: str, key: str, created_at: object) -> tuple[int, int]:
    """A queued run's place: the key's runs in flight, and the runs queued before it."""
    runs = Execution.objects.using(using()).filter(reactor=reactor, concurrency_key=key)
    return (
        runs.filter(status__in=HOLDING).count(),
        runs.filter(status=ExecutionStatus.QUEUED, created_at__lt=created_at).count(),
    )


@dataclass(frozen=True)
class DelayedKey:
    """A throttle, debounce or batch key with runs waiting to start: how many, and the first
    start."""

    reactor: str
    kind: str
    key: str
    waiting: int
    next_start: dt.datetime | None


def delayed_keys(limit: int = 200) -> list[DelayedKey]:
    """Throttle keys with runs delayed past now, debounce keys with a run waiting for its key
    to be quiet, and batch keys with a run collecting items, the soonest start first."""
    scheduled = Execution.objects.using(using()).filter(status=ExecutionStatus.SCHEDULED)
    # A throttled run waits until its slot; a debounced or batched one until its wake-up.
    waiting = (
        (FlowKey.Kind.THROTTLE, "throttle_key", "throttle_slot"),
        (FlowKey.Kind.DEBOUNCE, "debounce_key", "wake_at"),
        (FlowKey.Kind.BATCH, "batch_key", "wake_at"),
    )
    found: list[DelayedKey] = []
    for kind, column, start in waiting:
        runs = scheduled.exclude(**{column: ""})
        if kind == FlowKey.Kind.THROTTLE:
            runs = runs.filter(throttle_slot__gt=timezone.now())
        rows = (
            runs.values_list("reactor", column)
            .annotate(waiting=Count("id"), next_start=Min(start))
            .order_by("next_start")[:limit]
        )
        found.extend(DelayedKey(reactor, kind, key, n, first) for reactor, key, n, first in rows)
    found.sort(key=lambda k: (k.next_start is None, k.next_start or timezone.now()))
    return found[:limit]
