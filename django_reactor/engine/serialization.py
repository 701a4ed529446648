"""JSON encoding of inputs, arguments and results, preserving common Python types.

Values are stored as JSON. So that a run behaves the same whether a result was just computed or
read back after a restart, the executor passes every stored value through ``decode(encode(v))``:
dependants always see exactly what the database holds. Dates, times, datetimes, decimals, UUIDs,
tuples and sets survive the round trip as tagged objects; anything else that JSON cannot hold
raises :class:`~django_reactor.exceptions.ResultNotSerializable`, and so does anything the
database would refuse (see :func:`encode`). :func:`decode` raises
:class:`~django_reactor.exceptions.StoredValueUnreadable` for a stored value this code cannot
read back.

Free text that is only shown (error messages, tracebacks, halt and cancel reasons) goes through
:func:`printable` instead: it is never refused, its unstorable characters are escaped.

A secret is stored sealed, as the tagged value ``{TAG: "secret", "v": {...}}`` (the envelope,
see :mod:`.sealing`): :func:`decode` opens it with the decoder the store registers for that
tag, where the run needs the value; :func:`readable`, for display, never opens one.
"""

from __future__ import annotations

import datetime as dt
import decimal
import reprlib
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, overload

from ..exceptions import ResultNotSerializable, StoredValueUnreadable
from .redaction import REDACTED

#: A value as JSON holds it: what :func:`encode` gives, what a JSON column or parser gives back.
JSONValue: TypeAlias = bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"] | None
#: A JSON object: stored inputs and arguments, a failure.
JSONObject: TypeAlias = dict[str, JSONValue]
#: JSON as code builds it to write it out (a trace entry's data): read-only, so that a
#: ``list[str]`` or a ``dict[str, int]`` is one (a tuple is written as an array).
JSONData: TypeAlias = (
    bool | int | float | str | Sequence["JSONData"] | Mapping[str, "JSONData"] | None
)
#: A JSON object as code builds it to write it out.
JSONMapping: TypeAlias = Mapping[str, JSONData]

TAG = "__reactor_type__"
#: The type tag of a sealed secret (an envelope: ``{TAG: SECRET, "v": {...}}``).
SECRET = "secret"

#: Deepest nesting of dicts, lists, tuples and sets a stored value may have (PostgreSQL's and
#: Python's JSON parsers give up somewhere past a thousand; a value this deep is a bug).
MAX_DEPTH = 200

# Integers below this many bits are always short enough to write out (fast path).
_SHORT_INT_BITS = 4096


class _TooDeep(Exception):
    """Raised past MAX_DEPTH; collects the containers on the way out to tell a cycle apart."""

    def __init__(self) -> None:
        super().__init__()
        self.path: list[int] = []


@overload
def encode(value: Mapping[str, object]) -> JSONObject: ...
@overload
def encode(value: object) -> JSONValue: ...
def encode(value: object) -> JSONValue:
    """Return a JSON-compatible structure for ``value`` that the database accepts.

    Raises ResultNotSerializable for a type JSON cannot hold, a NaN or infinite float, a NUL
    character or a lone surrogate in a string or key, an integer too long to write out
    (Python's ``sys.get_int_max_str_digits()``), nesting deeper than :data:`MAX_DEPTH` and a
    value that contains itself.
    """
    try:
        return _encode(value, 0)
    except _TooDeep as deep:
        if len(set(deep.path)) < len(deep.path):
            raise ResultNotSerializable(
                "the value contains itself (a dict or list that is its own member, directly "
                "or further down) and cannot be stored as JSON"
            ) from None
        raise ResultNotSerializable(
            f"the value is nested more than {MAX_DEPTH} levels deep; store flatter data"
        ) from None


def _encode(value: object, depth: int) -> JSONValue:
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        _check_text(value)
        return value
    if isinstance(value, int):  # not a bool: True and False were returned above
        if value.bit_length() > _SHORT_INT_BITS:
            _check_int(value)
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ResultNotSerializable(f"{value!r} cannot be stored as JSON")
        return value
    if depth >= MAX_DEPTH:
        raise _TooDeep
    depth += 1
    try:
        if isinstance(value, dict):
            out: JSONObject = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ResultNotSerializable(
                        f"dictionary keys must be strings to be stored as JSON, got {key!r}"
                    )
                _check_text(key)
                out[key] = _encode(item, depth)
            if TAG in out:
                return {TAG: "dict", "v": out}
            return out
        if isinstance(value, list):
            return [_encode(item, depth) for item in value]
        if isinstance(value, tuple):
            return {TAG: "tuple", "v": [_encode(item, depth) for item in value]}
        if isinstance(value, set | frozenset):
            return {TAG: "set", "v": sorted((_encode(item, depth) for item in value), key=repr)}
    except _TooDeep as deep:
        deep.path.append(id(value))
        raise
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


def _check_text(text: str) -> None:
    """Refuse what PostgreSQL's text and JSON types cannot hold: NUL and lone surrogates."""
    if "\x00" in text:
        raise ResultNotSerializable(
            f"the string {_preview(text)} contains a NUL character (\\u0000), which the "
            "database cannot store"
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ResultNotSerializable(
                f"the string {_preview(text)} contains a lone surrogate (an unpaired "
                "\\ud800-\\udfff code point), which is not valid Unicode text"
            ) from None


def _check_int(value: int) -> None:
    limit = sys.get_int_max_str_digits()
    if limit and value.bit_length() * 0.30103 > limit - 1:  # log10(2): digits per bit
        try:
            str(value)
        except ValueError:
            raise ResultNotSerializable(
                f"an integer of more than {limit} digits cannot be stored; store it as a "
                "string (Python's sys.get_int_max_str_digits() limit)"
            ) from None


def _preview(text: str) -> str:
    shown = ascii(text[:40])
    return shown if len(text) <= 40 else shown[:-1] + "...'"


def printable(text: str) -> str:
    """``text`` with what the database cannot store escaped: NUL as ``\\x00``, lone
    surrogates as ``\\udc00``. For messages, tracebacks and reasons, which are only shown."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 6, 200, 200, 60


def shown(value: object) -> JSONValue:
    """``value`` encoded, or else a short, storable ``repr`` of it: for error reports."""
    try:
        return encode(value)
    except ResultNotSerializable:
        return safe_repr(value)


def shown_items(data: Mapping[str, object]) -> JSONObject:
    """A JSON-safe copy of ``data`` for error reports (values that cannot be stored shown by
    their repr)."""
    return {printable(k): shown(v) for k, v in data.items()}


def safe_repr(value: object) -> str:
    """A short, storable ``repr`` of anything (deep, cyclic, huge or unprintable values too)."""
    try:
        text = _REPR.repr(value)
    except Exception:  # a __repr__ that raises, an integer too long to write out
        text = f"<{type(value).__qualname__} that cannot be shown>"
    return printable(text)


def unstorable(value: object) -> str | None:
    """Why ``value`` (JSON data as a parser gives it) cannot be stored; None when it can."""
    try:
        encode(value)
    except ResultNotSerializable as exc:
        return str(exc)
    return None


# A decoder takes the payload its tag's writer stored, whatever JSON shape that writer chose.
_DECODERS: dict[str, Callable[[Any], object]] = {
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


def register_decoder(tag: str, decoder: Callable[[Any], object]) -> None:
    """Read values stored as ``{TAG: tag, "v": payload}`` back with ``decoder(payload)``.

    Objects with a ``__reactor_encode__()`` method returning ``(tag, payload)`` are stored
    that way: references (a map's result reader) rather than copies of their data.
    """
    _DECODERS[tag] = decoder


def decode(value: JSONValue) -> Any:
    """Inverse of :func:`encode`.

    Raises StoredValueUnreadable for a tagged value this code cannot read (an unknown tag, or
    a payload its decoder refuses): the stored row was written by other code or edited.
    """
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        tag = value.get(TAG)
        if tag is not None and len(value) == 2 and "v" in value:
            return _decode_tagged(tag, value["v"])
        return {key: decode(item) for key, item in value.items()}
    return value


def _decode_tagged(tag: JSONValue, payload: JSONValue) -> object:
    decoder = _DECODERS.get(tag) if isinstance(tag, str) else None
    if decoder is None:
        known = ", ".join(sorted(_DECODERS))
        raise StoredValueUnreadable(
            f"a stored value has the type tag {tag!r}, which this code cannot read (known: "
            f"{known}); it was written by other code, or a decoder is not registered"
        )
    try:
        return decoder(payload)
    except StoredValueUnreadable:
        raise
    except Exception as exc:
        raise StoredValueUnreadable(
            f"a stored {tag} value cannot be read back ({ascii(payload)[:60]}): {exc}"
        ) from None


def readable(value: JSONValue, shown: Callable[[JSONObject], str] | None = None) -> Any:
    """``decode(value)``, or the stored JSON as it is when this code cannot read it: for
    showing a stored run (a handle, the admin, the API), which must not fail on one odd row.

    Sealed secrets are never opened: each shows as ``shown(payload)`` (``"[REDACTED]"``, or
    ``"[ERASED]"`` when its subject was forgotten), or ``"[REDACTED]"`` without ``shown``.
    """
    value = conceal(value, shown)
    try:
        return decode(value)
    except StoredValueUnreadable:
        return value


def conceal(value: JSONValue, shown: Callable[[JSONObject], str] | None = None) -> JSONValue:
    """``value`` with every sealed secret in it replaced by ``shown(payload)`` (by
    ``"[REDACTED]"`` without ``shown``); the value itself when it holds none."""
    return replace_sealed(value, (lambda _: REDACTED) if shown is None else shown)


def sealed_payload(value: object) -> JSONObject | None:
    """The payload of ``value`` when it is a sealed secret (an envelope), else None."""
    if isinstance(value, dict) and len(value) == 2 and value.get(TAG) == SECRET:
        payload = value.get("v")
        if isinstance(payload, dict):
            return payload
    return None


def replace_sealed(
    value: JSONValue, replace: Callable[[JSONObject], JSONValue | None]
) -> JSONValue:
    """``value`` with each sealed secret replaced by ``replace(payload)``; one for which it
    returns None stays. The value itself (not a copy) when nothing was replaced."""
    found = sealed_payload(value)
    if found is not None:
        replaced = replace(found)
        return value if replaced is None else replaced
    if isinstance(value, list):
        items = [replace_sealed(item, replace) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, dict):
        inner = escaped_dict(value)
        if inner is not None:  # a dict of the user's that has the tag's key: never an envelope
            replaced = replace_sealed_items(inner, replace)
            return value if replaced is inner else {TAG: "dict", "v": replaced}
        return replace_sealed_items(value, replace)
    return value


def replace_sealed_items(
    value: dict[str, JSONValue], replace: Callable[[JSONObject], JSONValue | None]
) -> dict[str, JSONValue]:
    """:func:`replace_sealed` of each item of a dict (the dict itself when none changed)."""
    out = {key: replace_sealed(item, replace) for key, item in value.items()}
    return value if all(out[k] is value[k] for k in value) else out


def escaped_dict(value: dict[str, JSONValue]) -> dict[str, JSONValue] | None:
    """The user's dict a stored ``{TAG: "dict", "v": {...}}`` holds (a dict that had the
    tag's key), else None."""
    if len(value) == 2 and value.get(TAG) == "dict":
        inner = value.get("v")
        if isinstance(inner, dict):
            return inner
    return None


def roundtrip(value: object) -> tuple[JSONValue, Any]:
    """Encode ``value``; return ``(stored_form, value_as_read_back)``."""
    stored = encode(value)
    if stored is value:  # scalars: nothing to copy
        return stored, value
    return stored, decode(stored)
