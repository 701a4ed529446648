"""Bulk operations' rows: created with their items (the runs chosen once), taken by one
process at a time under a lease the heartbeat keeps, worked through a batch of items at a
time, stopped, and handed to a worker again by the sweeper when the process that held one
stopped."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from ..conf import reactor_settings
from ..engine.actors import Steering
from ..models import BulkItem, BulkOperation, BulkStatus, Execution, ItemStatus
from . import audit
from .db import using
from .lease import Kept
from .outbox import publish_operation_on_commit

#: Items written per statement while an operation is created.
INSERT_BATCH = 5000


def create_operation(
    *,
    action: str,
    run_filter: dict[str, Any],
    parameters: dict[str, Any],
    steering: Steering,
    runs: Iterable[Sequence[uuid.UUID]],
    publish: bool,
) -> BulkOperation:
    """Write an operation and one item per run of ``runs`` (batches of run ids), with its
    entry in the steering history (``steering``: who, why), in one transaction; with
    ``publish``, its task goes to a worker once it commits."""
    with transaction.atomic(using=using()):
        operation = BulkOperation.objects.using(using()).create(
            action=action,
            run_filter=run_filter,
            parameters=parameters,
            reason=steering.reason,
            created_by=steering.actor.who,
            created_via=steering.actor.via,
        )
        total = 0
        for ids in runs:
            BulkItem.objects.using(using()).bulk_create(
                [BulkItem(operation=operation, execution_id=i) for i in ids],
                batch_size=INSERT_BATCH,
            )
            total += len(ids)
        operation.total = total
        if not total:
            operation.status = BulkStatus.DONE
            operation.finished_at = timezone.now()
        operation.save(update_fields=["total", "status", "finished_at"])
        audit.write(
            replace(steering, target=f"bulk operation {operation.id}"),
            operation=str(operation.id),
            action=action,
            filter=run_filter,
            total=total,
        )
        if publish and total:
            publish_operation_on_commit(operation.id)
    return operation


def get_operation(operation_id: uuid.UUID) -> BulkOperation | None:
    return BulkOperation.objects.using(using()).filter(pk=operation_id).first()


def take(operation_id: uuid.UUID, owner: str) -> BulkOperation | None:
    """Take an operation to work on (pending, or running with its holder gone); None when it
    is finished, stopped or held by a live process."""
    now = timezone.now()
    lease = dt.timedelta(seconds=reactor_settings.LEASE_SECONDS)
    taken = (
        BulkOperation.objects.using(using())
        .filter(pk=operation_id, status__in=[BulkStatus.PENDING, BulkStatus.RUNNING])
        .filter(Q(lease_owner__isnull=True) | Q(lease_expires_at__lt=now) | Q(lease_owner=owner))
        .update(
            status=BulkStatus.RUNNING,
            lease_owner=owner,
            lease_expires_at=now + lease,
        )
    )
    if not taken:
        return None
    BulkOperation.objects.using(using()).filter(pk=operation_id, started_at__isnull=True).update(
        started_at=now
    )
    return get_operation(operation_id)


class OperationKeeper(Kept):
    """Keeps extending an operation's lease while a process works on it."""

    def __init__(self, operation_id: uuid.UUID, owner: str) -> None:
        self.operation_id = operation_id
        self.owner = owner
        self.lease_seconds = reactor_settings.LEASE_SECONDS
        super().__init__()

    @property
    def label(self) -> str:
        return f"bulk operation {self.operation_id}"

    def extend(self) -> bool:
        return bool(
            BulkOperation.objects.using(using())
            .filter(pk=self.operation_id, lease_owner=self.owner, status=BulkStatus.RUNNING)
            .update(lease_expires_at=timezone.now() + dt.timedelta(seconds=self.lease_seconds))
        )


def pending_items(operation_id: uuid.UUID, limit: int) -> list[BulkItem]:
    """The next items to take care of, in the order they were chosen."""
    return list(
        BulkItem.objects.using(using())
        .filter(operation_id=operation_id, status=ItemStatus.PENDING)
        .order_by("id")[:limit]
    )


def record_item(item: BulkItem, status: str, note: str) -> None:
    """What the operation did to one run, counted on the operation in the same transaction."""
    now = timezone.now()
    counters: dict[str, str] = {ItemStatus.DONE: "done", ItemStatus.SKIPPED: "skipped"}
    counter = counters.get(status, "failed")
    with transaction.atomic(using=using()):
        updated = (
            BulkItem.objects.using(using())
            .filter(pk=item.pk, status=ItemStatus.PENDING)
            .update(status=status, note=note[:2000], updated_at=now)
        )
        if updated:
            BulkOperation.objects.using(using()).filter(pk=item.operation_id).update(
                **{counter: F(counter) + 1}
            )


def still_held(operation_id: uuid.UUID, owner: str) -> bool:
    """Whether the operation is still this process's to work on (not stopped, not taken)."""
    return (
        BulkOperation.objects.using(using())
        .filter(pk=operation_id, lease_owner=owner, status=BulkStatus.RUNNING)
        .exists()
    )


def finish(operation_id: uuid.UUID, owner: str) -> bool:
    """Mark the operation done once no item is pending; False when some are (or it is not
    this process's any more)."""
    with transaction.atomic(using=using()):
        if (
            BulkItem.objects.using(using())
            .filter(operation_id=operation_id, status=ItemStatus.PENDING)
            .exists()
        ):
            return False
        return bool(
            BulkOperation.objects.using(using())
            .filter(pk=operation_id, lease_owner=owner, status=BulkStatus.RUNNING)
            .update(
                status=BulkStatus.DONE,
                lease_owner=None,
                lease_expires_at=None,
                finished_at=timezone.now(),
            )
        )


def release(operation_id: uuid.UUID, owner: str) -> None:
    """Give the operation back (this process stops early): the sweeper hands it on."""
    BulkOperation.objects.using(using()).filter(pk=operation_id, lease_owner=owner).update(
        lease_owner=None, lease_expires_at=None
    )


def stop(operation_id: uuid.UUID, steering: Steering) -> bool:
    """Stop an operation: the items not taken care of yet are left alone (the one in hand
    finishes), recorded in the steering history. False when it had finished."""
    with transaction.atomic(using=using()):
        stopped = bool(
            BulkOperation.objects.using(using())
            .filter(pk=operation_id, status__in=[BulkStatus.PENDING, BulkStatus.RUNNING])
            .update(status=BulkStatus.STOPPED, finished_at=timezone.now())
        )
        if stopped:
            audit.write(
                replace(steering, target=f"bulk operation {operation_id}"),
                operation=str(operation_id),
            )
    return stopped


def republish(operation_ids: Sequence[uuid.UUID]) -> None:
    """Hand operations to a worker again (the sweeper's)."""
    for operation_id in operation_ids:
        publish_operation_on_commit(operation_id)


def stalled(now: dt.datetime, redispatch_after: float, limit: int) -> list[uuid.UUID]:
    """Operations no live process holds: pending ones not taken within ``redispatch_after``
    seconds (their message was lost), running ones whose holder's lease expired."""
    waited = now - dt.timedelta(seconds=redispatch_after)
    return list(
        BulkOperation.objects.using(using())
        .filter(status__in=[BulkStatus.PENDING, BulkStatus.RUNNING])
        .filter(
            Q(status=BulkStatus.PENDING, created_at__lt=waited, lease_owner__isnull=True)
            | Q(status=BulkStatus.RUNNING, lease_owner__isnull=True)
            | Q(lease_expires_at__lt=now)
        )
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )


def items_of(operation_id: uuid.UUID) -> QuerySet[BulkItem]:
    return BulkItem.objects.using(using()).filter(operation_id=operation_id)


def operations(limit: int = 50) -> list[BulkOperation]:
    """The most recent operations first."""
    return list(BulkOperation.objects.using(using()).order_by("-created_at")[:limit])


def matching_ids(runs: QuerySet[Execution], batch: int = INSERT_BATCH) -> Iterable[list[uuid.UUID]]:
    """The ids of ``runs`` in batches, oldest first (a keyset walk: no offset, no count)."""
    after: tuple[dt.datetime, uuid.UUID] | None = None
    while True:
        page = runs.order_by("created_at", "id")
        if after is not None:
            page = page.filter(Q(created_at__gt=after[0]) | Q(created_at=after[0], id__gt=after[1]))
        rows = list(page.values_list("created_at", "id")[:batch])
        if not rows:
            return
        yield [row[1] for row in rows]
        after = rows[-1]
