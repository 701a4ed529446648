"""Secrets at rest: sealing the values at secret paths as rows are written, opening them where a
run reads them back, and what displays show instead.

A sealed value is an envelope (``engine.sealing``) whose token holds the value's stored JSON,
encrypted with the run's subject's data key (``store.subject_keys``) when the run has a subject,
else with the configured keys (``store.keyring``). Opening happens in
:func:`~django_reactor.engine.serialization.decode`, through the decoder this module registers
for envelopes: the run decodes what it needs (its inputs, its steps' arguments and results, an
accepted payload) and gets the values; displays read stored values with ``readable()``, which
never opens an envelope, and show ``[REDACTED]``, or ``[ERASED]`` once the subject is forgotten
(:class:`Marks`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet, InvalidToken

from ..engine.redaction import ERASED, REDACTED
from ..engine.sealing import payloads, seal_at
from ..engine.serialization import (
    SECRET,
    JSONObject,
    JSONValue,
    decode,
    register_decoder,
    replace_sealed,
)
from ..exceptions import StoredValueUnreadable
from . import keyring, subject_keys

if TYPE_CHECKING:
    import uuid


class Sealer:
    """Seals the secrets of one run: with its subject's data key (read once, when the first
    secret is sealed), else with the first configured key."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self._key: tuple[uuid.UUID, Fernet] | None = None

    def ready(self) -> Sealer:
        """Read (or make) the subject's key now: a key made later, inside an atomic step's
        transaction, would go if that transaction rolled back."""
        if self.subject and self._key is None:
            self._key = subject_keys.live_key(self.subject)
        return self

    def seal(self, value: JSONValue) -> JSONObject:
        """The envelope payload of ``value`` (stored JSON)."""
        data = json.dumps(value, separators=(",", ":")).encode()
        if not self.subject:
            return {"token": keyring.encrypt(data)}
        self.ready()
        assert self._key is not None  # a subject's key is read by ready()
        key_id, fernet = self._key
        return {"key": str(key_id), "token": fernet.encrypt(data).decode("ascii")}

    def sealed(
        self, value: JSONValue, paths: Iterable[Sequence[str]] | Iterable[list[str]]
    ) -> JSONValue:
        """``value`` with what is at each secret path sealed."""
        return seal_at(value, paths, self.seal)


def open_payload(payload: JSONObject) -> JSONValue:
    """The stored JSON an envelope holds. SubjectErased when its subject was forgotten,
    StoredValueUnreadable when no key reads it."""
    token = payload.get("token")
    key_id = payload.get("key")
    if not isinstance(token, str):
        raise StoredValueUnreadable("a stored secret has no token: the row was changed by hand")
    if key_id is None:
        data = keyring.decrypt(token)
    else:
        try:
            data = subject_keys.key_by_id(str(key_id)).decrypt(token.encode("ascii"))
        except (InvalidToken, UnicodeEncodeError):
            raise StoredValueUnreadable(
                f"a stored secret cannot be decrypted with the key of its subject ({key_id}): "
                "the row was changed by hand"
            ) from None
    try:
        value: JSONValue = json.loads(data)
    except ValueError:
        raise StoredValueUnreadable("a stored secret does not hold JSON") from None
    return value


def opened(value: JSONValue) -> JSONValue:
    """``value`` with every envelope in it replaced by the stored JSON it holds (for a value
    that is written again: a retry's inputs)."""
    return replace_sealed(value, open_payload)


class Marks:
    """What a display shows for a sealed secret: ``[REDACTED]``, or ``[ERASED]`` when its
    subject was forgotten. Asks the database once per subject key, for the life of the object
    (one per shown run)."""

    def __init__(self) -> None:
        self._erased: dict[str, bool] = {}

    def prepare(self, values: Iterable[JSONValue]) -> Marks:
        """Look up at once the keys of every envelope in ``values``."""
        ids = {
            str(p["key"]) for value in values for p in payloads(value) if p.get("key") is not None
        } - set(self._erased)
        if ids:
            erased = subject_keys.erased_ids(ids)
            self._erased.update({i: i in erased for i in ids})
        return self

    def __call__(self, payload: JSONObject) -> str:
        key_id = payload.get("key")
        if key_id is None:
            return REDACTED
        key = str(key_id)
        if key not in self._erased:
            self._erased[key] = bool(subject_keys.erased_ids({key}))
        return ERASED if self._erased[key] else REDACTED


def _decode_sealed(payload: object) -> object:
    if not isinstance(payload, dict):
        raise StoredValueUnreadable("a stored secret is malformed: the row was changed by hand")
    return decode(open_payload(payload))


register_decoder(SECRET, _decode_sealed)
