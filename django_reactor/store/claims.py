"""Taking a run: a worker's claim, an operation's claim (undo, fail), taking a run back after a
broken connection, asking a live owner to cancel, and parking a run for a person.

Every claim is a conditional UPDATE that bumps the run's fence, so a previous owner's later
writes are refused.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from ..conf import reactor_settings
from ..exceptions import ExecutionBusy, ExecutionNotFound, InvalidTransition, LeaseLost
from ..models import Definition, Execution, ExecutionEvent
from ..states import MOVING_STATUSES, EventKind, ExecutionStatus
from . import audit
from .db import using
from .dialects import dialect
from .executions import wake_parent
from .interrupts import close_waiting
from .outbox import queue_dispatch
from .reads import get_row, last_seq
from .rows import Owned, WorkerClaim

if TYPE_CHECKING:
    from ..engine.actors import Steering

RESUMABLE = MOVING_STATUSES  # what a worker may take over
#: The longest a run handed back again and again waits between two tries (seconds).
HAND_BACK_MAX = 60.0


def claim_for_worker(execution_id: uuid.UUID, owner: str) -> WorkerClaim | None:
    """Take a run nobody owns (pending, or running with an expired lease) for a worker.

    One conditional UPDATE: it bumps the fence, counts a recovery when the previous owner died
    mid-run, and keeps a rolling-back run rolling back. Returns None when the run is finished,
    owned by a live process (a duplicate delivery) or not due yet (a retry's wake-up time).
    The same ``owner`` may claim again (a claim whose reply a broken connection lost).
    """
    return dialect().claim_for_worker(execution_id, owner)


def claim_ahead(execution_ids: Sequence[uuid.UUID], owner: str) -> dict[uuid.UUID, WorkerClaim]:
    """Take several runs at once for a worker that will run them one after the other (a batch
    of wake-ups), each as ``claim_for_worker`` takes one, in one round trip where the database
    allows: the claims made, by run. A run not claimed (not claimable, locked by another
    transaction, or on a database that claims each run on its turn) is left for
    ``claim_for_worker`` on its turn. The caller keeps the leases of the runs waiting for
    their turn (``HeldLeases``)."""
    return dialect().claim_ahead(execution_ids, owner)


def refence(owned: Owned, owner: str) -> Owned | None:
    """Take a run this process owns again, under a new fence, after its connection broke.

    A checkpoint sent on the broken connection may still be running on the server; it carries
    the old fence, so once this commits it either committed first (this waits for its row
    lock, then sees its writes) or writes nothing. None when the run is no longer this
    process's (that checkpoint released it, or another process took it over).
    """
    now = timezone.now()
    with transaction.atomic(using=using()):
        updated = (
            Execution.objects.using(using())
            .filter(pk=owned.execution_id, fence=owned.fence, lease_owner=owner)
            .update(
                fence=F("fence") + 1,
                lease_expires_at=now + dt.timedelta(seconds=reactor_settings.LEASE_SECONDS),
                updated_at=now,
            )
        )
        if not updated:
            return None
        fence = (
            Execution.objects.using(using())
            .filter(pk=owned.execution_id)
            .values_list("fence", flat=True)
            .get()
        )
    return Owned(owned.execution_id, fence)


def park_for_attention(
    owned: Owned, *, failure: dict[str, Any], event_kind: str, data: dict[str, Any]
) -> None:
    """End an owned run as needs_attention with ``failure``, releasing it; nothing else runs."""
    end_owned(
        owned,
        status=ExecutionStatus.NEEDS_ATTENTION,
        failure=failure,
        event_kind=event_kind,
        data=data,
    )


def end_owned(
    owned: Owned, *, status: str, failure: dict[str, Any], event_kind: str, data: dict[str, Any]
) -> None:
    """End an owned run as ``status`` with ``failure`` and a trace entry, releasing it;
    nothing else runs. A failed run's waiting interrupts close (a needs-attention run's stay
    for the person who looks at it)."""
    now = timezone.now()
    with transaction.atomic(using=using()):
        updated = (
            Execution.objects.using(using())
            .filter(pk=owned.execution_id, fence=owned.fence)
            .update(
                status=status,
                failure=failure,
                lease_owner=None,
                lease_expires_at=None,
                finished_at=now,
                updated_at=now,
            )
        )
        if not updated:
            raise LeaseLost(f"execution {owned.execution_id} was taken over by another process")
        if status == ExecutionStatus.FAILED:
            close_waiting(owned.execution_id, stop_children=True)
        ExecutionEvent.objects.using(using()).create(
            execution_id=owned.execution_id,
            seq=last_seq(owned.execution_id) + 1,
            kind=event_kind,
            at=now,
            data=data,
        )
        parent = (
            Execution.objects.using(using())
            .filter(pk=owned.execution_id, detached=True)
            .values_list("parent_id", flat=True)
            .first()
        )
        if parent is not None:  # an async unit: its reader stops waiting
            wake_parent(parent)


def claim(
    execution_id: uuid.UUID,
    *,
    allowed: Iterable[str],
    new_status: str,
    owner: str,
    action: str,
    steering: Steering | None = None,
) -> Owned:
    """Take ownership of a run that is in one of ``allowed`` and not owned by a live lease.

    The conditional UPDATE bumps the fence, so any previous owner's later writes are refused.
    Raises InvalidTransition (wrong status) or ExecutionBusy (live lease). ``steering`` (an
    operator's undo) is recorded in the steering history with the claim.
    """
    allowed = list(allowed)
    now = timezone.now()
    with transaction.atomic(using=using()):
        updated = (
            Execution.objects.using(using())
            .filter(pk=execution_id, status__in=allowed)
            .filter(Q(lease_owner__isnull=True) | Q(lease_expires_at__lt=now))
            .update(
                status=new_status,
                lease_owner=owner,
                lease_expires_at=now + dt.timedelta(seconds=reactor_settings.LEASE_SECONDS),
                fence=F("fence") + 1,
                updated_at=now,
                finished_at=None,
            )
        )
        if updated:
            fence = (
                Execution.objects.using(using())
                .filter(pk=execution_id)
                .values_list("fence", flat=True)
                .get()
            )
            if new_status in (ExecutionStatus.ROLLING_BACK, ExecutionStatus.CANCELLED):
                close_waiting(execution_id, stop_children=new_status == ExecutionStatus.CANCELLED)
            if steering is not None:
                audit.write(steering)
            return Owned(execution_id, fence)
    row = get_row(execution_id)
    if row.status not in allowed:
        raise InvalidTransition(
            f"cannot {action} execution {execution_id}: it is {row.status}; "
            f"{action} works on {', '.join(sorted(allowed))} runs",
            status=row.status,
        )
    raise ExecutionBusy(
        f"cannot {action} execution {execution_id}: {row.lease_owner} is working on it "
        f"(lease until {row.lease_expires_at:%Y-%m-%d %H:%M:%S %Z}); try again when it stops"
    )


def roll_back_on_worker(
    execution_id: uuid.UUID,
    *,
    reason: str,
    allowed: Iterable[str],
    data: dict[str, Any],
    steering: Steering | None = None,
) -> bool:
    """Cancel a run that no live process owns and have a worker roll it back (the rollback
    rule: completed steps undone, newest first), in one transaction: its status becomes
    ``rolling_back`` (fence moved on), its waits close, the trace gets a ``cancel`` entry with
    ``data`` (and who, with ``steering``, recorded in the steering history too) and the
    worker's task is queued. False (nothing changed) when the run is not in ``allowed`` or a
    live process owns it.
    """
    now = timezone.now()
    with transaction.atomic(using=using()):
        updated = (
            Execution.objects.using(using())
            .filter(pk=execution_id, status__in=list(allowed))
            .filter(Q(lease_owner__isnull=True) | Q(lease_expires_at__lt=now))
            .update(
                status=ExecutionStatus.ROLLING_BACK,
                lease_owner=None,
                lease_expires_at=None,
                fence=F("fence") + 1,
                cancel_requested_at=now,
                cancel_reason=reason,
                finished_at=None,
                wake_at=None,
                updated_at=now,
            )
        )
        if not updated:
            return False
        close_waiting(execution_id)
        ExecutionEvent.objects.using(using()).create(
            execution_id=execution_id,
            seq=last_seq(execution_id) + 1,
            kind=EventKind.CANCEL,
            at=now,
            data={
                **(steering.trace_data() if steering is not None else {}),
                "reason": reason,
                "rollback": True,
                **data,
            },
        )
        if steering is not None:
            audit.write(steering, rollback=True)
        queue_dispatch(execution_id, "rollback")
    return True


def request_cancel(
    execution_id: uuid.UUID,
    *,
    reason: str,
    cancellable: Iterable[str],
    steering: Steering | None = None,
) -> str:
    """Cancel a run without rollback. Returns the status the run had.

    An unowned run in ``cancellable`` becomes cancelled at once; a running run owned by a live
    process gets a cancel request that its executor honours after the current step (a second
    request changes nothing). ``steering``: who asked, on the ``cancel`` entry and in the
    steering history, written with the change (for a request, the run's own ``cancel`` entry
    names who from the history: ``audit.cancel_requester``).
    """
    now = timezone.now()
    cancellable = list(cancellable)
    with transaction.atomic(using=using()):
        row = Execution.objects.using(using()).select_for_update().filter(pk=execution_id).first()
        if row is None:
            raise ExecutionNotFound(f"no execution with id {execution_id}")
        previous = row.status
        live = row.lease_owner is not None and (
            row.lease_expires_at is not None and row.lease_expires_at >= now
        )
        if row.status == ExecutionStatus.ROLLING_BACK and live:
            raise ExecutionBusy(
                f"cannot cancel execution {execution_id}: {row.lease_owner} is rolling it back; "
                "let the rollback finish"
            )
        if row.status == ExecutionStatus.RUNNING and live:
            if row.cancel_requested_at is None:
                row.cancel_requested_at = now
                row.cancel_reason = reason
                row.save(update_fields=["cancel_requested_at", "cancel_reason", "updated_at"])
                if steering is not None:
                    audit.write(steering, previous_status=previous, requested=True)
            return previous
        if row.status not in cancellable:
            raise InvalidTransition(
                f"cannot cancel execution {execution_id}: it is {row.status}; cancel works on "
                f"{', '.join(sorted(cancellable))} runs",
                status=row.status,
            )
        row.status = ExecutionStatus.CANCELLED
        row.cancel_requested_at = now
        row.cancel_reason = reason
        row.finished_at = now
        row.lease_owner = None
        row.lease_expires_at = None
        row.fence = row.fence + 1
        row.save()
        close_waiting(execution_id, stop_children=True)
        last = last_seq(execution_id)
        ExecutionEvent.objects.using(using()).create(
            execution_id=execution_id,
            seq=last + 1,
            kind=EventKind.CANCEL,
            at=now,
            data={
                **(steering.trace_data() if steering is not None else {}),
                "reason": reason,
                "previous_status": previous,
            },
        )
        if steering is not None:
            audit.write(steering, previous_status=previous)
    return previous


def adopt_definition(owned: Owned, definition_hash: str, shape: dict[str, Any]) -> None:
    """An owned run goes on under ``definition_hash`` (the code's, newer than the one it
    started under; its recorded steps checked against it): from now on it is checked against
    that definition, whose ``shape`` is kept if it was not. Without this, the steps it records
    under the new code (a step the deploy added, re-wired or renamed) would be checked against
    the old definition the next time a worker takes it, and park it. LeaseLost when the run
    moved on under another owner."""
    with transaction.atomic(using=using()):
        Definition.objects.using(using()).bulk_create(
            [Definition(hash=definition_hash, shape=shape)], ignore_conflicts=True
        )
        updated = (
            Execution.objects.using(using())
            .filter(pk=owned.execution_id, fence=owned.fence)
            .update(definition_hash=definition_hash)
        )
        if not updated:
            raise LeaseLost(f"execution {owned.execution_id} was taken over by another process")


def hand_back(owned: Owned, *, after: float, data: dict[str, Any]) -> float:
    """Release an owned run for another worker, nothing run, with a ``hand_back`` trace entry
    of ``data``, unless its last entry says the same already: a run handed back again and
    again keeps one entry, and waits longer each time (as long as it has waited since that
    entry, at least ``after`` seconds, at most ``HAND_BACK_MAX``), so that runs waiting for
    code no worker has yet cost little. It waits ``pending``, woken by the sweeper (a run
    rolling back stays so and is recovered). Returns the seconds it waits; LeaseLost when the
    run moved on."""
    now = timezone.now()
    with transaction.atomic(using=using()):
        last = (
            ExecutionEvent.objects.using(using())
            .filter(execution_id=owned.execution_id)
            .order_by("-seq")
            .values_list("seq", "kind", "data", "at")
            .first()
        )
        seq = last_seq(owned.execution_id)
        again = last is not None and (last[0], last[1], last[2]) == (seq, EventKind.HAND_BACK, data)
        if again and last is not None:
            waited = (now - last[3]).total_seconds()
            after = max(after, min(waited, HAND_BACK_MAX))
        runs = Execution.objects.using(using()).filter(pk=owned.execution_id, fence=owned.fence)
        rolling_back = runs.filter(status=ExecutionStatus.ROLLING_BACK)
        updated = rolling_back.update(lease_owner=None, lease_expires_at=None, updated_at=now)
        if not updated:
            updated = runs.update(
                status=ExecutionStatus.PENDING,
                lease_owner=None,
                lease_expires_at=None,
                wake_at=now + dt.timedelta(seconds=after),
                updated_at=now,
            )
        if not updated:
            raise LeaseLost(f"execution {owned.execution_id} was taken over by another process")
        if not again:
            ExecutionEvent.objects.using(using()).create(
                execution_id=owned.execution_id,
                seq=seq + 1,
                kind=EventKind.HAND_BACK,
                at=now,
                data=data,
            )
    return after
