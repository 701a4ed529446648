"""When a run starts and by when it must be done: ``run(..., at=, delay=, deadline=)`` and
``Meta.deadline``, checked before anything is written (``engine.timevalues`` says what a time
may be)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ..engine import timevalues
from ..exceptions import InvalidTime

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
        """Check the caller's times; InvalidTime saying what is wrong with one."""
        definition: ReactorDefinition = reactor.definition
        name = definition.reactor_class.__qualname__
        now = timezone.now()
        if at is not None and delay is not None:
            raise InvalidTime(f"{name}.run() takes at= or delay=, not both")
        start: dt.datetime | None = None
        if at is not None:
            start = timevalues.instant(at, f"{name}.run(at=...)")
        elif delay is not None:
            what = f"{name}.run(delay=...)"
            start = timevalues.later(now, timevalues.seconds(delay, what, zero=True, now=now), what)
        if start is not None and start <= now:
            start = None  # a time already past: start now
        base = start or now
        deadline_at: dt.datetime | None = None
        if isinstance(deadline, dt.datetime):
            deadline_at = timevalues.instant(deadline, f"{name}.run(deadline=...)")
            if deadline_at <= base:
                raise InvalidTime(
                    f"{name}.run(deadline={deadline_at.isoformat()}) is not after the run's "
                    f"start ({base.isoformat()}): a deadline must leave the run some time"
                )
        elif deadline is not None:
            what = f"{name}.run(deadline=...)"
            deadline_at = timevalues.later(
                base, timevalues.seconds(deadline, what, now=base), f"{what} from the run's start"
            )
        elif definition.deadline is not None:
            deadline_at = _meta_deadline(definition, base)
        return cls(start, deadline_at)

    @classmethod
    def default(cls, definition: ReactorDefinition) -> Timing:
        """Starting now, under the reactor's own ``Meta.deadline``."""
        if definition.deadline is None:
            return cls()
        return cls(None, _meta_deadline(definition, timezone.now()))


def _meta_deadline(definition: ReactorDefinition, start: dt.datetime) -> dt.datetime:
    assert definition.deadline is not None
    name = definition.reactor_class.__qualname__
    what = f"{name}.Meta.deadline from the run's start"
    return timevalues.later(start, definition.deadline, what)
