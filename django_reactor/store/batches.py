"""Batches (``Meta.batch``): the run collecting a key's items, items joining it, and the items
known by idempotency key.

A batch is a ``scheduled`` run whose ``batch_key`` is set and whose inputs are
``{"items": [...]}``; ``batch_size`` counts them. Items join it under the key's lock
(:func:`collecting`), the run's row locked too, so a worker's claim (a conditional update of a
``scheduled`` row) either takes the batch before an item joins, and the item opens the next
batch, or after, with the item in its inputs. An item with an idempotency key is recorded in
``BatchItem`` in the same transaction: the key again is that item, whichever batch is open.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import transaction
from django.utils import timezone

from ..engine.flow import BATCH_INPUT
from ..engine.routing import Route
from ..models import BatchItem, Dispatch, Execution, ExecutionEvent, FlowKey
from ..states import EventKind, ExecutionStatus
from .db import using
from .executions import inputs_digest
from .flow import lock_key, prepare_key
from .outbox import queue_dispatch
from .reads import last_seq
from .secrets import Sealer

if TYPE_CHECKING:
    from ..engine.serialization import JSONMapping, JSONValue


@dataclass(frozen=True)
class OpenBatch:
    """The run collecting a key's items, as its locked row holds it."""

    execution_id: uuid.UUID
    size: int
    inputs: JSONValue
    start_at: dt.datetime | None
    queue: str
    priority: int


@contextlib.contextmanager
def collecting(reactor: str, key: str, max_size: int) -> Iterator[OpenBatch | None]:
    """A transaction holding the batch key's lock, with the key's open batch (a batch that
    has room and has not started), its row locked; None when there is none."""
    prepare_key(reactor, key, FlowKey.Kind.BATCH)
    with transaction.atomic(using=using()):
        lock_key(reactor, key, FlowKey.Kind.BATCH)
        row = (
            Execution.objects.using(using())
            .select_for_update()
            .filter(
                reactor=reactor,
                batch_key=key,
                status=ExecutionStatus.SCHEDULED,
                batch_size__lt=max_size,
            )
            .order_by("created_at", "id")
            .values_list("id", "batch_size", "inputs", "wake_at", "queue", "priority")
            .first()
        )
        yield None if row is None else OpenBatch(*row)


def item_of(reactor: str, idempotency_key: str) -> tuple[uuid.UUID, str] | None:
    """The run an item with ``idempotency_key`` joined, and the digest of the item's inputs."""
    return (
        BatchItem.objects.using(using())
        .filter(reactor=reactor, idempotency_key=idempotency_key)
        .values_list("execution_id", "inputs_digest")
        .first()
    )


def record_item(reactor: str, idempotency_key: str, digest: str, execution_id: uuid.UUID) -> None:
    """Record that the item with ``idempotency_key`` joined ``execution_id`` (in the batch's
    transaction). IntegrityError when the key joined a batch meanwhile: the caller's
    transaction is rolled back and the item joined nothing twice."""
    BatchItem.objects.using(using()).create(
        reactor=reactor,
        idempotency_key=idempotency_key,
        inputs_digest=digest,
        execution_id=execution_id,
    )


def add_item(
    batch: OpenBatch,
    item: JSONValue,
    *,
    secret_paths: Iterable[Iterable[str]],
    start_at: dt.datetime,
    data: JSONMapping,
) -> None:
    """Add ``item`` to the locked open ``batch``: the run's inputs take it last, with a
    ``batch`` entry (``data``) on its trace; the run starts at ``start_at`` (now, when the item
    filled it: a dispatch is queued for then)."""
    held = batch.inputs.get(BATCH_INPUT) if isinstance(batch.inputs, dict) else None
    items = held if isinstance(held, list) else []
    inputs: JSONValue = {BATCH_INPUT: [*items, item]}
    paths = [list(p) for p in secret_paths]
    if paths:  # the items in it are sealed already and stay as they are
        inputs = Sealer("").sealed(inputs, paths)
    runs = Execution.objects.using(using()).filter(pk=batch.execution_id)
    runs.update(
        inputs=inputs,
        inputs_digest=inputs_digest(inputs),
        batch_size=batch.size + 1,
        wake_at=start_at,
        updated_at=timezone.now(),
    )
    ExecutionEvent.objects.using(using()).create(
        execution_id=batch.execution_id,
        seq=last_seq(batch.execution_id) + 1,
        kind=EventKind.BATCH,
        at=timezone.now(),
        data=data,
    )
    if batch.start_at is None or start_at < batch.start_at:
        delay = max((start_at - timezone.now()).total_seconds(), 0.0)
        route = Route(batch.queue, batch.priority)
        queue_dispatch(batch.execution_id, Dispatch.Reason.START, delay, route=route)
