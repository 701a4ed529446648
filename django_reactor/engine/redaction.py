"""Masking secret values wherever a run's data is displayed or logged.

A secret is addressed by a path of keys from the top of a structure; ``"*"`` matches every item of
a list or every value of a dict. The stored data keeps the real values, sealed (steps and undo
need them; see :mod:`.sealing`); every display copy goes through :func:`redact`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .validation import Serializer

REDACTED = "[REDACTED]"
#: What a sealed secret shows once the key of its subject was deleted (crypto-shredding): it
#: can never be read again. Distinct from ``[REDACTED]``, which is still there, only hidden.
ERASED = "[ERASED]"

SecretPath = tuple[str, ...]


def redact(data: Any, paths: Iterable[Sequence[str]]) -> Any:
    """Return a copy of ``data`` with the value at every secret path replaced by ``[REDACTED]``."""
    result = data
    for path in paths:
        result = _mask(result, tuple(path))
    return result


def _mask(data: Any, path: SecretPath) -> Any:
    if not path:
        return ERASED if data == ERASED else REDACTED
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        if head == "*":
            return {key: _mask(value, rest) for key, value in data.items()}
        if head in data:
            return {**data, head: _mask(data[head], rest)}
        return data
    if isinstance(data, list | tuple):
        if head == "*":
            return [_mask(item, rest) for item in data]
        if head.isdigit() and int(head) < len(data):
            items = list(data)
            items[int(head)] = _mask(items[int(head)], rest)
            return items
    return data


def secret_paths_of_serializer(
    serializer_class: Callable[[], Serializer] | None,
) -> list[SecretPath]:
    """Paths of the ``write_only`` fields of a DRF serializer class, nested serializers included.

    A ``write_only`` field goes in and never comes out: django_reactor treats it as a secret.
    """
    if serializer_class is None:
        return []
    try:
        fields = serializer_class().fields
    except Exception:  # a serializer that cannot be built without context: nothing to find
        return []
    return list(_walk_fields(fields, ()))


def _walk_fields(fields: Mapping[str, object], prefix: SecretPath) -> Iterable[SecretPath]:
    for name, fld in fields.items():
        path = (*prefix, name)
        if getattr(fld, "write_only", False):
            yield path
            continue
        child = getattr(fld, "child", None)  # ListSerializer / ListField / DictField
        if child is not None:
            if getattr(child, "write_only", False):
                yield (*path, "*")
            elif hasattr(child, "fields"):
                yield from _walk_fields(child.fields, (*path, "*"))
        elif hasattr(fld, "fields"):
            yield from _walk_fields(fld.fields, path)


def relative_secret_paths(ref_path: SecretPath, secrets: Iterable[SecretPath]) -> list[SecretPath]:
    """Secret paths inside the value found at ``ref_path``.

    ``[()]`` means the whole value is secret.
    """
    found: list[SecretPath] = []
    for secret in secrets:
        if _covers(secret, ref_path):
            return [()]
        if _covers(ref_path, secret):
            found.append(secret[len(ref_path) :])
    return found


def _covers(prefix: SecretPath, path: SecretPath) -> bool:
    if len(prefix) > len(path):
        return False
    return all(p == "*" or q == "*" or p == q for p, q in zip(prefix, path, strict=False))
