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

``Meta.throttle = Throttle(key="{tenant_id}", limit=100, period=timedelta(minutes=1))``: at
most ``limit`` runs of a key start within any ``period``; a start over it is delayed (stored
``scheduled`` for the first time the key has room), never refused nor lost.

``Meta.batch = Batch(key="{tenant_id}", max_size=100, max_wait=timedelta(seconds=5))``: starts
of a key (the runs ``Meta.triggers`` start on events, and any other start) join the key's open
batch instead of starting a run each: one run receives the list of their inputs, as its input
``items``, and starts once the batch holds ``max_size`` of them or ``max_wait`` after its first.
Its ``Inputs`` serializer validates each item.

``Meta.debounce = Debounce(key="{user_id}", period=timedelta(seconds=30), max_wait=...)``:
starts of a key within ``period`` of each other collapse into one run, with the last call's
inputs, started once the key has been quiet for ``period`` (or ``max_wait`` after the first
call); every collapsed call returns that run.

The Django layer (``store.flow``, ``services.flow``) keeps the counts in the database.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..exceptions import DefinitionError
from . import timevalues
from .coordination import resolve_key

__all__ = [
    "BATCH_INPUT",
    "ON_LIMIT",
    "Batch",
    "Concurrency",
    "Debounce",
    "Keyed",
    "Throttle",
    "check_batch",
    "check_concurrency",
    "check_debounce",
    "check_throttle",
]

ON_LIMIT = ("queue", "skip", "cancel_newest", "cancel_in_progress")

#: The input a batched run receives its items as (a list of the starts' inputs, oldest first).
BATCH_INPUT = "items"

#: The ``Meta`` options a batched reactor cannot declare: each reads the run's inputs as one
#: start's, and a batch's run holds many starts'.
NOT_WITH_BATCH = ("debounce", "concurrency", "throttle", "subject", "attributes", "cancel_on")


@dataclass(frozen=True)
class Keyed:
    """A declaration applied per ``key``: a format string over the run's inputs, such as
    ``"{tenant_id}"`` (``""``: one key for every run of the reactor)."""

    #: The ``Meta`` option the declaration is given as (named in errors).
    option: ClassVar[str] = ""

    key: str = ""

    def key_of(self, inputs: Mapping[str, object], reactor: str) -> str:
        """The key of a run on ``inputs``; CoordinationKeyError naming the declaration when an
        input it names is missing."""
        if not self.key:
            return ""
        return resolve_key(self.key, inputs, f"{reactor}.Meta.{self.option}")


@dataclass(frozen=True)
class Concurrency(Keyed):
    """At most ``limit`` runs in flight per ``key``; ``on_limit`` says what a start over the
    limit does (see the module's docstring)."""

    option: ClassVar[str] = "concurrency"

    limit: int = 1
    on_limit: str = "queue"


@dataclass(frozen=True)
class Throttle(Keyed):
    """At most ``limit`` runs per ``key`` start within any ``period`` (a ``timedelta`` or
    seconds); a start over it is delayed until the key has room."""

    option: ClassVar[str] = "throttle"

    limit: int = 1
    period: object = 60.0

    @property
    def seconds(self) -> float:
        """``period`` in seconds (checked at class definition)."""
        return timevalues.seconds(self.period, "Throttle(period=...)")


@dataclass(frozen=True)
class Debounce(Keyed):
    """Starts of a ``key`` within ``period`` of each other collapse into one run with the last
    inputs, started when the key is quiet for ``period``, or at the latest ``max_wait`` after
    the first start (None: no bound)."""

    option: ClassVar[str] = "debounce"

    period: object = 30.0
    max_wait: object = None

    @property
    def seconds(self) -> float:
        """``period`` in seconds (checked at class definition)."""
        return timevalues.seconds(self.period, "Debounce(period=...)")

    @property
    def max_wait_seconds(self) -> float | None:
        """``max_wait`` in seconds, None for no bound."""
        if self.max_wait is None:
            return None
        return timevalues.seconds(self.max_wait, "Debounce(max_wait=...)")


@dataclass(frozen=True)
class Batch(Keyed):
    """Starts of a ``key`` collect into one run, which receives their inputs as the list
    ``items`` (oldest first) and starts when it holds ``max_size`` of them, or ``max_wait``
    (a ``timedelta`` or seconds) after the first."""

    option: ClassVar[str] = "batch"

    max_size: int = 100
    max_wait: object = 5.0

    @property
    def max_wait_seconds(self) -> float:
        """``max_wait`` in seconds (checked at class definition)."""
        return timevalues.seconds(self.max_wait, "Batch(max_wait=...)")


def check_batch(
    value: object, reactor: str, input_fields: frozenset[str] | None, options: Mapping[str, object]
) -> Batch | None:
    """``Meta.batch`` checked at class definition, with the reactor's other ``Meta``
    ``options``; DefinitionError naming the reactor and the field otherwise."""
    if value is None:
        return None
    where = f"{reactor}.Meta.batch"
    if not isinstance(value, Batch):
        raise DefinitionError(
            f'{where} must be Batch(key="{{tenant_id}}", max_size=100, '
            f"max_wait=timedelta(seconds=5)), got {value!r}"
        )
    _check_key(value.key, where, reactor, input_fields)
    size = value.max_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise DefinitionError(
            f"{where}.max_size must be a positive whole number (the most items one run "
            f"receives), got {size!r}"
        )
    timevalues.declared(value.max_wait, f"{where}.max_wait")
    clashing = [name for name in NOT_WITH_BATCH if options.get(name) is not None]
    if clashing:
        raise DefinitionError(
            f"{reactor}.Meta declares batch with {', '.join(clashing)}: "
            f"{'they read' if len(clashing) > 1 else 'it reads'} a run's inputs as one "
            f"start's, and a batch's run holds many starts' inputs (as {BATCH_INPUT!r}). Drop "
            f"{'them' if len(clashing) > 1 else 'it'}, or start one run per call without the "
            "batch"
        )
    return value


def check_debounce(
    value: object, reactor: str, input_fields: frozenset[str] | None
) -> Debounce | None:
    """``Meta.debounce`` checked at class definition; DefinitionError naming the reactor and
    the field otherwise."""
    if value is None:
        return None
    where = f"{reactor}.Meta.debounce"
    if not isinstance(value, Debounce):
        raise DefinitionError(
            f'{where} must be Debounce(key="{{user_id}}", period=timedelta(seconds=30)), '
            f"got {value!r}"
        )
    _check_key(value.key, where, reactor, input_fields)
    period = timevalues.declared(value.period, f"{where}.period")
    if value.max_wait is not None:
        longest = timevalues.declared(value.max_wait, f"{where}.max_wait")
        if longest < period:
            raise DefinitionError(
                f"{where}.max_wait ({longest} s) is shorter than its period ({period} s): a "
                "run would start before its key could be quiet; make it at least the period"
            )
    return value


def check_throttle(
    value: object, reactor: str, input_fields: frozenset[str] | None
) -> Throttle | None:
    """``Meta.throttle`` checked at class definition; DefinitionError naming the reactor and
    the field otherwise."""
    if value is None:
        return None
    where = f"{reactor}.Meta.throttle"
    if not isinstance(value, Throttle):
        raise DefinitionError(
            f'{where} must be Throttle(key="{{tenant_id}}", limit=100, '
            f"period=timedelta(minutes=1)), got {value!r}"
        )
    _check_key(value.key, where, reactor, input_fields)
    _check_limit(value.limit, where, "runs started per period and key")
    timevalues.declared(value.period, f"{where}.period")
    return value


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
    _check_key(value.key, where, reactor, input_fields)
    _check_limit(value.limit, where, "runs in flight per key")
    if value.on_limit not in ON_LIMIT:
        raise DefinitionError(
            f"{where}.on_limit must be one of {', '.join(repr(s) for s in ON_LIMIT)}, got "
            f"{value.on_limit!r}"
        )
    return value


def _check_limit(limit: object, where: str, what: str) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise DefinitionError(
            f"{where}.limit must be a positive whole number ({what}), got {limit!r}"
        )


def _check_key(
    value_key: object, where: str, reactor: str, input_fields: frozenset[str] | None
) -> None:
    """A key template: a format string whose fields are inputs of the reactor."""
    if not isinstance(value_key, str):
        raise DefinitionError(
            f"{where}.key must be a format string over the inputs, such as "
            f'"{{tenant_id}}" ("" for one key for every run), got {value_key!r}'
        )
    try:
        names = [
            field for _, field, _, _ in string.Formatter().parse(value_key) if field is not None
        ]
    except ValueError as exc:
        raise DefinitionError(
            f"{where}.key {value_key!r} is not a valid format string: {exc}"
        ) from None
    for name in names:
        top = name.split(".", 1)[0].split("[", 1)[0]
        if not top:
            raise DefinitionError(
                f'{where}.key {value_key!r} has an empty {{}}: name an input, as in "{{tenant_id}}"'
            )
        if input_fields is not None and top not in input_fields:
            raise DefinitionError(
                f"{where}.key {value_key!r} names {{{top}}}, which is not an input of "
                f"{reactor} (inputs: {', '.join(sorted(input_fields)) or 'none'})"
            )
