"""Batches (``Meta.batch``): a start of a batched reactor joins its key's open batch.

Every start of a batched reactor (the runs its ``Meta.triggers`` start on events, ``run()``,
``run_in_background()``, the API, a schedule's fire) validates its inputs with the reactor's
``Inputs`` and adds them, as one item, to the run collecting its key's items; it opens one when
none is open. The run receives the items as its input ``items`` and starts once it holds
``max_size`` of them, or ``max_wait`` after its first. Each call returns that run
(``Scheduled``, with when it starts). A start with an idempotency key (an event's trigger has
one per event) is one item however often it is repeated, even after its batch started.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError
from django.utils import timezone

from .. import store
from ..engine.executor import utcnow
from ..engine.flow import BATCH_INPUT
from ..engine.journal import Event
from ..engine.outcomes import Outcome, Scheduled
from ..engine.routing import Route
from ..engine.serialization import decode
from ..exceptions import IdempotencyKeyReused, InvalidTime
from ..states import EventKind, ExecutionStatus
from . import flow
from .health import format_duration
from .timing import Timing

if TYPE_CHECKING:
    from ..engine.definition import ReactorDefinition
    from ..engine.serialization import JSONMapping


def add(
    definition: ReactorDefinition,
    item: Any,
    *,
    idempotency_key: str | None,
    timing: Timing,
    route: Route,
) -> Outcome:
    """Add the validated, stored inputs ``item`` to its key's open batch (opening one when
    none is open); the batch's run as a ``Scheduled`` outcome, or, for an idempotency key seen
    before, the run it joined (``idempotent_replay``; IdempotencyKeyReused when the key came
    with other inputs). InvalidTime for a start time: a batch starts when it is full or due."""
    declared = definition.batch
    assert declared is not None
    name = definition.reactor_class.__qualname__
    if timing.start_at is not None:
        raise InvalidTime(
            f"{name} collects its starts in batches (Meta.batch): a batch starts when it holds "
            f"{declared.max_size} items or {format_duration(declared.max_wait_seconds)} "
            "after its first, so a start takes no at= or delay="
        )
    key = flow.key_of(declared, definition, decode(item))
    digest = store.inputs_digest(item)
    if idempotency_key is not None:
        known = store.batches.item_of(definition.name, idempotency_key)
        if known is not None:
            return _joined_before(definition, idempotency_key, digest, *known)
    try:
        with store.batches.collecting(definition.name, key, declared.max_size) as batch:
            now = timezone.now()
            full = (0 if batch is None else batch.size) + 1 >= declared.max_size
            start_at = (
                now
                if full
                else now + dt.timedelta(seconds=declared.max_wait_seconds)
                if batch is None or batch.start_at is None
                else batch.start_at
            )
            size = 1 if batch is None else batch.size + 1
            data: JSONMapping = {
                "key": key,
                "size": size,
                "max_size": declared.max_size,
                "start_at": start_at.isoformat(),
                **({"idempotency_key": idempotency_key} if idempotency_key else {}),
            }
            if batch is None:
                run_id = _open(definition, item, key, start_at, timing, route, data)
            else:
                store.batches.add_item(
                    batch,
                    item,
                    secret_paths=definition.input_secret_paths,
                    start_at=start_at,
                    data=data,
                )
                run_id = batch.execution_id
            if idempotency_key is not None:
                store.batches.record_item(definition.name, idempotency_key, digest, run_id)
    except IntegrityError:
        # The same key joined a batch meanwhile (another process, another batch key): this
        # transaction is rolled back, so the item joined nothing here.
        known = store.batches.item_of(definition.name, idempotency_key) if idempotency_key else None
        if known is None:
            raise
        return _joined_before(definition, idempotency_key or "", digest, *known)
    return Scheduled(execution_id=run_id, start_at=start_at)


def _open(
    definition: ReactorDefinition,
    item: Any,
    key: str,
    start_at: dt.datetime,
    timing: Timing,
    route: Route,
    data: JSONMapping,
) -> Any:
    """A new batch for ``key`` with ``item``, started at ``start_at`` by a worker."""
    first = definition.next_ready(frozenset())
    owned = store.create_execution(
        reactor=definition.name,
        definition_hash=definition.definition_hash,
        version=definition.version,
        definition_shape=definition.shape,
        inputs={BATCH_INPUT: [item]},
        secret_paths=definition.input_secret_paths,
        status=ExecutionStatus.SCHEDULED,
        owner=None,
        dispatch="start",
        wake_at=start_at,
        deadline_at=timing.deadline_at,
        current_step=first.name if first is not None else "",
        route=route,
        batch_key=key,
        events=[
            Event(1, EventKind.START, utcnow(), data={}),
            Event(2, EventKind.BATCH, utcnow(), data=data),
        ],
    )
    return owned.execution_id


def _joined_before(
    definition: ReactorDefinition, idempotency_key: str, digest: str, run_id: Any, first: str
) -> Outcome:
    if first != digest:
        raise IdempotencyKeyReused(
            f"idempotency key {idempotency_key!r} was first used for an item of execution "
            f"{run_id} of {definition.reactor_class.__qualname__} (Meta.batch) with different "
            "inputs; use a new key for a different request",
            execution_id=run_id,
        )
    return store.outcome_of(store.get_row(run_id), replay=True)
