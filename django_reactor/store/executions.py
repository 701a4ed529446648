"""Creating runs and the writes on a run that need no owner: its trace entries, its
coordination bookkeeping, adopting a composed child, waking a parked parent."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from ..conf import reactor_settings
from ..engine.journal import Event
from ..engine.routing import DEFAULT_ROUTE, Route
from ..exceptions import AlreadyRetried
from ..models import (
    CancelSubscription,
    Definition,
    Dispatch,
    Execution,
    ExecutionAttribute,
    ExecutionEvent,
    StepRecord,
)
from ..states import EventKind, ExecutionStatus, StepStatus
from . import attributes as run_attributes
from . import audit, sql
from .db import using
from .dialects import dialect
from .events import subscribe_cancels
from .outbox import queue_dispatch
from .reads import find_child, find_retry, last_seq
from .rows import Owned, route_of_row
from .secrets import Sealer
from .sleeps import end_due_sleeps

if TYPE_CHECKING:
    from ..engine.actors import Steering
    from ..engine.serialization import JSONMapping, JSONObject, JSONValue


class ChildExists(Exception):
    """The parent step already has its composed child (started by an earlier attempt)."""


class IdempotencyConflict(Exception):
    """Another execution of the reactor already holds the idempotency key."""

    def __init__(self, execution_id: uuid.UUID) -> None:
        super().__init__(str(execution_id))
        self.execution_id = execution_id


@sql.again_unprepared
def create_execution(
    *,
    reactor: str,
    definition_hash: str,
    inputs: JSONValue,
    version: str = "",
    secret_paths: Iterable[Iterable[str]],
    status: str,
    owner: str | None,
    events: list[Event],
    idempotency_key: str | None = None,
    failure: JSONObject | None = None,
    retry_of: uuid.UUID | None = None,
    current_step: str = "",
    definition_shape: Mapping[str, object] | None = None,
    dispatch: str | None = None,
    parent: tuple[uuid.UUID, uuid.UUID, str] | None = None,
    detached: bool = False,
    wake_at: dt.datetime | None = None,
    deadline_at: dt.datetime | None = None,
    subject: str = "",
    has_secrets: bool = False,
    cancel_keys: Sequence[tuple[str, str]] = (),
    fork_step: str = "",
    steering: Steering | None = None,
    attributes: Mapping[str, str] | None = None,
    route: Route = DEFAULT_ROUTE,
    concurrency_key: str = "",
    cancel_reason: str = "",
    throttle_key: str = "",
    throttle_slot: dt.datetime | None = None,
    debounce_key: str = "",
    debounce_latest: dt.datetime | None = None,
    batch_key: str = "",
    hold_limit: int | None = None,
    execution_id: uuid.UUID | None = None,
    continued_from: uuid.UUID | None = None,
    generation: int = 0,
) -> Owned:
    """Insert a new execution with its first trace events (and a dispatch to a worker).

    ``version``: the reactor's ``Meta.version`` the run starts on (``""``: none declared).

    The values at ``secret_paths`` are stored sealed (with ``subject``'s key, when given; a
    run that ``has_secrets`` makes sure its subject has a key before it starts); the digest is
    of the inputs as given. Raises IdempotencyConflict (and writes nothing) when
    the key is taken. ``cancel_keys`` (event name, key) subscribe the run to the events that
    cancel it (``Meta.cancel_on``), in the same transaction, and so is ``steering`` (the
    operator's action that started it: a retry) recorded, naming the new run; ``attributes``
    (stored text by key: ``Meta.attributes``) are written with the run; ``route``: where its
    tasks go and how urgent they are; ``concurrency_key``: the key it holds (or waits for,
    ``queued``) under its reactor's ``Meta.concurrency``; ``cancel_reason``: why a run
    written ``cancelled`` never started; ``throttle_key`` and ``throttle_slot``: the key its
    start counts under (``Meta.throttle``) and the time it counts at; ``debounce_key`` and
    ``debounce_latest``: the key whose starts collapse into it while it waits, and its latest
    start (``Meta.debounce``); ``batch_key``: the key whose starts it collects as its items
    (``Meta.batch``: its inputs are its first item's); ``hold_limit``: the insert takes the
    room of ``concurrency_key`` (of that limit) itself, or raises KeyFull and writes nothing
    (only where ``dialect().holds_key_on_insert()``); ``execution_id``: the new run's id, when
    the caller chose it; ``continued_from`` and ``generation``: the run it continues as new and
    its place in that lineage (a second successor of a run is refused by the database).
    """
    now = timezone.now()
    digest = inputs_digest(inputs)
    paths = [list(p) for p in secret_paths]
    sealer = Sealer(subject)
    if subject and (paths or has_secrets):
        sealer.ready()
    if paths:
        inputs = sealer.sealed(inputs, paths)
    finished = status not in (
        ExecutionStatus.RUNNING,
        ExecutionStatus.PENDING,
        ExecutionStatus.SCHEDULED,
        ExecutionStatus.SUSPENDED,
        ExecutionStatus.QUEUED,
    )
    execution = Execution(
        **({"id": execution_id} if execution_id is not None else {}),
        reactor=reactor,
        definition_hash=definition_hash,
        version=version,
        status=status,
        inputs=inputs,
        inputs_digest=digest,
        secret_paths=paths,
        subject=subject,
        current_step=current_step,
        handed_off=dispatch is not None,
        idempotency_key=idempotency_key,
        failure=failure,
        retry_of_id=retry_of,
        fork_step=fork_step,
        continued_from_id=continued_from,
        generation=generation,
        parent_id=parent[0] if parent else None,
        root_id=parent[1] if parent else None,
        parent_step=parent[2] if parent else "",
        detached=detached,
        lease_owner=owner,
        lease_expires_at=(now + dt.timedelta(seconds=reactor_settings.LEASE_SECONDS))
        if owner
        else None,
        fence=1 if owner else 0,
        started_at=now if status == ExecutionStatus.RUNNING else None,
        finished_at=now if finished else None,
        wake_at=wake_at,
        deadline_at=deadline_at,
        queue=route.queue,
        priority=route.priority,
        concurrency_key=concurrency_key,
        cancel_reason=cancel_reason,
        throttle_key=throttle_key,
        throttle_slot=throttle_slot,
        debounce_key=debounce_key,
        debounce_latest=debounce_latest,
        batch_key=batch_key,
        batch_size=1 if batch_key else 0,
    )
    # A run that starts later is dispatched with a countdown when that is short enough;
    # otherwise the sweeper dispatches it at its wake-up time.
    delay = max((wake_at - now).total_seconds(), 0.0) if wake_at is not None else 0.0
    definition = (
        Definition(hash=definition_hash, shape=definition_shape) if definition_shape else None
    )
    try:
        together = bool(cancel_keys) or steering is not None
        with transaction.atomic(using=using()) if together else contextlib.nullcontext():
            dialect().insert_run(
                execution,
                new_event_rows(execution.id, events),
                dispatch,
                definition,
                delay,
                attributes or {},
                may_conflict=idempotency_key is not None
                or retry_of is not None
                or parent is not None
                or continued_from is not None,
                hold_limit=hold_limit,
            )
            if cancel_keys:
                subscribe_cancels(execution.id, cancel_keys)
            if steering is not None:
                audit.write(steering, new_execution_id=str(execution.id))
    except IntegrityError:
        if parent is not None and find_child(parent[0], parent[2]) is not None:
            raise ChildExists(parent[2]) from None
        if retry_of is not None and (retried_as := find_retry(retry_of)) is not None:
            raise AlreadyRetried(
                f"execution {retry_of} was already retried as {retried_as}; retry that one instead",
                retry_id=retried_as,
            ) from None
        if idempotency_key is None:
            raise
        holder = (
            Execution.objects.using(using())
            .filter(reactor=reactor, idempotency_key=idempotency_key)
            .values_list("id", flat=True)
            .first()
        )
        if holder is None:
            raise
        raise IdempotencyConflict(holder) from None
    return Owned(execution.id, execution.fence, route)


def collapse_start(
    execution_id: uuid.UUID,
    *,
    inputs: JSONValue,
    secret_paths: Iterable[Iterable[str]],
    subject: str,
    has_secrets: bool,
    attributes: Mapping[str, str],
    cancel_keys: Sequence[tuple[str, str]],
    wake_at: dt.datetime,
    data: JSONMapping,
) -> bool:
    """A debounced start collapses into the run waiting for its key (locked by the caller):
    the run takes the new ``inputs`` (sealed, its digest, subject, attributes and cancel
    subscriptions with them) and starts at ``wake_at`` instead; a ``debounce`` entry (``data``)
    says so, and a dispatch for the new time is queued. False, and nothing written, when the
    run has started meanwhile."""
    digest = inputs_digest(inputs)
    paths = [list(p) for p in secret_paths]
    sealer = Sealer(subject)
    if subject and (paths or has_secrets):
        sealer.ready()
    if paths:
        inputs = sealer.sealed(inputs, paths)
    runs = Execution.objects.using(using()).filter(pk=execution_id)
    row = runs.select_for_update().filter(status=ExecutionStatus.SCHEDULED).first()
    if row is None:
        return False
    runs.update(
        inputs=inputs,
        inputs_digest=digest,
        secret_paths=paths,
        subject=subject,
        wake_at=wake_at,
        updated_at=timezone.now(),
    )
    ExecutionAttribute.objects.using(using()).filter(execution_id=execution_id).delete()
    if attributes:
        run_attributes.write(execution_id, row.created_at, attributes)
    CancelSubscription.objects.using(using()).filter(execution_id=execution_id).delete()
    if cancel_keys:
        subscribe_cancels(execution_id, cancel_keys)
    ExecutionEvent.objects.using(using()).create(
        execution_id=execution_id,
        seq=last_seq(execution_id) + 1,
        kind=EventKind.DEBOUNCE,
        at=timezone.now(),
        data=data,
    )
    delay = max((wake_at - timezone.now()).total_seconds(), 0.0)
    queue_dispatch(execution_id, Dispatch.Reason.START, delay, route=route_of_row(row))
    return True


def inputs_digest(inputs: JSONValue) -> str:
    """A fingerprint of stored inputs (canonical JSON), to compare reuses of a key."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def new_event_rows(execution_id: uuid.UUID, events: Iterable[Event]) -> list[ExecutionEvent]:
    return [
        ExecutionEvent(
            execution_id=execution_id,
            seq=e.seq,
            kind=e.kind,
            step=e.step,
            attempt=e.attempt,
            at=e.at,
            duration_ms=e.duration_ms,
            data=e.data,
        )
        for e in events
    ]


def wake_parent(parent_id: uuid.UUID) -> None:
    """A unit finished: a parent parked waiting for it becomes due and gets a task.

    A composed child parks together with its parent, so the wake-up climbs to the execution a
    worker resumes (the root, or a detached unit).
    """
    row = (
        Execution.objects.using(using())
        .filter(pk=parent_id)
        .values("status", "parent_id", "detached")
        .first()
    )
    if row is None or row["status"] != ExecutionStatus.PENDING:
        return
    Execution.objects.using(using()).filter(pk=parent_id).update(wake_at=None)
    if row["parent_id"] is not None and not row["detached"]:
        wake_parent(row["parent_id"])
    else:
        queue_dispatch(parent_id, Dispatch.Reason.WAKE)


def wake_now(execution_id: uuid.UUID) -> bool:
    """Make a pending run that waits for its wake-up time (a retry's backoff, a park) due now;
    whether it was waiting. For tests, where time passes at once; a sleeping run (``sleep()``)
    is left asleep: its time is part of what a test checks (``end_sleep`` wakes it)."""
    sleeping = StepRecord.objects.using(using()).filter(
        execution_id=OuterRef("pk"), status=StepStatus.SLEEPING
    )
    return bool(
        Execution.objects.using(using())
        .filter(
            pk=execution_id,
            status=ExecutionStatus.PENDING,
            wake_at__isnull=False,
            lease_owner__isnull=True,
        )
        .exclude(Exists(sleeping))
        .update(wake_at=None)
    )


def start_now(execution_id: uuid.UUID, *, steering: Steering | None = None) -> bool:
    """A run that waits for a time (scheduled to start, or sleeping) is due now: a sleep ends
    now, a scheduled run starts now, and a task is queued for it. Whether it was waiting.

    ``steering`` (the operator's "wake now") goes on the trace as a ``steer`` entry and in the
    steering history, in the same transaction.
    """
    now = timezone.now()
    with transaction.atomic(using=using()):
        woken = (
            Execution.objects.using(using())
            .filter(
                pk=execution_id,
                status__in=[ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED],
                lease_owner__isnull=True,
            )
            .update(wake_at=now)
        )
        if not woken:
            return False
        if steering is not None:
            # The row is ours until the commit (the update locked it) and nobody owns the run:
            # the entry's sequence number cannot be taken by a checkpoint meanwhile.
            ExecutionEvent.objects.using(using()).create(
                execution_id=execution_id,
                seq=last_seq(execution_id) + 1,
                kind=EventKind.STEER,
                at=now,
                data={"action": steering.action, **steering.trace_data()},
            )
            audit.write(steering)
        StepRecord.objects.using(using()).filter(
            execution_id=execution_id, status=StepStatus.SLEEPING
        ).update(result=now.isoformat())
        end_due_sleeps([execution_id], now)
        queue_dispatch(execution_id, Dispatch.Reason.WAKE)
    return True


def adopt_child(execution_id: uuid.UUID, *, continuing: bool = False) -> Owned:
    """Take a composed child over for its parent's owner: bump its fence, so writes from a
    previous owner of the parent (a zombie) are refused.

    ``continuing``: the parent continues the child; a child paused at an interrupt (whose
    payload came) is running again.
    """
    with transaction.atomic(using=using()):
        Execution.objects.using(using()).filter(pk=execution_id).update(
            fence=F("fence") + 1, updated_at=timezone.now()
        )
        if continuing:
            Execution.objects.using(using()).filter(
                pk=execution_id, status=ExecutionStatus.PAUSED
            ).update(status=ExecutionStatus.RUNNING)
        fence = (
            Execution.objects.using(using()).filter(pk=execution_id).values_list("fence", flat=True)
        ).get()
    return Owned(execution_id, fence)


def append_event(
    execution_id: uuid.UUID, kind: str, data: JSONMapping, *, steering: Steering | None = None
) -> None:
    """Add an operator-level entry to a run's trace (not tied to an owner); with ``steering``,
    the entry says who, and the action goes in the steering history in the same transaction."""
    if steering is not None:
        data = {**data, **steering.trace_data()}
    with transaction.atomic(using=using()):
        # Lock the execution row so concurrent appends cannot pick the same sequence number.
        list(
            Execution.objects.using(using())
            .select_for_update()
            .filter(pk=execution_id)
            .values("pk")
        )
        last = last_seq(execution_id)
        ExecutionEvent.objects.using(using()).create(
            execution_id=execution_id, seq=last + 1, kind=kind, at=timezone.now(), data=data
        )
        if steering is not None:
            audit.write(steering)


def save_coordination_state(execution_id: uuid.UUID, state: dict[str, Any]) -> None:
    Execution.objects.using(using()).filter(pk=execution_id).update(coordination=state)


def wake_waiter(key: str) -> uuid.UUID | None:
    """Wake the longest-waiting run rescheduled for coordination ``key`` (released just now).

    The run goes on at once instead of at its wake-up time; if it loses the race again it is
    rescheduled again. One run: a released lock (or slot) lets one more through.
    """
    with transaction.atomic(using=using()):
        waiting = (
            Execution.objects.using(using())
            .filter(
                status=ExecutionStatus.PENDING,
                lease_owner__isnull=True,
                wake_at__isnull=False,
                coordination__waiting=key,
            )
            .order_by("updated_at")
        )
        if connections[using()].features.has_select_for_update_skip_locked:
            waiting = waiting.select_for_update(skip_locked=True)
        found = waiting.values_list("id", flat=True).first()
        if found is None:
            return None
        Execution.objects.using(using()).filter(pk=found).update(wake_at=None)
        queue_dispatch(found, Dispatch.Reason.WAKE)
    return found
