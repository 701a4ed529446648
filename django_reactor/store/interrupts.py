"""Interrupt rows: finding them, counting invalid payloads, claiming, tokens and expiry.

The only code that reads or writes :class:`~django_reactor.models.Interrupt` rows. Exactly one
payload wins per interrupt: the claim is a conditional update from ``waiting``, made while
holding the execution row's lock, so it serialises with the run pausing (see
:func:`reopen_if_claimed`).

An interrupt of a composed child belongs to the child's execution, but the run that pauses
and resumes is the one at the top of the composition (see :func:`nesting`): it is found,
claimed and listed there by its path (``"checkout.approval"``), and the claim takes the top
run's lock and moves the top run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone

from ..conf import reactor_settings
from ..exceptions import (
    AlreadyResumed,
    ExecutionNotFound,
    InterruptClosed,
    InterruptNotFound,
    InvalidTransition,
    NotWaiting,
)
from ..models import Dispatch, Execution, ExecutionEvent, Interrupt, StepRecord
from ..states import EventKind, ExecutionStatus, InterruptStatus, StepStatus
from . import audit
from .db import using
from .outbox import queue_dispatch
from .reads import get_row, last_seq, parse_id, subject_of
from .rows import Owned
from .secrets import Sealer

if TYPE_CHECKING:
    from ..engine.actors import Steering

TOKEN_BYTES = 32  # 256 bits
# Runs that may still take a payload: paused at it, or moving (another payload came first).
MOVING = (ExecutionStatus.PAUSED, ExecutionStatus.RUNNING, ExecutionStatus.PENDING)


def token_hash(token: str) -> str:
    """The SHA-256 (hex) under which a resume token is stored and looked up."""
    return hashlib.sha256(token.encode()).hexdigest()


# ---------------------------------------------------------------------------- nesting


@dataclass(frozen=True, slots=True)
class Nesting:
    """Where an interrupt stands: the run that pauses and resumes for it, and its path there.

    For an interrupt of the run itself, ``top_id`` is its execution and ``path`` its step;
    for one of a composed child, ``top_id`` is the run at the top of the composition (a root
    run, or an async unit) and ``path`` goes through the compose steps, dotted.
    """

    top_id: uuid.UUID
    reactor: str  # the top run's reactor
    path: str
    version: str = ""  # the top run's Meta.version


def nesting(row: Interrupt) -> Nesting:
    """The run that pauses for ``row`` and the interrupt's path there (one read per level)."""
    return above(row.execution_id, row.step, reactor=row.reactor)


def above(execution_id: uuid.UUID, step: str, *, reactor: str = "") -> Nesting:
    """The run at the top of the composition ``execution_id`` belongs to (itself, when it is
    not a composed child), and the path of its step ``step`` from there."""
    path = [step]
    current = execution_id
    while True:
        found = (
            Execution.objects.using(using())
            .filter(pk=current)
            .values_list("reactor", "parent_id", "parent_step", "detached", "version")
            .first()
        )
        if found is None:
            break
        reactor, parent, parent_step, detached, version = found
        if parent is None or detached:
            break
        path.insert(0, parent_step)
        current = parent
    return Nesting(current, reactor, ".".join(path), version)


def path_of(row: Interrupt) -> str:
    """The path under which a listing (:func:`waiting`, :func:`of_run`) found ``row``."""
    return row.listed_path or row.step


def paused_below(execution_id: uuid.UUID) -> dict[uuid.UUID, str]:
    """The run and its composed children (at any depth) paused under it, each with the path
    prefix of its interrupts from the run (``""`` for the run, ``"checkout."`` for a child)."""
    found: dict[uuid.UUID, str] = {execution_id: ""}
    level = [execution_id]
    while level:
        rows = (
            Execution.objects.using(using())
            .filter(parent_id__in=level, detached=False, status=ExecutionStatus.PAUSED)
            .values_list("id", "parent_id", "parent_step")
        )
        level = []
        for child, parent, step in rows:
            if child not in found:
                found[child] = f"{found[parent]}{step}."
                level.append(child)
    return found


def locate(execution_id: uuid.UUID, path: str) -> tuple[uuid.UUID | None, str]:
    """The execution that holds the interrupt at ``path`` below ``execution_id``, and its step
    there; None when the run has not started a composed child the path goes through."""
    *steps, leaf = path.split(".")
    current: uuid.UUID | None = execution_id
    for step in steps:
        current = (
            Execution.objects.using(using())
            .filter(parent_id=current, parent_step=step, detached=False)
            .values_list("id", flat=True)
            .first()
        )
        if current is None:
            break
    return current, leaf


def at(execution_id: uuid.UUID, path: str) -> Interrupt | None:
    """The interrupt of the run ``execution_id`` at ``path`` (its step, or a path through
    composed children), in whatever status; None when there is none (yet)."""
    owner, leaf = locate(execution_id, path)
    if owner is None:
        return None
    row = Interrupt.objects.using(using()).filter(execution_id=owner, step=leaf).first()
    if row is not None:
        row.listed_path = path
    return row


def _listed(rows: list[Interrupt], prefixes: dict[uuid.UUID, str]) -> list[Interrupt]:
    for row in rows:
        row.listed_path = prefixes.get(row.execution_id, "") + row.step
    return rows


def accepted_below(execution_id: uuid.UUID) -> list[str]:
    """The paths (from ``execution_id``) of the interrupts of the run and of its paused
    composed children whose payloads were accepted but not yet recorded by their runs."""
    prefixes = paused_below(execution_id)
    return [
        prefixes[owner] + step
        for owner, step in StepRecord.objects.using(using())
        .filter(execution_id__in=list(prefixes), status=StepStatus.RESUMED)
        .order_by("seq")
        .values_list("execution_id", "step")
    ]


# ---------------------------------------------------------------------------- finding


def waiting_for_correlation(reactor: str, correlation_id: str) -> uuid.UUID | None:
    """The run of ``reactor`` waiting under ``correlation_id``, if any."""
    return (
        Interrupt.objects.using(using())
        .filter(reactor=reactor, correlation_id=correlation_id, status=InterruptStatus.WAITING)
        .values_list("execution_id", flat=True)
        .first()
    )


def find(
    *,
    execution_id: uuid.UUID | str | None = None,
    correlation_id: str | None = None,
    reactor: str | None = None,
    step: str | None = None,
) -> Interrupt:
    """The interrupt a delivery names: by execution id or by correlation id, and step.

    ``step`` may be a path through composed children (``"checkout.approval"``), and may be left
    out when exactly one interrupt of the run (or of its paused composed children) waits.
    Raises InterruptNotFound (unknown run, step or correlation id) or NotWaiting (the run exists
    but has not reached the interrupt: deliver again later).
    """
    prefixes: dict[uuid.UUID, str] = {}
    if execution_id is not None:
        key = parse_id(execution_id)  # ExecutionNotFound for a malformed id
        if step is not None and "." in step:
            owner, leaf = locate(key, step)
            candidates = Interrupt.objects.using(using()).none()
            if owner is not None:
                candidates = Interrupt.objects.using(using()).filter(execution_id=owner, step=leaf)
                prefixes[owner] = step.rpartition(".")[0] + "."
        elif step is not None:
            candidates = Interrupt.objects.using(using()).filter(execution_id=key, step=step)
        else:
            prefixes = paused_below(key)
            candidates = Interrupt.objects.using(using()).filter(execution_id__in=list(prefixes))
        where = f"execution {key}"
    elif correlation_id is not None:
        if not isinstance(correlation_id, str) or not correlation_id or "\x00" in correlation_id:
            raise InterruptNotFound(f"no run waits under correlation id {correlation_id!r}")
        candidates = Interrupt.objects.using(using()).filter(correlation_id=correlation_id)
        if reactor:
            # Its own interrupts, and those of children composed (one or two levels) below it.
            candidates = candidates.filter(
                Q(reactor=reactor)
                | Q(execution__detached=False, execution__parent__reactor=reactor)
                | Q(execution__detached=False, execution__root__reactor=reactor)
            )
        if step is not None:
            candidates = candidates.filter(step=step.rpartition(".")[2])
        where = f"correlation id {correlation_id!r}"
    else:
        raise InterruptNotFound("name the run: an execution id or a correlation id")
    found = list(candidates.order_by("-id")[:20])
    if execution_id is None:
        found = [
            r
            for r in found
            if (not reactor or r.reactor == reactor or nesting(r).reactor == reactor)
            and (step is None or "." not in step or nesting(r).path == step)
        ]
    else:
        _listed(found, prefixes)
    # Waiting interrupts first, then the newest (one query, no ordering expression to compile).
    found.sort(key=lambda r: r.status != InterruptStatus.WAITING)
    if execution_id is None and not reactor:
        reactors = sorted({r.reactor for r in found if r.status == InterruptStatus.WAITING})
        if len(reactors) > 1:
            raise InterruptNotFound(
                f"runs of several reactors wait under {where} ({', '.join(reactors)}); name the "
                "reactor"
            )
    if execution_id is not None:
        rows = found  # the run's interrupts, and its paused children's
    else:  # a correlation id names one run: its interrupts (the run with a waiting one first)
        rows = [r for r in found if r.execution_id == found[0].execution_id] if found else []
    if not rows:
        if execution_id is not None:
            row = get_row(execution_id)  # ExecutionNotFound for an unknown id
            what = f"interrupt {step!r}" if step else "an interrupt"
            if row.status not in MOVING:
                raise InvalidTransition(
                    f"{where} is {row.status} and did not stop at {what}; it takes no payload",
                    status=row.status,
                )
            raise NotWaiting(
                f"{where} has not reached {what} (yet); if it is still running, deliver the "
                "payload again later",
                status=row.status,
            )
        raise InterruptNotFound(
            f"no run waits under {where}"
            + (f" at interrupt {step!r}" if step else "")
            + "; if the run has not reached its interrupt yet, deliver the payload again later"
        )
    waiting = [r for r in rows if r.status == InterruptStatus.WAITING]
    if step is None and len(waiting) > 1:
        names = ", ".join(sorted(path_of(r) for r in waiting))
        raise InterruptNotFound(f"{where} waits at several interrupts ({names}); name the step")
    return waiting[0] if waiting else rows[0]


def find_by_token(token: str) -> Interrupt:
    """The waiting interrupt a resume token was issued for; InterruptNotFound otherwise."""
    if not isinstance(token, str) or not 20 <= len(token) <= 200:
        raise InterruptNotFound("no interrupt has this resume token")
    row = Interrupt.objects.using(using()).filter(token_hash=token_hash(token)).first()
    if row is None:
        raise InterruptNotFound("no interrupt has this resume token")
    return row


def waiting(execution_id: uuid.UUID) -> list[Interrupt]:
    """The interrupts a run waits at, in the order it reached them: its own, and those of its
    composed children paused under it (:func:`path_of` gives each one's path)."""
    prefixes = paused_below(execution_id)
    return _listed(
        list(
            Interrupt.objects.using(using())
            .filter(execution_id__in=list(prefixes), status=InterruptStatus.WAITING)
            .order_by("id")
        ),
        prefixes,
    )


def of_run(execution_id: uuid.UUID, *, paused: bool = True) -> list[Interrupt]:
    """Every interrupt a run reached and, when it is ``paused``, those of its composed children
    paused under it (:func:`path_of` gives each one's path), in the order they were reached."""
    prefixes = paused_below(execution_id) if paused else {execution_id: ""}
    return _listed(
        list(
            Interrupt.objects.using(using()).filter(execution_id__in=list(prefixes)).order_by("id")
        ),
        prefixes,
    )


def named(row: Interrupt) -> str:
    """``interrupt 'approval' of execution <id>``, by its path from the run that paused."""
    where = nesting(row)
    return f"interrupt {where.path!r} of execution {where.top_id}"


def refuse_closed(row: Interrupt, execution_status: str | None = None) -> None:
    """Raise the error a delivery to ``row`` gets when it no longer takes payloads."""
    if row.status == InterruptStatus.RESUMED:
        raise AlreadyResumed(
            f"{named(row)} already accepted a payload; nothing changed",
            status=execution_status,
        )
    if row.status == InterruptStatus.WAITING:
        if row.expires_at is not None and row.expires_at <= timezone.now():
            raise InterruptClosed(
                f"{named(row)} expired at {row.expires_at:%Y-%m-%d %H:%M:%S %Z}; the payload "
                "came too late",
                reason="expired",
                status=execution_status,
            )
        return
    reasons: dict[str, str] = {
        InterruptStatus.EXPIRED: "expired",
        InterruptStatus.CANCELLED: "cancelled",
        InterruptStatus.FAILED: "failed",
    }
    reason = reasons.get(row.status, str(row.status))
    explain = {
        "expired": "its timeout passed",
        "cancelled": "its run was cancelled or undone",
        "failed": "its run failed after too many invalid payloads",
    }.get(reason, reason)
    raise InterruptClosed(
        f"{named(row)} is closed: {explain}",
        reason=reason,
        status=execution_status,
    )


# ---------------------------------------------------------------------------- invalid payloads


def count_invalid(row: Interrupt, errors: Any) -> int:
    """Count one invalid payload for a waiting interrupt; return the attempts so far.

    The trace of the run that paused for it gets an ``invalid_payload`` entry (field errors
    only, never the payload). Raises the closed-interrupt error when the interrupt stopped
    waiting meanwhile.
    """
    where = nesting(row)
    with transaction.atomic(using=using()):
        execution = (
            Execution.objects.using(using())
            .select_for_update()
            .only("id", "status")
            .get(pk=where.top_id)
        )
        updated = (
            Interrupt.objects.using(using())
            .filter(pk=row.pk, status=InterruptStatus.WAITING)
            .update(invalid_attempts=F("invalid_attempts") + 1)
        )
        fresh = Interrupt.objects.using(using()).get(pk=row.pk)
        if not updated:
            refuse_closed(fresh, execution.status)
        if execution.status == ExecutionStatus.PAUSED:
            # A paused run has no owner writing its trace: the sequence number is free.
            append_unowned_event(
                where.top_id,
                EventKind.INVALID_PAYLOAD,
                where.path,
                {"attempt": fresh.invalid_attempts, "errors": errors},
            )
    return fresh.invalid_attempts


def mark(row: Interrupt, status: str, *, closed: bool = False) -> None:
    """Close a waiting interrupt as ``status`` (expired, failed, cancelled).

    ``closed``: also relabel it when its run's claim already closed it as cancelled.
    """
    allowed = [InterruptStatus.WAITING]
    if closed:
        allowed.append(InterruptStatus.CANCELLED)
    Interrupt.objects.using(using()).filter(pk=row.pk, status__in=allowed).update(
        status=status, closed_at=timezone.now(), token_hash=None
    )


def close_waiting(execution_id: uuid.UUID, *, stop_children: bool = False) -> int:
    """Close every waiting interrupt of a run that is cancelled, undone or ends, and of the
    composed children paused under it.

    ``stop_children``: the run stopped without rolling them back (cancelled, halted), so those
    children are cancelled too; ``undo()`` of the run rolls them back later. Otherwise the
    run's rollback rolls them back now.
    """
    below = paused_below(execution_id)
    now = timezone.now()
    closed = (
        Interrupt.objects.using(using())
        .filter(execution_id__in=list(below), status=InterruptStatus.WAITING)
        .update(status=InterruptStatus.CANCELLED, closed_at=now, token_hash=None)
    )
    children = [child for child in below if child != execution_id]
    if stop_children and children:
        for child in children:
            append_unowned_event(child, EventKind.CANCEL, "", {"reason": "its parent run stopped"})
        Execution.objects.using(using()).filter(
            pk__in=children, status=ExecutionStatus.PAUSED
        ).update(
            status=ExecutionStatus.CANCELLED,
            cancel_reason="its parent run stopped",
            finished_at=now,
            updated_at=now,
            fence=F("fence") + 1,
        )
    return closed


# ---------------------------------------------------------------------------- the claim


@dataclass(frozen=True, slots=True)
class PayloadClaim:
    """What accepting a payload did to the run.

    ``owned``: the caller took the paused run and runs the rest inline. ``dispatched``: the
    run was paused and a worker was asked to run the rest. Neither: the run was already moving
    (another interrupt's payload came first) and records this payload when it next pauses.
    """

    interrupt: Interrupt
    execution_status: str
    owned: Owned | None = None
    dispatched: bool = False


def claim(
    row: Interrupt,
    payload: Any,
    *,
    inline_owner: str | None,
    closing_status: str = InterruptStatus.RESUMED,
    ignore_expiry: bool = False,
    secret_paths: Sequence[Sequence[str]] = (),
    steering: Steering | None = None,
) -> PayloadClaim:
    """Accept ``payload`` for a waiting interrupt: exactly one delivery wins.

    The values at ``secret_paths`` (the payload serializer's ``write_only`` fields) are stored
    sealed, with the key of the subject of the run that paused for it.

    In one transaction, holding the lock of the run that paused for it (:func:`nesting`): the
    interrupt moves from ``waiting`` (and not expired) to ``closing_status`` with the payload,
    its step record to ``resumed``, and that run, if paused, to running (owned by
    ``inline_owner``) or to pending with a dispatch for a worker. A composed child stays
    paused: its parent continues it. Raises AlreadyResumed or InterruptClosed when another
    delivery won or the interrupt closed.

    ``steering`` (who delivered it) is recorded in the steering history, and on the trace of a
    paused run as a ``steer`` entry (a moving run's owner writes its trace: the run records the
    payload when it next pauses, and the history says who).
    """
    now = timezone.now()
    top = nesting(row).top_id
    if secret_paths:
        payload = Sealer(subject_of(row.execution_id)).sealed(payload, secret_paths)
    with transaction.atomic(using=using()):
        execution = Execution.objects.using(using()).select_for_update().get(pk=top)
        if execution.status not in MOVING:
            # A delivery that lost the race to one whose run has finished since: it was
            # already resumed (409), not closed.
            current = Interrupt.objects.using(using()).get(pk=row.pk)
            if current.status != InterruptStatus.WAITING:
                refuse_closed(current, execution.status)
            raise InterruptClosed(
                f"{named(row)} is closed: the run is {execution.status}",
                reason="cancelled" if execution.status == ExecutionStatus.CANCELLED else "closed",
                status=execution.status,
            )
        open_rows = Interrupt.objects.using(using()).filter(
            pk=row.pk, status=InterruptStatus.WAITING
        )
        if not ignore_expiry:
            open_rows = open_rows.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=Now()))
        won = open_rows.update(
            status=closing_status, payload=payload, closed_at=now, token_hash=None
        )
        if not won:
            refuse_closed(Interrupt.objects.using(using()).get(pk=row.pk), execution.status)
            raise InterruptClosed(  # waiting but expired by the database's clock
                f"{named(row)} expired; the payload came too late",
                reason="expired",
                status=execution.status,
            )
        StepRecord.objects.using(using()).filter(
            execution_id=row.execution_id, step=row.step, status=StepStatus.WAITING
        ).update(status=StepStatus.RESUMED, result=payload)
        if steering is not None:
            if execution.status == ExecutionStatus.PAUSED:  # nobody owns it; its row is locked
                append_unowned_event(
                    execution.pk,
                    EventKind.STEER,
                    "",
                    {"action": steering.action, **steering.detail, **steering.trace_data()},
                )
            audit.write(steering)
        fresh = row
        if execution.status != ExecutionStatus.PAUSED:
            return PayloadClaim(fresh, execution.status)
        if inline_owner is not None:
            fence = execution.fence + 1
            Execution.objects.using(using()).filter(pk=execution.pk).update(
                status=ExecutionStatus.RUNNING,
                lease_owner=inline_owner,
                lease_expires_at=now + dt.timedelta(seconds=reactor_settings.LEASE_SECONDS),
                fence=fence,
                updated_at=now,
            )
            return PayloadClaim(fresh, ExecutionStatus.RUNNING, owned=Owned(execution.pk, fence))
        _to_worker(execution.pk, now)
        return PayloadClaim(fresh, ExecutionStatus.PENDING, dispatched=True)


def _to_worker(execution_id: uuid.UUID, now: dt.datetime) -> None:
    Execution.objects.using(using()).filter(pk=execution_id).update(
        status=ExecutionStatus.PENDING, handed_off=True, updated_at=now
    )
    queue_dispatch(execution_id, Dispatch.Reason.RESUME)


def reopen_if_claimed(execution_id: uuid.UUID) -> bool:
    """After a run paused: hand it to a worker if a payload was accepted meanwhile (for one of
    its interrupts, or one of a composed child paused under it).

    A payload accepted while the run was still moving is recorded by the run when it continues;
    this closes the window between the run's last look and its pause.
    """
    with transaction.atomic(using=using()):
        execution = (
            Execution.objects.using(using())
            .select_for_update()
            .only("id", "status")
            .filter(pk=execution_id)
            .first()
        )
        if execution is None or execution.status != ExecutionStatus.PAUSED:
            return False
        if (
            not StepRecord.objects.using(using())
            .filter(execution_id__in=list(paused_below(execution_id)), status=StepStatus.RESUMED)
            .exists()
        ):
            return False
        _to_worker(execution_id, timezone.now())
        return True


# ---------------------------------------------------------------------------- tokens


def issue_token(execution_id: uuid.UUID | str, step: str) -> str:
    """A new single-use resume token for a waiting interrupt (a previous one stops working).

    Only its SHA-256 is stored: keep the returned token, it cannot be read back.
    """
    row = find(execution_id=execution_id, step=step)
    if row.status != InterruptStatus.WAITING:
        refuse_closed(row, get_row(nesting(row).top_id).status)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    updated = (
        Interrupt.objects.using(using())
        .filter(pk=row.pk, status=InterruptStatus.WAITING)
        .update(token_hash=token_hash(token))
    )
    if not updated:
        raise ExecutionNotFound(f"interrupt {step!r} of execution {execution_id} stopped waiting")
    return token


# ---------------------------------------------------------------------------- expiry


def due(limit: int) -> list[Interrupt]:
    """Waiting interrupts whose timeout passed (by the database's clock), oldest first."""
    return list(
        Interrupt.objects.using(using())
        .filter(status=InterruptStatus.WAITING, expires_at__lte=Now())
        .order_by("expires_at")[:limit]
    )


def append_unowned_event(
    execution_id: uuid.UUID, kind: str, step: str, data: dict[str, Any]
) -> None:
    """Add a trace entry to a run nobody owns (paused, or its row locked by the caller)."""
    last = last_seq(execution_id)
    ExecutionEvent.objects.using(using()).create(
        execution_id=execution_id,
        seq=last + 1,
        kind=kind,
        step=step,
        at=timezone.now(),
        data=data,
    )
