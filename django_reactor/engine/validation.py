"""Running a DRF serializer class as a validator, duck-typed (the engine does not import DRF)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def validate(serializer_class: Any, data: Mapping[str, Any]) -> tuple[dict[str, Any] | None, Any]:
    """Return ``(validated_data, None)`` or ``(None, field_errors)`` as plain data."""
    serializer = serializer_class(data=dict(data))
    try:
        valid = serializer.is_valid()
    except RecursionError:  # fields that serialise their value (JSONField) on nested-deep data
        return None, {"non_field_errors": ["the data is nested too deeply to be validated"]}
    if valid:
        return dict(serializer.validated_data), None
    return None, plain_errors(serializer.errors)


def plain_errors(errors: Any) -> Any:
    """DRF ``ErrorDetail`` trees as plain strings, lists and dicts."""
    if isinstance(errors, Mapping):
        return {str(k): plain_errors(v) for k, v in errors.items()}
    if isinstance(errors, list | tuple):
        return [plain_errors(v) for v in errors]
    return str(errors)


def summarise_errors(errors: Any) -> str:
    """One line naming each failing field and its first message: ``"items.0.sku: Required."``."""
    first: dict[str, str] = {}
    for path, message in error_messages(errors):
        first.setdefault(path, message)
    return "; ".join(f"{path}: {message}" if path else message for path, message in first.items())


def error_messages(errors: Any, prefix: str = "") -> list[tuple[str, str]]:
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
