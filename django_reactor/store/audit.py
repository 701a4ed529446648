"""The steering history's rows (``AuditEntry``): written with the change they record, read back
for a run's page and the cancellation's trace entry, pruned past their retention.

:func:`write` joins the caller's transaction: the store functions that apply a steering action
(``claims.request_cancel``, ``claims.claim``, ``executions.start_now``, ``interrupts.claim``,
...) call it inside the transaction of the change, so the entry commits with the change or not
at all.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..engine.actors import Steering
from ..models import AuditEntry
from .db import using

#: The longest reactor name and target kept (the columns' length).
LONGEST = 255

#: At most this many entries are read back for one run (its page, its API detail).
RUN_HISTORY_LIMIT = 100


def write(steering: Steering, **detail: Any) -> AuditEntry:
    """Add ``steering`` (with ``detail`` besides its own) to the history, in the caller's
    transaction when there is one."""
    return AuditEntry.objects.using(using()).create(
        action=steering.action,
        execution_id=steering.execution_id,
        reactor=steering.reactor[:LONGEST],
        target=steering.target[:LONGEST],
        who=steering.actor.who,
        via=steering.actor.via,
        reason=steering.reason,
        detail={**steering.detail, **detail},
        at=timezone.now(),
    )


def record(steering: Steering, **detail: Any) -> AuditEntry:
    """:func:`write` in a transaction of its own (or the caller's), for an action whose change
    committed already."""
    with transaction.atomic(using=using()):
        return write(steering, **detail)


def cancel_requester(execution_id: uuid.UUID) -> dict[str, str]:
    """Who asked a live run to cancel (``by``, ``via``), for the ``cancel`` entry the run writes
    when it stops; empty when nobody is recorded (an internal request: a parent's rollback)."""
    entry = (
        AuditEntry.objects.using(using())
        .filter(execution_id=execution_id, action="cancel")
        .order_by("-at", "-id")
        .values("who", "via")
        .first()
    )
    return {"by": entry["who"], "via": entry["via"]} if entry else {}


def of_run(execution_id: uuid.UUID, limit: int = RUN_HISTORY_LIMIT) -> list[AuditEntry]:
    """The latest ``limit`` steering actions on the run, oldest first."""
    latest = list(
        AuditEntry.objects.using(using())
        .filter(execution_id=execution_id)
        .order_by("-at", "-id")[:limit]
    )
    return latest[::-1]


def prune_before(cutoff: dt.datetime, batch_size: int) -> int:
    """Delete the entries recorded before ``cutoff``, ``batch_size`` per transaction, oldest
    first; how many."""
    deleted = 0
    while True:
        with transaction.atomic(using=using()):
            ids = list(
                AuditEntry.objects.using(using())
                .filter(at__lt=cutoff)
                .order_by("at", "id")
                .values_list("id", flat=True)[:batch_size]
            )
            if not ids:
                return deleted
            count, _ = AuditEntry.objects.using(using()).filter(id__in=ids).delete()
        deleted += count
