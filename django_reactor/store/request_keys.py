"""Remembered requests: ``Idempotency-Key`` headers, webhook ids and keyed resumes.

The first request with a key reserves it (a unique row, ``status_code`` 0 while in flight) and
stores its response when done. While the request runs, :func:`kept` has the process's lease
heartbeat push the reservation's ``created_at`` forward every ``LEASE_SECONDS / 3``, however
long the request takes (an inline resume runs the rest of a run). A reservation left unextended
for ``REACTOR["LEASE_SECONDS"]`` (its process died) is taken over by the next request with the
key. A repeat with the same body fingerprint gets the stored response (or "in flight"); a
repeat with another body is refused. Rows older than ``REACTOR["API_IDEMPOTENCY_TTL"]`` (counted
from the last extension) are forgotten by the sweeper.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from ..conf import reactor_settings
from ..models import ApiRequest
from .db import reconnecting, using
from .lease import Kept

logger = logging.getLogger("django_reactor.api")


def fingerprint(*parts: Any) -> str:
    """A SHA-256 over the parts (bytes as they are, anything else as canonical JSON)."""
    digest = hashlib.sha256()
    for part in parts:
        data = (
            part
            if isinstance(part, bytes)
            else json.dumps(part, sort_keys=True, default=str).encode()
        )
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Reservation:
    """What reserving a key found.

    ``state`` is ``"new"`` (this request owns the key: finish or release it), ``"replay"``
    (same body, answered before: ``status_code`` and ``response``), ``"in_flight"`` (same body,
    still being answered) or ``"mismatch"`` (the key was used with another body).
    """

    state: str
    row_id: int | None = None
    status_code: int = 0
    response: Any = None


def reserve(scope: str, key: str, body_fingerprint: str) -> Reservation:
    """Reserve ``key`` in ``scope`` for a request whose body has ``body_fingerprint``."""
    ttl = dt.timedelta(seconds=reactor_settings.API_IDEMPOTENCY_TTL)
    in_flight = dt.timedelta(seconds=reactor_settings.LEASE_SECONDS)
    now = timezone.now()
    for _ in range(2):
        try:
            with transaction.atomic(using=using()):
                row = ApiRequest.objects.using(using()).create(
                    scope=scope[:255], key=key[:255], fingerprint=body_fingerprint
                )
            return Reservation("new", row.pk)
        except IntegrityError:
            existing = (
                ApiRequest.objects.using(using()).filter(scope=scope[:255], key=key[:255]).first()
            )
            if existing is None:
                continue  # released meanwhile: try again
            abandoned = existing.status_code == 0 and existing.created_at < now - in_flight
            if existing.created_at < now - ttl or abandoned:
                # Expired but not swept yet, or its request died unanswered (the process
                # stopped): a new request may take the key. Taking over is safe: what the
                # request does is guarded on its own (an interrupt takes one payload). Only
                # the row as read is deleted: one its keeper extended meanwhile is alive.
                ApiRequest.objects.using(using()).filter(
                    pk=existing.pk,
                    created_at=existing.created_at,
                    status_code=existing.status_code,
                ).delete()
                continue
            if existing.fingerprint != body_fingerprint:
                return Reservation("mismatch", existing.pk)
            if existing.status_code == 0:
                return Reservation("in_flight", existing.pk)
            return Reservation("replay", existing.pk, existing.status_code, existing.response)
    return Reservation("in_flight")


class ReservationKeeper(Kept):
    """Keeps a reserved key's request alive: extended by the process's heartbeat (which also
    extends runs' leases) while the request runs."""

    def __init__(self, row_id: int) -> None:
        self.row_id = row_id
        super().__init__()

    @property
    def label(self) -> str:
        return f"the reservation of remembered request {self.row_id}"

    def extend(self) -> bool:
        """Mark the reservation alive now; False once it was answered, released or taken."""
        return bool(
            ApiRequest.objects.using(using())
            .filter(pk=self.row_id, status_code=0)
            .update(created_at=timezone.now())
        )


@contextmanager
def kept(row_id: int) -> Iterator[ReservationKeeper]:
    """Keep the reservation ``row_id`` from being taken over while the block runs.

    Wrap the work a reserved request does, then :func:`finish` or :func:`release` it. If the
    process dies, the extensions stop and the next request takes the key after the lease.
    """
    with ReservationKeeper(row_id) as keeper:
        yield keeper


def finish(row_id: int, status_code: int, response: Any) -> None:
    """Store the response a reserved key's request got.

    The request's work is committed by now: on a broken connection this reconnects and stores
    it, and if the database stays unreachable the caller still gets its answer (a repeat is
    handled afresh once the reservation's lease ends) instead of an error for work done.
    """
    remembered = ApiRequest.objects.using(using()).filter(pk=row_id)
    try:
        reconnecting(
            lambda: remembered.update(status_code=status_code, response=response),
            what=f"remembering the answer of request {row_id}",
        )
    except DatabaseError:
        logger.warning(
            "could not remember the answer of request %s; a repeat is handled afresh after the "
            "lease",
            row_id,
            exc_info=True,
        )


def release(row_id: int) -> None:
    """Forget a reservation (the request failed in a way a retry may repeat differently).

    Often called because the request failed: on a broken connection it reconnects, and if the
    database stays unreachable the reservation is left to be taken over after the lease
    (``LEASE_SECONDS``) instead of hiding the request's own error.
    """
    try:
        reconnecting(
            ApiRequest.objects.using(using()).filter(pk=row_id).delete,
            what=f"releasing remembered request {row_id}",
        )
    except DatabaseError:
        logger.warning(
            "could not release remembered request %s; a repeat may take it over after the lease",
            row_id,
            exc_info=True,
        )


def forget_expired(limit: int) -> int:
    """Delete up to ``limit`` remembered requests older than the TTL; return how many."""
    cutoff = timezone.now() - dt.timedelta(seconds=reactor_settings.API_IDEMPOTENCY_TTL)
    old = list(
        ApiRequest.objects.using(using())
        .filter(created_at__lt=cutoff)
        .values_list("pk", flat=True)[:limit]
    )
    deleted, _ = ApiRequest.objects.using(using()).filter(pk__in=old).delete()
    return int(deleted)
