"""Signed webhooks (Standard Webhooks): verify ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature`` against the configured secrets, and sign (for clients and tests).

The signed content is ``"{id}.{timestamp}.{raw body}"``, signed with HMAC-SHA256 and sent as
``v1,<base64>``; several space-separated signatures may be sent (the sender's rotation) and
several secrets may be configured (ours). Secrets are ``whsec_<base64 key>`` or plain strings.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..conf import reactor_settings
from ..engine.serialization import unstorable
from ..exceptions import ReactorImproperlyConfigured

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
MAX_SIGNATURES = 10


class SignatureError(Exception):
    """The request's signature does not verify; the message says why (never the secret)."""


@dataclass(frozen=True, slots=True)
class Verified:
    """A verified delivery: its id, and which secret group (``default`` or a reactor) signed."""

    webhook_id: str
    group: str


def secret_key(secret: str) -> bytes:
    """The HMAC key of a configured secret."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except (binascii.Error, ValueError):
            raise ReactorImproperlyConfigured(
                "a REACTOR['WEBHOOK_SECRETS'] entry starts with whsec_ but is not base64"
            ) from None
    return secret.encode()


def configured_secrets() -> dict[str, list[bytes]]:
    """``{"default": [...], "<reactor name>": [...]}`` from ``REACTOR["WEBHOOK_SECRETS"]``."""
    raw = reactor_settings.WEBHOOK_SECRETS
    groups: Mapping[str, Iterable[str]]
    if isinstance(raw, str):
        groups = {"default": [raw]}
    elif isinstance(raw, Mapping):
        groups = raw
    else:
        groups = {"default": list(raw or [])}
    result: dict[str, list[bytes]] = {}
    for name, secrets in groups.items():
        values = [secrets] if isinstance(secrets, str) else list(secrets)
        if not all(isinstance(v, str) and v for v in values):
            raise ReactorImproperlyConfigured(
                f"REACTOR['WEBHOOK_SECRETS'][{name!r}] must be a list of non-empty strings"
            )
        result[str(name)] = [secret_key(v) for v in values]
    return result


def signature(key: bytes, webhook_id: str, timestamp: int | str, body: bytes) -> str:
    """The base64 HMAC-SHA256 of one delivery (without the ``v1,`` prefix)."""
    message = f"{webhook_id}.{timestamp}.".encode() + body
    return base64.b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode()


def sign(secret: str, webhook_id: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The three headers a sender puts on a delivery (for your clients and your tests)."""
    stamp = int(time.time()) if timestamp is None else timestamp
    value = signature(secret_key(secret), webhook_id, stamp, body)
    return {
        ID_HEADER: webhook_id,
        TIMESTAMP_HEADER: str(stamp),
        SIGNATURE_HEADER: f"v1,{value}",
    }


def verify(headers: Mapping[str, str], body: bytes, *, now: float | None = None) -> Verified:
    """Check a delivery's headers against every configured secret; raise SignatureError."""
    webhook_id = headers.get(ID_HEADER, "")
    stamp = headers.get(TIMESTAMP_HEADER, "")
    sent = headers.get(SIGNATURE_HEADER, "")
    if not webhook_id or not stamp or not sent:
        raise SignatureError(
            f"a signed webhook needs the {ID_HEADER}, {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} "
            "headers"
        )
    if len(webhook_id) > 255:
        raise SignatureError(f"the {ID_HEADER} header is longer than 255 characters")
    if unstorable(webhook_id) is not None:  # a NUL cannot be stored, a surrogate not signed
        raise SignatureError(f"the {ID_HEADER} header has a NUL or a lone surrogate")
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
        raise SignatureError(f"the {TIMESTAMP_HEADER} header is not a Unix timestamp")
    timestamp = int(stamp)
    tolerance = reactor_settings.WEBHOOK_TOLERANCE
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise SignatureError(
            f"the {TIMESTAMP_HEADER} is more than {tolerance:.0f} seconds away from now "
            "(a replay, or a sender's clock that is off)"
        )
    candidates = [
        part.split(",", 1)[1]
        for part in sent.split(" ")[:MAX_SIGNATURES]
        if part.startswith("v1,") and part.isascii()  # base64: any other text cannot match
    ]
    if not candidates:
        raise SignatureError(f"the {SIGNATURE_HEADER} header has no v1 signature")
    groups = configured_secrets()
    if not any(groups.values()):
        raise SignatureError("this server has no webhook secrets configured")
    for group, keys in groups.items():
        for key in keys:
            expected = signature(key, webhook_id, timestamp, body)
            # Compare against every candidate without stopping early on a match.
            if any(hmac.compare_digest(expected.encode(), c.encode()) for c in candidates):
                return Verified(webhook_id, group)
    raise SignatureError("the signature does not match (wrong secret, or the body was changed)")
