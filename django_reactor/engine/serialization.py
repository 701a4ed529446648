"""JSON encoding of inputs, arguments and results, preserving common Python types.

Values are stored as JSON. So that a run behaves the same whether a result was just computed or
read back after a restart, the executor passes every stored value through ``decode(encode(v))``:
dependants always see exactly what the database holds. Dates, times, datetimes, decimals, UUIDs,
tuples and sets survive the round trip as tagged objects; anything else that JSON cannot hold
raises :class:`~django_reactor.exceptions.ResultNotSerializable`.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Callable
from typing import Any

from ..exceptions import ResultNotSerializable

TAG = "__reactor_type__"


def encode(value: Any) -> Any:
    """Return a JSON-compatible structure for ``value``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ResultNotSerializable(f"{value!r} cannot be stored as JSON")
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ResultNotSerializable(
                    f"dictionary keys must be strings to be stored as JSON, got {key!r}"
                )
            out[key] = encode(item)
        if TAG in out:
            return {TAG: "dict", "v": out}
        return out
    if isinstance(value, list):
        return [encode(item) for item in value]
    if isinstance(value, tuple):
        return {TAG: "tuple", "v": [encode(item) for item in value]}
    if isinstance(value, set | frozenset):
        return {TAG: "set", "v": sorted((encode(item) for item in value), key=repr)}
    if isinstance(value, dt.datetime):
        return {TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {TAG: "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        return {TAG: "time", "v": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {TAG: "timedelta", "v": value.total_seconds()}
    if isinstance(value, decimal.Decimal):
        return {TAG: "decimal", "v": str(value)}
    if isinstance(value, uuid.UUID):
        return {TAG: "uuid", "v": str(value)}
    reference = getattr(value, "__reactor_encode__", None)
    if reference is not None:
        tag, payload = reference()
        if tag not in _DECODERS:
            raise ResultNotSerializable(f"no decoder is registered for {tag!r} values")
        return {TAG: tag, "v": payload}
    raise ResultNotSerializable(
        f"a {type(value).__qualname__} cannot be stored as JSON; return plain data "
        "(dicts, lists, strings, numbers, dates, decimals, UUIDs) or an id to look it up"
    )


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "dict": lambda v: {k: decode(i) for k, i in v.items()},
    "tuple": lambda v: tuple(decode(i) for i in v),
    "set": lambda v: {decode(i) for i in v},
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "timedelta": lambda v: dt.timedelta(seconds=v),
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
}


def register_decoder(tag: str, decoder: Callable[[Any], Any]) -> None:
    """Read values stored as ``{TAG: tag, "v": payload}`` back with ``decoder(payload)``.

    Objects with a ``__reactor_encode__()`` method returning ``(tag, payload)`` are stored
    that way: references (a map's result reader) rather than copies of their data.
    """
    _DECODERS[tag] = decoder


def decode(value: Any) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        tag = value.get(TAG)
        if tag is not None and len(value) == 2 and "v" in value:
            return _DECODERS[tag](value["v"])
        return {key: decode(item) for key, item in value.items()}
    return value


def roundtrip(value: Any) -> tuple[Any, Any]:
    """Encode ``value``; return ``(stored_form, value_as_read_back)``."""
    stored = encode(value)
    if stored is value:  # scalars: nothing to copy
        return stored, value
    return stored, decode(stored)
