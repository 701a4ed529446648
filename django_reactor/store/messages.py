"""Message rows: a run's mailbox, kept until a step takes them, each exactly once.

The only code that reads or writes :class:`~django_reactor.models.Message` rows. A send takes
the run's row lock, so sends to a run are ordered (their ids) and serialise with the run
reaching an interrupt (the checkpoint that writes the interrupt row holds the same lock): an
early delivery is kept only while the interrupt's row does not exist, and once it does,
deliveries go to the row. A message is consumed in the transaction that accepts it as its
step's payload (:func:`consume`), so a crash never takes one twice nor loses one.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from ..engine.serialization import decode, encode
from ..exceptions import AlreadyResumed, IdempotencyKeyReused, InvalidTransition
from ..models import Execution, Interrupt, Message
from ..states import EventKind, ExecutionStatus, InterruptStatus, MessageKind, MessageStatus
from . import audit
from .db import using
from .dialects import dialect
from .interrupts import MOVING, PayloadClaim, append_unowned_event, at, claim
from .reads import subject_of
from .secrets import Sealer

if TYPE_CHECKING:
    from ..engine.actors import Steering


@dataclass(frozen=True, slots=True)
class Sent:
    """What a send did: the message kept (``message``), or nothing new.

    ``replay``: a message with this idempotency key was kept before, with the same topic and
    payload. ``reached``: an early delivery found the interrupt's row meanwhile; deliver to it.
    """

    status: str
    message: Message | None = None
    replay: bool = False
    reached: Interrupt | None = None


class MessageTaken(Exception):
    """The message stopped being unread while it was being consumed: nothing changed."""


def send(
    execution_id: uuid.UUID,
    topic: str,
    payload: Any,
    *,
    kind: str = MessageKind.MESSAGE,
    idempotency_key: str | None = None,
    secret_paths: Sequence[Sequence[str]] = (),
    steering: Steering | None = None,
) -> Sent:
    """Keep ``payload`` (stored JSON) in the run's mailbox under ``topic``.

    Under the run's row lock: a run that ended takes nothing (InvalidTransition); a repeat of
    ``idempotency_key`` keeps nothing new (IdempotencyKeyReused when its topic or payload
    differ); an early delivery (``kind="delivery"``, ``topic`` the interrupt's path) is kept
    only while the run has not reached the interrupt, and only the first (AlreadyResumed for
    later ones). The values at ``secret_paths`` are stored sealed. ``steering`` (the person who
    delivered a payload early) is recorded in the steering history with the kept message.
    """
    if secret_paths:
        payload = Sealer(subject_of(execution_id)).sealed(payload, secret_paths)
    with transaction.atomic(using=using()):
        status = (
            Execution.objects.using(using())
            .select_for_update()
            .filter(pk=execution_id)
            .values_list("status", flat=True)
            .get()
        )
        if status not in MOVING:
            raise InvalidTransition(
                f"execution {execution_id} is {status}: it takes no messages any more",
                status=status,
            )
        mailbox = Message.objects.using(using()).filter(execution_id=execution_id)
        if idempotency_key is not None:
            earlier = mailbox.filter(idempotency_key=idempotency_key).first()
            if earlier is not None:
                if earlier.topic != topic or earlier.kind != kind or not _same(earlier, payload):
                    raise IdempotencyKeyReused(
                        f"idempotency key {idempotency_key!r} was first used for another "
                        "message; use a new key for a different message",
                        execution_id=execution_id,
                    )
                return Sent(status, earlier, replay=True)
        if kind == MessageKind.DELIVERY:
            reached = at(execution_id, topic)
            if reached is not None:
                return Sent(status, reached=reached)
            if mailbox.filter(kind=MessageKind.DELIVERY, topic=topic).exists():
                raise AlreadyResumed(
                    f"interrupt {topic!r} of execution {execution_id} already has a payload, "
                    "kept until the run reaches it; nothing changed",
                    status=status,
                )
        message = Message.objects.using(using()).create(
            execution_id=execution_id,
            kind=kind,
            topic=topic,
            payload=payload,
            idempotency_key=idempotency_key,
        )
        if steering is not None:
            audit.write(steering, kept=True)
    return Sent(status, message)


def _same(row: Message, payload: Any) -> bool:
    """Whether a kept message holds ``payload`` (compared opened: sealing is not repeatable)."""
    return bool(encode(decode(row.payload)) == encode(decode(payload)))


def unread(
    execution_id: uuid.UUID, *, topic: str | None = None, kind: str | None = None
) -> list[Message]:
    """The run's unread messages, in send order (of one topic and kind, if given)."""
    rows = Message.objects.using(using()).filter(
        execution_id=execution_id, status=MessageStatus.UNREAD
    )
    if topic is not None:
        rows = rows.filter(topic=topic)
    if kind is not None:
        rows = rows.filter(kind=kind)
    return list(rows.order_by("id"))


def kept_delivery(execution_id: uuid.UUID, path: str) -> bool:
    """Whether an early delivery for the interrupt at ``path`` waits, unread."""
    return (
        Message.objects.using(using())
        .filter(
            execution_id=execution_id,
            kind=MessageKind.DELIVERY,
            topic=path,
            status=MessageStatus.UNREAD,
        )
        .exists()
    )


def has_unread(execution_id: uuid.UUID) -> bool:
    """Whether any message of the run is unread."""
    return (
        Message.objects.using(using())
        .filter(execution_id=execution_id, status=MessageStatus.UNREAD)
        .exists()
    )


def of_run(execution_id: uuid.UUID) -> list[Message]:
    """Every message sent to the run, in send order."""
    return list(Message.objects.using(using()).filter(execution_id=execution_id).order_by("id"))


def consume(
    message: Message,
    row: Interrupt,
    payload: Any,
    *,
    step: str,
    inline_owner: str | None,
    secret_paths: Sequence[Sequence[str]] = (),
) -> PayloadClaim:
    """Accept ``payload`` (from ``message``) for the waiting interrupt ``row``, and mark the
    message consumed by ``step``, in one transaction: both happen or neither.

    Raises what :func:`~.interrupts.claim` raises when the interrupt took another payload or
    closed, and MessageTaken when the message was consumed meanwhile.
    """
    with transaction.atomic(using=using()):
        taken = claim(row, payload, inline_owner=inline_owner, secret_paths=secret_paths)
        updated = (
            Message.objects.using(using())
            .filter(pk=message.pk, status=MessageStatus.UNREAD)
            .update(
                status=MessageStatus.CONSUMED, consumed_by_step=step, consumed_at=timezone.now()
            )
        )
        if not updated:
            raise MessageTaken(f"message {message.pk} was consumed meanwhile")
    return taken


def give(
    row: Interrupt,
    top_id: uuid.UUID,
    path: str,
    payload: Any,
    *,
    kind: str,
    idempotency_key: str,
    inline_owner: str | None,
    secret_paths: Sequence[Sequence[str]] = (),
) -> Given | None:
    """Give the waiting interrupt ``row`` (at ``path`` of the run ``top_id``) a validated
    ``payload`` that its run's mailbox has not had yet, in one transaction: the message is
    kept consumed by the step and the interrupt takes the payload (:func:`~.interrupts.claim`).

    None when nothing was given: the run ended, or it had this message before (its
    ``idempotency_key``). When the interrupt took another payload or closed meanwhile, the
    message is kept unread (as :func:`send` would) and None is returned; when earlier
    messages for the step wait unread, it is kept behind them (``Given.kept``).
    """
    with transaction.atomic(using=using()):
        # Lost in a crash, the event is still unhandled, and handed out again.
        dialect().commit_lazily()
        status = (
            Execution.objects.using(using())
            .select_for_update()
            .filter(pk=top_id)
            .values_list("status", flat=True)
            .first()
        )
        if status not in MOVING:
            return None
        # The message given before, or earlier ones for this step not taken yet (given while
        # the run moved, or by its look back): they come first.
        found = set(
            Message.objects.using(using())
            .filter(execution_id=top_id)
            .filter(
                Q(idempotency_key=idempotency_key)
                | Q(kind=kind, topic=path, status=MessageStatus.UNREAD)
            )
            .values_list("idempotency_key", flat=True)[:2]
        )
        if idempotency_key in found:
            return None
        message = Message(
            execution_id=top_id,
            kind=kind,
            topic=path,
            payload=payload,
            idempotency_key=idempotency_key,
        )
        if found:
            message.save(using=using(), force_insert=True)
            return Given(kept=True)
        try:
            taken = claim(row, payload, inline_owner=inline_owner, secret_paths=secret_paths)
        except InvalidTransition:  # another payload won, or the interrupt closed
            message.save(using=using(), force_insert=True)
            return None
        message.status = MessageStatus.CONSUMED
        message.consumed_by_step = path
        message.consumed_at = timezone.now()
        message.save(using=using(), force_insert=True)
    return Given(claim=taken)


@dataclass(frozen=True, slots=True)
class Given:
    """What :func:`give` did: ``claim``, the step took the payload; ``kept``, the message was
    kept unread behind earlier ones for the step (give them in order: ``deliver_kept``)."""

    claim: PayloadClaim | None = None
    kept: bool = False


def refuse(message: Message, errors: Any, *, top_id: uuid.UUID, step: str) -> bool:
    """Mark an unread message invalid with the field errors of the step that took it; the
    trace of the run gets an ``invalid_payload`` entry when the run is paused (none writes it).

    False when the message was consumed or refused meanwhile.
    """
    with transaction.atomic(using=using()):
        status = (
            Execution.objects.using(using())
            .select_for_update()
            .filter(pk=top_id)
            .values_list("status", flat=True)
            .first()
        )
        updated = (
            Message.objects.using(using())
            .filter(pk=message.pk, status=MessageStatus.UNREAD)
            .update(
                status=MessageStatus.INVALID,
                errors=errors,
                consumed_by_step=step,
                consumed_at=timezone.now(),
            )
        )
        if updated and status == ExecutionStatus.PAUSED:
            append_unowned_event(
                top_id,
                EventKind.INVALID_PAYLOAD,
                step,
                {"message": message.pk, "topic": message.topic, "errors": errors},
            )
    return bool(updated)


def paused_with_unread(limit: int) -> list[uuid.UUID]:
    """Paused runs that wait at an interrupt and have unread messages (a run whose process
    stopped between its pause and its look at its mailbox)."""
    waits = Interrupt.objects.using(using()).filter(
        execution_id=OuterRef("execution_id"), status=InterruptStatus.WAITING
    )
    return list(
        Message.objects.using(using())
        .filter(status=MessageStatus.UNREAD, execution__status=ExecutionStatus.PAUSED)
        .filter(Exists(waits))
        .order_by("execution_id")
        .values_list("execution_id", flat=True)
        .distinct()[:limit]
    )
