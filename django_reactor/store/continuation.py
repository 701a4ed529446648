"""Writing a run's successor (continue-as-new) inside the transaction of its final checkpoint.

The checkpoint that completes a run whose last step returned ``ContinueAsNew`` calls
:func:`create_successor` before it commits: the successor's row, its ``start`` entry and its
dispatch commit with the predecessor's completion, or none of them do. A crash before the
commit leaves the predecessor where it was (its last step runs again when it is recovered,
and asks for a successor again); after it, the successor exists. The one-to-one
``continued_from`` refuses a second successor of the same run, and the successor's derived
idempotency key (``engine.continuation.successor_key``) a second run of the same generation.
"""

from __future__ import annotations

import datetime as dt
import uuid

from django.utils import timezone

from ..engine.continuation import SuccessorWrite, successor_key
from ..engine.journal import Event
from ..exceptions import ReactorError
from ..models import Dispatch, Execution
from ..states import EventKind, ExecutionStatus
from .db import using
from .executions import IdempotencyConflict, create_execution
from .rows import route_of_row


def create_successor(predecessor_id: uuid.UUID, successor: SuccessorWrite) -> None:
    """Insert ``successor``, the run ``predecessor_id`` continues as, pending with a task to
    start it on a worker (published when the caller's transaction commits). Its generation is
    one more than its predecessor's, its idempotency key derived from the predecessor's, its
    queue and priority the predecessor's."""
    predecessor = (
        Execution.objects.using(using())
        .only("id", "reactor", "idempotency_key", "generation", "queue", "priority")
        .get(pk=predecessor_id)
    )
    generation = predecessor.generation + 1
    key = successor_key(predecessor.idempotency_key, predecessor.generation)
    now = timezone.now()
    deadline_at = (
        now + dt.timedelta(seconds=successor.deadline_seconds)
        if successor.deadline_seconds is not None
        else None
    )
    start = Event(
        1,
        EventKind.START,
        now,
        data={"continued_from": str(predecessor_id), "generation": generation},
    )
    try:
        create_execution(
            execution_id=successor.execution_id,
            reactor=predecessor.reactor,
            definition_hash=successor.definition_hash,
            definition_shape=successor.definition_shape,
            version=successor.version,
            inputs=successor.inputs,
            secret_paths=successor.secret_paths,
            subject=successor.subject,
            has_secrets=successor.has_secrets,
            status=ExecutionStatus.PENDING,
            owner=None,
            dispatch=Dispatch.Reason.START,
            deadline_at=deadline_at,
            idempotency_key=key,
            cancel_keys=successor.cancel_keys,
            current_step=successor.first_step,
            attributes=successor.attributes,
            route=route_of_row(predecessor),
            events=[start],
            continued_from=predecessor_id,
            generation=generation,
        )
    except IdempotencyConflict as conflict:
        raise ReactorError(
            f"execution {predecessor_id} cannot continue as new: the idempotency key its "
            f"successor derives ({key!r}) is held by execution {conflict.execution_id} (its "
            "successor, written already, or a run started with that key by hand)"
        ) from None


def successor_of(execution_id: uuid.UUID) -> uuid.UUID | None:
    """The run ``execution_id`` continued as, if any."""
    return (
        Execution.objects.using(using())
        .filter(continued_from_id=execution_id)
        .values_list("id", flat=True)
        .first()
    )
