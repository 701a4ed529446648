"""Coordination declared on reactors and steps: locks, semaphores, rate limits, periods and
ordered locks.

These are declarations only: what to hold, keyed on what. A reactor declares them in
``Meta.coordination`` (keys computed from its inputs); a step class in its ``coordination``
attribute (keys computed from the step's resolved arguments). The Django layer
(:mod:`django_reactor.coordinate`) acquires and releases them on a backend.

A key is a format string over the inputs or arguments (``"order-{order_id}"``) or a callable
taking them by name and returning a string.
"""

from __future__ import annotations

import datetime as dt
import inspect
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, Protocol

from ..exceptions import DefinitionError
from . import timevalues

if TYPE_CHECKING:
    from .serialization import JSONObject

#: A key: a format string over the run's inputs (or the step's arguments), or a callable
#: taking them by name and returning the key.
KeySpec = str | Callable[..., object]

#: Rate-limit window names accepted in ``limits={...}``, in seconds.
WINDOW_NAMES = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}

PERIODS = ("minute", "hour", "day", "week", "month", "year")


#: The status :meth:`Coordinator.exit` gets for a run that failed before its first step.
NOT_STARTED = "not_started"


class CoordinationKeyError(Exception):
    """A coordination key could not be computed (the run fails before anything is acquired)."""


class DispatchRefused(Exception):
    """An async unit would wait for a lock its own dispatching run holds (a deadlock)."""


def _check_key_spec(key: object, what: str) -> KeySpec:
    if isinstance(key, str):
        if not key:
            raise DefinitionError(f"{what} needs a non-empty key")
        try:
            list(string.Formatter().parse(key))
        except ValueError as exc:
            raise DefinitionError(
                f"{what} key {key!r} is not a valid format string: {exc}"
            ) from None
        return key
    if callable(key):
        return key
    raise DefinitionError(
        f"{what} key must be a format string such as 'order-{{order_id}}' or a callable, "
        f"got {key!r}"
    )


def _positive(value: object, what: str, *, allow_zero: bool = False) -> float:
    return timevalues.declared(value, what, zero=allow_zero)


def resolve_key(spec: KeySpec, values: Mapping[str, object], what: str) -> str:
    """The key for ``values`` (a run's inputs, or a step's arguments).

    Raises CoordinationKeyError naming the declaration and the reason.
    """
    key: object
    try:
        if isinstance(spec, str):
            key = spec.format_map(_Values(values))
        else:
            parameters = inspect.signature(spec).parameters.values()
            if any(p.kind is p.VAR_KEYWORD for p in parameters):
                key = spec(**values)
            else:
                names = {p.name for p in parameters}
                key = spec(**{k: v for k, v in values.items() if k in names})
    except CoordinationKeyError:
        raise
    except Exception as exc:
        raise CoordinationKeyError(
            f"the key of {what} could not be computed: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(key, str) or not key:
        raise CoordinationKeyError(f"the key of {what} must be a non-empty string, got {key!r}")
    if len(key) > 200:
        raise CoordinationKeyError(f"the key of {what} is longer than 200 characters")
    return key


class _Values(dict[str, object]):
    def __missing__(self, name: str) -> NoReturn:
        available = ", ".join(sorted(self)) or "nothing"
        raise CoordinationKeyError(f"it names {{{name}}}, but only {available} are given")


@dataclass(frozen=True)
class Lock:
    """An exclusive lock on ``key``, held while the run (or the step) runs.

    ``ttl``: seconds the lock lives without being extended (extended every ``ttl / 3`` while a
    process works on the run when ``auto_extend``); ``wait``: seconds an inline caller waits
    for it before the run fails with a contention error (a worker reschedules the run instead).
    Composed children share their root run's locks; every grant has a fencing number
    (``step_context().fences``).
    """

    key: KeySpec
    ttl: float = 60.0
    wait: float = 0.0
    auto_extend: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", _check_key_spec(self.key, "Lock"))
        object.__setattr__(self, "ttl", _positive(self.ttl, "Lock ttl"))
        object.__setattr__(self, "wait", _positive(self.wait, "Lock wait", allow_zero=True))

    kind = "lock"


@dataclass(frozen=True)
class Semaphore:
    """At most ``limit`` runs (or steps) hold ``key`` at once.

    A holder that dies gives its slot back within ``ttl`` seconds.
    """

    key: KeySpec
    limit: int = 1
    ttl: float = 60.0
    wait: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", _check_key_spec(self.key, "Semaphore"))
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise DefinitionError(f"Semaphore limit must be a positive integer, got {self.limit!r}")
        object.__setattr__(self, "ttl", _positive(self.ttl, "Semaphore ttl"))
        object.__setattr__(self, "wait", _positive(self.wait, "Semaphore wait", allow_zero=True))

    kind = "semaphore"


@dataclass(frozen=True)
class RateLimit:
    """Runs (or steps) of ``key`` start at most ``limits`` often, checked all at once.

    ``RateLimit("order-{customer}", limits={"second": 3, "minute": 100})`` or
    ``limits=[(3, 1.0), (100, 60.0)]`` (count, seconds); ``RateLimit(name="stripe")`` uses the
    limits named in ``REACTOR["RATE_LIMITS"]``, shared by every reactor that names them. A run
    is charged once, when it starts; a denied run holds nothing and waits ``retry_after``.
    """

    key: KeySpec | None = None
    limits: Mapping[str, int] | Sequence[tuple[int, float]] | None = None
    name: str | None = None
    wait: float = 0.0

    def __post_init__(self) -> None:
        if self.name is not None:
            if not isinstance(self.name, str) or not self.name:
                raise DefinitionError(
                    f"RateLimit name must be a non-empty string, got {self.name!r}"
                )
            if self.limits is not None:
                raise DefinitionError(
                    f"RateLimit(name={self.name!r}) takes its limits from REACTOR['RATE_LIMITS']; "
                    "give either name= or limits=, not both"
                )
        else:
            if self.key is None or self.limits is None:
                raise DefinitionError(
                    "RateLimit needs a key and limits= (or name= for a limit named in "
                    "REACTOR['RATE_LIMITS'])"
                )
            object.__setattr__(self, "limits", tuple(windows_of(self.limits)))
        if self.key is not None:
            object.__setattr__(self, "key", _check_key_spec(self.key, "RateLimit"))
        object.__setattr__(self, "wait", _positive(self.wait, "RateLimit wait", allow_zero=True))

    kind = "rate_limit"


def windows_of(limits: object) -> list[tuple[int, float]]:
    """``limits`` as ``[(count, seconds), ...]``; DefinitionError when malformed."""
    if isinstance(limits, Mapping):
        pairs = []
        for name, count in limits.items():
            if name not in WINDOW_NAMES:
                raise DefinitionError(
                    f"RateLimit window {name!r} is not one of {', '.join(WINDOW_NAMES)}"
                )
            pairs.append((count, WINDOW_NAMES[name]))
    elif isinstance(limits, Sequence) and not isinstance(limits, str):
        pairs = [tuple(pair) for pair in limits]
    else:
        raise DefinitionError(f"RateLimit limits must be a dict or a list of pairs, got {limits!r}")
    if not pairs:
        raise DefinitionError("RateLimit needs at least one window")
    checked = []
    for pair in pairs:
        if len(pair) != 2:
            raise DefinitionError(f"a RateLimit window is (count, seconds), got {pair!r}")
        count, seconds = pair
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise DefinitionError(f"a RateLimit count must be a positive integer, got {count!r}")
        checked.append((count, _positive(seconds, "a RateLimit window")))
    if len({seconds for _, seconds in checked}) != len(checked):
        raise DefinitionError(f"two RateLimit windows have the same length: {limits!r}")
    return checked


@dataclass(frozen=True)
class Period:
    """At most one successful run (or step) of ``key`` per calendar bucket (UTC).

    ``every``: "minute", "hour", "day", "week" (ISO), "month", "year", or a ``timedelta``. A
    second run in a claimed bucket halts before its first step, naming the run that claimed
    it (a step is skipped instead). Failed runs do not claim the bucket.
    """

    key: KeySpec
    every: str | dt.timedelta = "day"

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", _check_key_spec(self.key, "Period"))
        if isinstance(self.every, dt.timedelta):
            _positive(self.every, "Period every")
        elif self.every not in PERIODS:
            raise DefinitionError(
                f"Period every must be one of {', '.join(PERIODS)} or a timedelta, "
                f"got {self.every!r}"
            )

    kind = "period"


@dataclass(frozen=True)
class OrderedLock:
    """Runs of ``key`` complete in the order they were started.

    A run waits (rescheduled on a worker) until the runs started before it with the same key
    have finished. A head that makes no progress for ``poison_after`` seconds is skipped. With
    ``strict``, a failed run halts the rest of the chain until an operator resets it.
    """

    key: KeySpec
    poison_after: float = 600.0
    strict: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", _check_key_spec(self.key, "OrderedLock"))
        object.__setattr__(self, "poison_after", _positive(self.poison_after, "poison_after"))

    kind = "ordered_lock"


Declaration = Lock | Semaphore | RateLimit | Period | OrderedLock
DECLARATIONS = (Lock, Semaphore, RateLimit, Period, OrderedLock)


def check_declarations(value: object, where: str) -> tuple[Declaration, ...]:
    """``value`` as a tuple of declarations; DefinitionError when it is not one."""
    if value is None:
        return ()
    items = tuple(value) if isinstance(value, list | tuple) else None
    if items is None or not all(isinstance(item, DECLARATIONS) for item in items):
        raise DefinitionError(
            f"{where} must be a list of Lock, Semaphore, RateLimit, Period or OrderedLock, "
            f"got {value!r}"
        )
    kinds = [type(item).__name__ for item in items]
    for single in ("Period", "OrderedLock"):
        if kinds.count(single) > 1:
            raise DefinitionError(f"{where} declares more than one {single}")
    return items


# ---------------------------------------------------------------------------- the runtime protocol


@dataclass(frozen=True)
class Blocked:
    """Why a run (or a step) cannot go on now.

    ``kind``: ``"contention"`` (another holder; try again after ``retry_after`` seconds),
    ``"unavailable"`` (the backend cannot be reached: an infrastructure error, try again),
    ``"halt"`` (a period already claimed, an ordered chain halted: stop cleanly, or skip a
    step) or ``"fail"`` (a key that cannot be computed, an unknown named limit, too many
    snoozes: a permanent failure).
    """

    kind: str
    message: str
    retry_after: float = 0.0
    # The ErrorInfo kind when the run fails for it ("" : "contention" for contention, else
    # "coordination").
    error_kind: str = ""

    def __post_init__(self) -> None:
        if not self.error_kind:
            kind = "contention" if self.kind == "contention" else "coordination"
            object.__setattr__(self, "error_kind", kind)

    @property
    def retryable(self) -> bool:
        return self.kind in ("contention", "unavailable")


class StepHold(Protocol):
    """What a step's coordination holds while its body runs; :meth:`release` gives it back."""

    @property
    def fences(self) -> Mapping[str, int]: ...

    def release(self, succeeded: bool = True) -> None: ...


class Coordinator(Protocol):
    """Acquires and releases the coordination of one run (implemented by the Django layer).

    The executor calls :meth:`enter` before its first step (and again when the holds were
    lost), :meth:`exit` with the run's outcome when it stops for any reason (``None``: the
    process was interrupted), and :meth:`enter_step` around each coordinated step's body.
    """

    lost: bool
    # The fencing numbers of the locks the run holds, by key.
    fences: dict[str, int]
    # What was acquired since the executor last looked: written to the trace (``acquire``).
    notes: list[JSONObject]

    def enter(self, *, new: bool) -> Blocked | None: ...

    def enter_rollback(self) -> None: ...

    def exit(self, status: str | None) -> None: ...

    def snoozes_left(self) -> bool: ...

    def enter_step(
        self, step: str, declarations: tuple[Declaration, ...], arguments: Mapping[str, object]
    ) -> StepHold | Blocked: ...

    def enter_step_rollback(
        self, step: str, declarations: tuple[Declaration, ...], arguments: Mapping[str, object]
    ) -> StepHold | Blocked:
        """Take a step's locks and semaphore slots for its undo or compensate, waiting a
        bounded time for another holder; Blocked when they cannot be held (the handler must
        not run unlocked)."""
        ...
