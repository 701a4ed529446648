"""Remembered requests: ``Idempotency-Key`` headers, webhook ids and keyed resumes.

The first request with a key reserves it (a unique row, ``status_code`` 0 while in flight) and
stores its response when done. A reservation left unanswered for ``REACTOR["LEASE_SECONDS"]``
(its process died) is taken over by the next request with the key. A repeat with the same body
fingerprint gets the stored response (or "in flight"); a repeat with another body is refused.
Rows older than
``REACTOR["API_IDEMPOTENCY_TTL"]`` are forgotten by the sweeper.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from .conf import reactor_settings
from .models import ApiRequest
from .store import USING


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
    ttl = dt.timedelta(seconds=float(reactor_settings.API_IDEMPOTENCY_TTL))
    in_flight = dt.timedelta(seconds=float(reactor_settings.LEASE_SECONDS))
    now = timezone.now()
    for _ in range(2):
        try:
            with transaction.atomic(using=USING):
                row = ApiRequest.objects.using(USING).create(
                    scope=scope[:255], key=key[:255], fingerprint=body_fingerprint
                )
            return Reservation("new", row.pk)
        except IntegrityError:
            existing = (
                ApiRequest.objects.using(USING).filter(scope=scope[:255], key=key[:255]).first()
            )
            if existing is None:
                continue  # released meanwhile: try again
            abandoned = existing.status_code == 0 and existing.created_at < now - in_flight
            if existing.created_at < now - ttl or abandoned:
                # Expired but not swept yet, or its request died unanswered (the process
                # stopped): a new request may take the key. Taking over is safe: what the
                # request does is guarded on its own (an interrupt takes one payload).
                ApiRequest.objects.using(USING).filter(pk=existing.pk).delete()
                continue
            if existing.fingerprint != body_fingerprint:
                return Reservation("mismatch", existing.pk)
            if existing.status_code == 0:
                return Reservation("in_flight", existing.pk)
            return Reservation("replay", existing.pk, existing.status_code, existing.response)
    return Reservation("in_flight")


def finish(row_id: int, status_code: int, response: Any) -> None:
    """Store the response a reserved key's request got."""
    ApiRequest.objects.using(USING).filter(pk=row_id).update(
        status_code=status_code, response=response
    )


def release(row_id: int) -> None:
    """Forget a reservation (the request failed in a way a retry may repeat differently)."""
    ApiRequest.objects.using(USING).filter(pk=row_id).delete()


def forget_expired(limit: int) -> int:
    """Delete up to ``limit`` remembered requests older than the TTL; return how many."""
    cutoff = timezone.now() - dt.timedelta(seconds=float(reactor_settings.API_IDEMPOTENCY_TTL))
    old = list(
        ApiRequest.objects.using(USING)
        .filter(created_at__lt=cutoff)
        .values_list("pk", flat=True)[:limit]
    )
    deleted, _ = ApiRequest.objects.using(USING).filter(pk__in=old).delete()
    return int(deleted)
