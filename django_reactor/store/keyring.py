"""The keys that seal secrets at rest: ``REACTOR["ENCRYPTION_KEYS"]``, or keys derived from
``SECRET_KEY`` when that list is empty.

The keys make one ``cryptography`` ``MultiFernet``: new tokens are made with the first key, and
a token is read with whichever key made it, so keys rotate (add the new key first, run
``reactor_rotate_keys``, then drop the old one). Without configured keys, one key is derived
with HKDF-SHA256 from ``SECRET_KEY`` and one from each of ``SECRET_KEY_FALLBACKS``: a project
without configuration is still encrypted, and rotating ``SECRET_KEY`` the way Django documents
(the old one moved to the fallbacks) keeps its secrets readable until they are rotated.
"""

from __future__ import annotations

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from ..conf import reactor_settings
from ..exceptions import ReactorImproperlyConfigured, StoredValueUnreadable

#: HKDF's salt and info for the keys derived from SECRET_KEY (changing them loses every secret).
DERIVATION_SALT = b"django_reactor.secrets"
DERIVATION_INFO = b"django_reactor: Fernet key for secrets at rest"


def configured_keys() -> tuple[str, ...]:
    """The Fernet keys in force, first one first: ``ENCRYPTION_KEYS``, or derived ones."""
    keys = reactor_settings.ENCRYPTION_KEYS
    if keys:
        return keys
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    derived = tuple(derived_key(str(secret)) for secret in secrets if secret)
    if not derived:
        raise ReactorImproperlyConfigured(
            "secrets are sealed with REACTOR['ENCRYPTION_KEYS'], or with a key derived from "
            "SECRET_KEY when that list is empty, but both are empty; set one of them"
        )
    return derived


@functools.lru_cache(maxsize=16)
def derived_key(secret: str) -> str:
    """The Fernet key HKDF-SHA256 derives from ``secret`` (a ``SECRET_KEY``)."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=DERIVATION_SALT, info=DERIVATION_INFO)
    return base64.urlsafe_b64encode(hkdf.derive(secret.encode())).decode("ascii")


@functools.lru_cache(maxsize=16)
def _keyring(keys: tuple[str, ...]) -> tuple[Fernet, MultiFernet]:
    fernets = [Fernet(key) for key in keys]
    return fernets[0], MultiFernet(fernets)


def encrypt(data: bytes) -> str:
    """A token of ``data`` made with the first key."""
    first, _ = _keyring(configured_keys())
    return first.encrypt(data).decode("ascii")


def decrypt(token: str, what: str = "a stored secret") -> bytes:
    """What ``token`` holds, read with whichever configured key made it; StoredValueUnreadable
    when none of them did."""
    _, ring = _keyring(configured_keys())
    try:
        return ring.decrypt(token.encode("ascii"))
    except (InvalidToken, UnicodeEncodeError):
        raise StoredValueUnreadable(
            f"{what} cannot be decrypted with any key of REACTOR['ENCRYPTION_KEYS'] (or, when "
            "it is empty, the keys derived from SECRET_KEY and SECRET_KEY_FALLBACKS): the key "
            "that encrypted it was removed. Put that key back (anywhere after the first), run "
            "reactor_rotate_keys, then remove it"
        ) from None


def is_current(token: str) -> bool:
    """Whether ``token`` was made with the first key (rotating it would change nothing)."""
    first, _ = _keyring(configured_keys())
    try:
        first.decrypt(token.encode("ascii"))
    except (InvalidToken, UnicodeEncodeError):
        return False
    return True


def rotate(token: str, what: str = "a stored secret") -> str:
    """``token`` made again with the first key (StoredValueUnreadable when no key reads it)."""
    return encrypt(decrypt(token, what))
