"""Subjects' data keys (``SubjectKey`` rows): the live key a run of a subject seals with, the key
an envelope names, and forgetting a subject (crypto-shredding).

A data key is a Fernet key of its own, stored encrypted with the configured keys
(``store.keyring``). Keys are never cached between calls: once a subject is forgotten, no process
can open its secrets again.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet
from django.db import IntegrityError, transaction
from django.utils import timezone

from ..exceptions import ReactorError, SubjectErased
from ..models import Execution, SubjectKey
from . import audit, keyring
from .db import using

if TYPE_CHECKING:
    from ..engine.actors import Steering

#: Longest subject (``SubjectKey.subject``, ``Execution.subject``).
MAX_SUBJECT = 255


def check_subject(subject: str, where: str) -> str:
    """``subject`` if it can be stored; ReactorError saying what is wrong otherwise."""
    if len(subject) > MAX_SUBJECT:
        raise ReactorError(
            f"the subject of {where} is {len(subject)} characters long; a subject (Meta.subject) "
            f"has at most {MAX_SUBJECT}: use an id, not a description"
        )
    return subject


def live_key(subject: str) -> tuple[uuid.UUID, Fernet]:
    """The subject's live data key (made the first time it is asked for): its id, and the
    Fernet that seals with it."""
    for _ in range(3):
        row = (
            SubjectKey.objects.using(using())
            .filter(subject=subject, erased_at__isnull=True)
            .values_list("id", "key")
            .first()
        )
        if row is not None and row[1] is not None:
            return row[0], _fernet(row[1], subject)
        try:
            with transaction.atomic(using=using()):
                made = SubjectKey.objects.using(using()).create(
                    subject=subject, key=keyring.encrypt(Fernet.generate_key())
                )
        except IntegrityError:
            continue  # another process made it first: read that one
        assert made.key is not None
        return made.id, _fernet(made.key, subject)
    raise ReactorError(f"the key of subject {subject!r} could not be read or made; try again")


def key_by_id(key_id: str) -> Fernet:
    """The data key an envelope names; SubjectErased when its subject was forgotten."""
    pk = _uuid(key_id)
    row = (
        SubjectKey.objects.using(using())
        .filter(pk=pk)
        .values_list("subject", "key", "erased_at")
        .first()
        if pk is not None
        else None
    )
    if row is None:
        raise SubjectErased(
            f"a stored secret was sealed with subject key {key_id}, which no longer exists: it "
            "can never be read again",
            subject="",
        )
    subject, key, erased_at = row
    if key is None:
        raise SubjectErased(
            erased_message(subject, erased_at), subject=subject, erased_at=erased_at
        )
    return _fernet(key, subject)


def erased_message(subject: str, erased_at: dt.datetime | None) -> str:
    """What a run that needs a secret of a forgotten subject says."""
    when = f" on {erased_at:%Y-%m-%d %H:%M:%S %Z}" if erased_at is not None else ""
    return (
        f"the secrets of subject {subject!r} were erased{when} (reactor_forget_subject), and "
        "this run needs one of them to go on: it can never be read again"
    )


def erased_ids(key_ids: set[str]) -> set[str]:
    """Which of ``key_ids`` are erased (their subject forgotten) or gone."""
    ids = {i: _uuid(i) for i in key_ids}
    live = {
        str(pk)
        for pk in SubjectKey.objects.using(using())
        .filter(pk__in=[u for u in ids.values() if u is not None], erased_at__isnull=True)
        .values_list("pk", flat=True)
    }
    return {i for i, u in ids.items() if u is None or str(u) not in live}


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What forgetting a subject did: keys erased now (0: it was forgotten already, or never
    had one), when it was first forgotten, and how many runs of the subject there are."""

    subject: str
    erased: int
    erased_at: dt.datetime | None
    runs: int


def forget(subject: str, *, steering: Steering | None = None) -> Forgotten:
    """Erase the subject's live key (its secrets become unreadable); idempotent. ``steering``
    (who asked) is recorded with the erasure, when there was a key to erase."""
    now = timezone.now()
    with transaction.atomic(using=using()):
        erased = (
            SubjectKey.objects.using(using())
            .filter(subject=subject, erased_at__isnull=True)
            .update(key=None, erased_at=now)
        )
        if erased and steering is not None:
            audit.write(steering, keys_erased=erased)
    first = (
        SubjectKey.objects.using(using())
        .filter(subject=subject, erased_at__isnull=False)
        .order_by("erased_at")
        .values_list("erased_at", flat=True)
        .first()
    )
    runs = Execution.objects.using(using()).filter(subject=subject).count()
    return Forgotten(subject, erased, first, runs)


def state_of(subject: str) -> str:
    """``"live"``, ``"erased"`` or ``"none"`` (no key was ever made for the subject)."""
    states = set(
        SubjectKey.objects.using(using())
        .filter(subject=subject)
        .values_list("erased_at", flat=True)
    )
    if not states:
        return "none"
    return "live" if None in states else "erased"


def _fernet(wrapped: str, subject: str) -> Fernet:
    return Fernet(keyring.decrypt(wrapped, f"the data key of subject {subject!r}"))


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(text))
    except ValueError:
        return None
