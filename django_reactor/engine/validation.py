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
    return "; ".join(
        f"{path}: {message}" if path else message for path, message in _first_messages(errors, "")
    )


def _first_messages(errors: Any, prefix: str) -> list[tuple[str, str]]:
    if isinstance(errors, Mapping):
        found: list[tuple[str, str]] = []
        for key, value in errors.items():
            path = prefix if key == "non_field_errors" else (f"{prefix}.{key}" if prefix else key)
            found.extend(_first_messages(value, path))
        return found
    if isinstance(errors, list):
        if errors and all(isinstance(e, str) for e in errors):
            return [(prefix, errors[0])]
        found = []
        for index, item in enumerate(errors):
            if item:
                found.extend(_first_messages(item, f"{prefix}.{index}" if prefix else str(index)))
        return found
    return [(prefix, str(errors))]
