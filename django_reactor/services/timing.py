"""When a run starts and by when it must be done: ``run(..., at=, delay=, deadline=)`` and
``Meta.deadline``, checked before anything is written."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ..exceptions import ReactorError

if TYPE_CHECKING:
    from ..engine.definition import ReactorDefinition


@dataclass(frozen=True, slots=True)
class Timing:
    """A run's start time (None: now) and deadline (None: none)."""

    start_at: dt.datetime | None = None
    deadline_at: dt.datetime | None = None

    @classmethod
    def of(
        cls,
        reactor: Any,
        *,
        at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        deadline: dt.timedelta | dt.datetime | None = None,
    ) -> Timing:
        """Check the caller's times; ReactorError saying what is wrong with one."""
        definition: ReactorDefinition = reactor.definition
        name = definition.reactor_class.__qualname__
        now = timezone.now()
        if at is not None and delay is not None:
            raise ReactorError(f"{name}.run() takes at= or delay=, not both")
        start: dt.datetime | None = None
        if at is not None:
            start = _aware(at, f"{name}.run(at=...)")
        elif delay is not None:
            start = now + dt.timedelta(seconds=_seconds(delay, f"{name}.run(delay=...)", zero=True))
        if start is not None and start <= now:
            start = None  # a time already past: start now
        base = start or now
        deadline_at: dt.datetime | None = None
        if isinstance(deadline, dt.datetime):
            deadline_at = _aware(deadline, f"{name}.run(deadline=...)")
            if deadline_at <= base:
                raise ReactorError(
                    f"{name}.run(deadline={deadline_at.isoformat()}) is not after the run's "
                    f"start ({base.isoformat()}): a deadline must leave the run some time"
                )
        elif deadline is not None:
            deadline_at = base + dt.timedelta(
                seconds=_seconds(deadline, f"{name}.run(deadline=...)", zero=False)
            )
        elif definition.deadline is not None:
            deadline_at = base + dt.timedelta(seconds=definition.deadline)
        return cls(start, deadline_at)

    @classmethod
    def default(cls, definition: ReactorDefinition) -> Timing:
        """Starting now, under the reactor's own ``Meta.deadline``."""
        if definition.deadline is None:
            return cls()
        return cls(None, timezone.now() + dt.timedelta(seconds=definition.deadline))


def _aware(value: Any, what: str) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise ReactorError(f"{what} takes a datetime, got {type(value).__name__} {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ReactorError(
            f"{what} got {value.isoformat()}, a time without a time zone; give an aware "
            "datetime (django.utils.timezone.now() + ..., or tzinfo=...)"
        )
    return value


def _seconds(value: Any, what: str, *, zero: bool) -> float:
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ReactorError(
            f"{what} takes a timedelta or a number of seconds, got {type(value).__name__} {value!r}"
        )
    if seconds < 0 or (not zero and seconds == 0) or seconds != seconds:
        raise ReactorError(
            f"{what} cannot be {'negative' if zero else 'zero or shorter'}, got {value!r}"
        )
    return seconds
