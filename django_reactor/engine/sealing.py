"""Secret values kept sealed inside stored JSON: the envelope, and where it goes.

A secret is stored as a tagged value of its own, the *envelope*::

    {"__reactor_type__": "secret", "v": {"token": "<Fernet token>"}}
    {"__reactor_type__": "secret", "v": {"key": "<subject key id>", "token": "<Fernet token>"}}

The token holds the secret's stored JSON, encrypted; ``key`` names the subject's data key when
the run has a subject (``Meta.subject``), else the configured keys encrypted it. User data
cannot look like an envelope: :func:`~.serialization.encode` stores a dict that has the tag's
key as ``{TAG: "dict", "v": {...}}``. Everything else in the stored value stays plain JSON,
queryable as before.

This module only knows where envelopes go (the secret paths of :mod:`.redaction`) and finds
them again; the store encrypts and decrypts (``store.secrets``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from .serialization import SECRET, TAG, JSONObject, JSONValue, escaped_dict, sealed_payload

#: Makes the envelope's payload of a secret's stored JSON (the store's encryption).
Seal = Callable[[JSONValue], JSONObject]


def envelope(payload: JSONObject) -> JSONObject:
    """The stored form of a sealed secret whose payload is ``payload``."""
    return {TAG: SECRET, "v": payload}


def seal_at(value: JSONValue, paths: Iterable[Sequence[str]], seal: Seal) -> JSONValue:
    """A copy of the stored ``value`` with the value at each secret path sealed; a value sealed
    already stays as it is. ``"*"`` in a path is every item of a list or value of a dict."""
    for path in paths:
        value = _seal(value, tuple(path), seal)
    return value


def _seal(data: JSONValue, path: tuple[str, ...], seal: Seal) -> JSONValue:
    if not path:
        return data if sealed_payload(data) is not None else envelope(seal(data))
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        if head == "*":
            return {key: _seal(item, rest, seal) for key, item in data.items()}
        if head in data:
            return {**data, head: _seal(data[head], rest, seal)}
        return data
    if isinstance(data, list):
        if head == "*":
            return [_seal(item, rest, seal) for item in data]
        if head.isdigit() and int(head) < len(data):
            items = list(data)
            items[int(head)] = _seal(items[int(head)], rest, seal)
            return items
    return data


def payloads(value: JSONValue) -> Iterator[JSONObject]:
    """The payload of every envelope in ``value``."""
    found = sealed_payload(value)
    if found is not None:
        yield found
    elif isinstance(value, list):
        for item in value:
            yield from payloads(item)
    elif isinstance(value, dict):
        inner = escaped_dict(value)  # a dict of the user's that has the tag's key
        for item in (value if inner is None else inner).values():
            yield from payloads(item)
