"""Moving a run parked ``definition_changed`` onto the code's definition (``reactor_migrate``):
its step records (results, attempts, rollback state: its undo stack), interrupts and maps take
their new step names, the run takes the new definition and is handed to a worker again, all in
one transaction, recorded on its trace and in the steering history."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from ..engine.outcomes import ErrorKind
from ..models import (
    Definition,
    Dispatch,
    Execution,
    ExecutionEvent,
    Interrupt,
    MapRun,
    StepRecord,
)
from ..states import EventKind, ExecutionStatus
from . import audit
from .db import using
from .outbox import queue_dispatch
from .reads import last_seq
from .rows import route_of_row

if TYPE_CHECKING:
    from ..engine.actors import Steering


#: The parks a run is moved out of: its definition changed, or the code that took it had
#: removed the branch of a patch it is on (moved once the deployed code has it again).
MIGRATABLE = (ErrorKind.DEFINITION_CHANGED, ErrorKind.PATCH_REMOVED)

#: How many parked runs one call reads.
PARKED_READ = 10_000


def parked(reactor: str) -> list[Execution]:
    """The runs of ``reactor`` parked ``definition_changed`` or ``patch_removed``, oldest first
    (at most :data:`PARKED_READ`)."""
    return list(
        Execution.objects.using(using())
        .filter(
            reactor=reactor,
            status=ExecutionStatus.NEEDS_ATTENTION,
            failure__kind__in=MIGRATABLE,
        )
        .order_by("created_at", "id")[:PARKED_READ]
    )


def recorded_steps(execution_id: uuid.UUID) -> list[str]:
    """The steps a run recorded, in the order it recorded them."""
    return list(
        StepRecord.objects.using(using())
        .filter(execution_id=execution_id)
        .order_by("id")
        .values_list("step", flat=True)
    )


def move_to_definition(
    execution_id: uuid.UUID,
    *,
    parked_on: str,
    definition_hash: str,
    version: str,
    shape: dict[str, Any],
    renames: Mapping[str, str],
    current_step: str,
    steering: Steering,
) -> bool:
    """Move the parked run onto ``definition_hash`` and ``version`` (its ``shape`` kept if it
    was not), its
    records renamed by ``renames`` (old step name to new), and make it ``pending`` with a task
    for a worker. False, and nothing written, when the run is no longer parked on the
    definition ``parked_on`` (an operator moved or ended it meanwhile)."""
    now = timezone.now()
    with transaction.atomic(using=using()):
        runs = Execution.objects.using(using()).filter(pk=execution_id)
        row = (
            runs.select_for_update()
            .filter(status=ExecutionStatus.NEEDS_ATTENTION, definition_hash=parked_on)
            .first()
        )
        if row is None:
            return False
        Definition.objects.using(using()).bulk_create(
            [Definition(hash=definition_hash, shape=shape)], ignore_conflicts=True
        )
        for model in (StepRecord, Interrupt, MapRun):
            for old, new in renames.items():
                model.objects.using(using()).filter(execution_id=execution_id, step=old).update(
                    step=new
                )
        runs.update(
            definition_hash=definition_hash,
            version=version,
            status=ExecutionStatus.PENDING,
            failure=None,
            finished_at=None,
            current_step=current_step,
            lease_owner=None,
            lease_expires_at=None,
            wake_at=None,
            updated_at=now,
        )
        ExecutionEvent.objects.using(using()).create(
            execution_id=execution_id,
            seq=last_seq(execution_id) + 1,
            kind=EventKind.STEER,
            at=now,
            data={
                "action": steering.action,
                "from": parked_on,
                "to": definition_hash,
                **({"renamed": dict(renames)} if renames else {}),
                **steering.trace_data(),
            },
        )
        audit.write(steering)
        queue_dispatch(execution_id, Dispatch.Reason.START, route=route_of_row(row))
    return True
