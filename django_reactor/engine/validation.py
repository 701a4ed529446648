"""Running a DRF serializer class as a validator, duck-typed (the engine does not import DRF)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, overload

if TYPE_CHECKING:
    from .serialization import JSONObject, JSONValue


class Serializer(Protocol):
    """What the engine uses of a DRF serializer (by duck typing: the engine imports no DRF)."""

    @property
    def fields(self) -> Mapping[str, object]: ...

    def is_valid(self) -> bool: ...

    @property
    def validated_data(self) -> Mapping[str, object]: ...

    @property
    def errors(self) -> Mapping[str, object]: ...


#: A serializer class (``Inputs``, a step's contract, an interrupt's payload serializer).
SerializerClass = Callable[..., Serializer]


def validate(
    serializer_class: SerializerClass, data: Mapping[str, object]
) -> tuple[dict[str, object] | None, JSONObject | None]:
    """Return ``(validated_data, None)`` or ``(None, field_errors)`` as plain data."""
    serializer = serializer_class(data=dict(data))
    try:
        valid = serializer.is_valid()
    except RecursionError:  # fields that serialise their value (JSONField) on nested-deep data
        return None, {"non_field_errors": ["the data is nested too deeply to be validated"]}
    if valid:
        return dict(serializer.validated_data), None
    return None, plain_errors(serializer.errors)


@overload
def plain_errors(errors: Mapping[str, object]) -> JSONObject: ...
@overload
def plain_errors(errors: object) -> JSONValue: ...
def plain_errors(errors: object) -> JSONValue:
    """DRF ``ErrorDetail`` trees as plain strings, lists and dicts."""
    if isinstance(errors, Mapping):
        return {str(k): plain_errors(v) for k, v in errors.items()}
    if isinstance(errors, list | tuple):
        return [plain_errors(v) for v in errors]
    return str(errors)


def summarise_errors(errors: object) -> str:
    """One line naming each failing field and its first message: ``"items.0.sku: Required."``."""
    first: dict[str, str] = {}
    for path, message in error_messages(errors):
        first.setdefault(path, message)
    return "; ".join(f"{path}: {message}" if path else message for path, message in first.items())


def error_messages(errors: object, prefix: str = "") -> list[tuple[str, str]]:
    """Every message of a serializer's error tree as ``(field path, message)`` pairs, in order.

    Paths are dotted (``items.0.sku``); ``non_field_errors`` belong to the object that holds
    them (``""`` at the top). Empty entries of a list of children (the items that were valid)
    are left out.
    """
    if isinstance(errors, Mapping):
        pairs: list[tuple[str, str]] = []
        for key, value in errors.items():
            path = prefix if key == "non_field_errors" else (f"{prefix}.{key}" if prefix else key)
            pairs.extend(error_messages(value, path))
        return pairs
    if isinstance(errors, list | tuple):
        if all(isinstance(item, str) for item in errors):
            return [(prefix, str(item)) for item in errors]
        pairs = []
        for index, item in enumerate(errors):
            if item:
                pairs.extend(error_messages(item, f"{prefix}.{index}" if prefix else str(index)))
        return pairs
    return [(prefix, str(errors))]
