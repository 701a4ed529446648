"""Flow control declared on a reactor: how many of its runs may be in flight per key.

``Meta.concurrency = Concurrency(key="{tenant_id}", limit=5, on_limit="queue")``: at most
``limit`` runs of the reactor with the same key are in flight (created and not ended). What a
start over the limit does is ``on_limit``:

``"queue"``
    The run is stored ``queued``: it holds no worker and starts, in arrival order within its
    key, when a run of the key ends.
``"skip"``
    Nothing is stored; the caller gets the outcome of the newest run in flight with the key
    (``limit=1``: a singleton whose repeated starts return the one run).
``"cancel_newest"``
    The new run is stored ``cancelled``, saying why: the runs in flight go on.
``"cancel_in_progress"``
    The oldest runs in flight with the key are cancelled (rolled back) to make room, and the
    new run is queued until they end (``limit=1``: the newest start wins).

The Django layer (``store.flow``, ``services.flow``) keeps the count in the database.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass

from ..exceptions import DefinitionError
from .coordination import resolve_key

__all__ = ["ON_LIMIT", "Concurrency", "check_concurrency"]

ON_LIMIT = ("queue", "skip", "cancel_newest", "cancel_in_progress")


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` runs in flight per ``key`` (a format string over the run's inputs,
    such as ``"{tenant_id}"``; ``""``: one key for every run of the reactor); ``on_limit``
    says what a start over the limit does (see the module's docstring)."""

    key: str = ""
    limit: int = 1
    on_limit: str = "queue"

    def key_of(self, inputs: Mapping[str, object], reactor: str) -> str:
        """The key of a run on ``inputs``; CoordinationKeyError naming the declaration when an
        input it names is missing."""
        if not self.key:
            return ""
        return resolve_key(self.key, inputs, f"{reactor}.Meta.concurrency")


def check_concurrency(
    value: object, reactor: str, input_fields: frozenset[str] | None
) -> Concurrency | None:
    """``Meta.concurrency`` checked at class definition; DefinitionError naming the reactor
    and the field otherwise."""
    if value is None:
        return None
    where = f"{reactor}.Meta.concurrency"
    if not isinstance(value, Concurrency):
        raise DefinitionError(
            f'{where} must be Concurrency(key="{{tenant_id}}", limit=5, on_limit="queue"), '
            f"got {value!r}"
        )
    if not isinstance(value.key, str):
        raise DefinitionError(
            f"{where}.key must be a format string over the inputs, such as "
            f'"{{tenant_id}}" ("" for one key for every run), got {value.key!r}'
        )
    try:
        names = [
            field for _, field, _, _ in string.Formatter().parse(value.key) if field is not None
        ]
    except ValueError as exc:
        raise DefinitionError(
            f"{where}.key {value.key!r} is not a valid format string: {exc}"
        ) from None
    for name in names:
        top = name.split(".", 1)[0].split("[", 1)[0]
        if not top:
            raise DefinitionError(
                f'{where}.key {value.key!r} has an empty {{}}: name an input, as in "{{tenant_id}}"'
            )
        if input_fields is not None and top not in input_fields:
            raise DefinitionError(
                f"{where}.key {value.key!r} names {{{top}}}, which is not an input of "
                f"{reactor} (inputs: {', '.join(sorted(input_fields)) or 'none'})"
            )
    if isinstance(value.limit, bool) or not isinstance(value.limit, int) or value.limit < 1:
        raise DefinitionError(
            f"{where}.limit must be a positive whole number (runs in flight per key), got "
            f"{value.limit!r}"
        )
    if value.on_limit not in ON_LIMIT:
        raise DefinitionError(
            f"{where}.on_limit must be one of {', '.join(repr(s) for s in ON_LIMIT)}, got "
            f"{value.on_limit!r}"
        )
    return value
