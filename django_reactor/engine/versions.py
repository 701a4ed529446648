"""A reactor's version: ``Meta.version``, and ``Meta.version_of`` for a version kept in code.

Every run records the version of the code it started on. Without ``Meta.version`` that is the
definition's structural fingerprint (``definition_hash``): a change that keeps every step a run
recorded lets the run go on under the new code, others park it ``definition_changed``. With
``Meta.version`` the run records that label, and only code of the same version runs it: a worker
without it hands the run back for a worker that has it.

Two versions live side by side during a migration: the current class, which starts new runs,
and a kept one that only finishes the runs of its version::

    class PlaceOrder(Reactor):              # starts new runs, as version "2"
        class Meta:
            version = "2"

    class PlaceOrderV1(Reactor):            # finishes the runs that started on version "1"
        class Meta:
            version_of = PlaceOrder
            version = "1"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..exceptions import DefinitionError

__all__ = ["MAX_VERSION_LENGTH", "declared_name", "declared_version"]

#: A version label: letters, digits and ``._-``, starting with a letter or a digit.
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_VERSION_LENGTH = 64


def declared_version(value: object, reactor: str) -> str:
    """``Meta.version`` as stored with each run (``""``: not declared, the fingerprint is it)."""
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not (
        isinstance(value, str) and len(value) <= MAX_VERSION_LENGTH and VERSION.fullmatch(value)
    ):
        raise DefinitionError(
            f"{reactor}.Meta.version must be a short label of letters, digits and '._-' "
            f'(at most {MAX_VERSION_LENGTH} characters, such as "2" or "2026-12"), got {value!r}'
        )
    return value


def declared_name(cls: type, meta: Mapping[str, Any]) -> str:
    """The name a reactor class registers under: ``Meta.name``, else the name of the reactor
    ``Meta.version_of`` names (a kept version shares its reactor's name), else the class's
    dotted path."""
    reactor = cls.__qualname__
    kept_of = meta.get("version_of")
    name = meta.get("name")
    if kept_of is None:
        name = name or f"{cls.__module__}.{cls.__qualname__}"
        if not isinstance(name, str) or not name:
            raise DefinitionError(f"{reactor}.Meta.name must be a non-empty string")
        return name
    if meta.get("version") is None:
        raise DefinitionError(
            f"{reactor}.Meta.version_of needs Meta.version: the version of the runs this class "
            'finishes (such as version = "1")'
        )
    definition = getattr(kept_of, "definition", None)
    if isinstance(kept_of, str) and kept_of:
        of_name = kept_of
    elif isinstance(kept_of, type) and definition is not None:
        of_name = definition.name
    else:
        raise DefinitionError(
            f"{reactor}.Meta.version_of must be the reactor class this is an older version of "
            f"(or its registered name), got {kept_of!r}"
        )
    if name is not None and name != of_name:
        raise DefinitionError(
            f"{reactor}.Meta.name is {name!r} but Meta.version_of names {of_name!r}: a kept "
            "version has its reactor's name; remove Meta.name"
        )
    if definition is not None and definition.version == declared_version(
        meta.get("version"), reactor
    ):
        raise DefinitionError(
            f"{reactor} keeps version {definition.version!r} of {of_name}, which is the "
            "version the current class declares: give the kept class the version of the runs "
            "it finishes (the one before)"
        )
    return of_name
