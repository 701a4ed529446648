"""When a schedule ticks: a cron expression read in a time zone, or a fixed interval.

Pure functions of time (no database). Cron expressions are parsed and stepped by ``croniter``;
this module only decides what a tick is around daylight saving time:

- a wall-clock time the clock skips (02:30 on the day clocks spring forward) fires once, at the
  first moment after the jump (03:00), as ``croniter`` steps it;
- a wall-clock time that happens twice (02:30 on the day clocks fall back) fires once, at its
  first occurrence, unless the expression's hour field is ``*`` (``*/15 * * * *`` keeps firing
  every 15 minutes of real time through the repeated hour).

An interval (``every``) ticks at the multiples of it since the Unix epoch, in UTC: every 15
minutes is :00, :15, :30 and :45 of every hour, whatever the time zone and whenever the
schedule was created.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from ..engine import timevalues
from ..exceptions import InvalidTime

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
ONE_MICROSECOND = dt.timedelta(microseconds=1)
#: The shortest interval a schedule may have.
SHORTEST_EVERY = dt.timedelta(seconds=1)
#: ``@`` shorthands accepted besides the five fields.
ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
# "1h30m", "90s", "2d", "1w": numbers with units, largest first.
_EVERY = re.compile(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_UNITS = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
# Ticks skipped in a row at most around a daylight saving change (the repeated hour).
_MAX_SKIPPED = 120


def check_cron(expression: str) -> str:
    """``expression`` tidied (surrounding blanks removed); ValueError saying what is wrong."""
    text = " ".join(str(expression).split())
    if not text:
        raise ValueError("enter a cron expression such as '30 2 * * *'")
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise ValueError(f"{text!r} is not a cron shorthand; use one of {', '.join(ALIASES)}")
        text = text.lower()
    elif len(text.split()) != 5:
        raise ValueError(
            f"{text!r} has {len(text.split())} fields; a cron expression has five: minute, "
            "hour, day of month, month and day of week, such as '30 2 * * *'"
        )
    try:
        croniter(text, dt.datetime.now(UTC)).get_next(dt.datetime)
    except CroniterError as exc:
        raise ValueError(f"{text!r} is not a cron expression croniter can read: {exc}") from None
    return text


def check_zone(name: str) -> ZoneInfo:
    """The time zone named ``name`` (an IANA name such as Europe/Berlin); ValueError if none."""
    text = str(name).strip()
    if not text:
        raise ValueError("enter a time zone such as UTC or Europe/Berlin")
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"{text!r} is not a time zone this system knows; use an IANA name such as UTC, "
            "Europe/Berlin or America/New_York"
        ) from None


def parse_every(value: Any) -> dt.timedelta:
    """An interval from a ``timedelta``, a number of seconds, or text such as ``90s``,
    ``15m``, ``1h30m``, ``2d`` or ``1w`` (a bare number is seconds); ValueError otherwise.

    Whole seconds only, at least one second, and no longer than a date can hold from now (the
    next tick must be a date).
    """
    amount: object = value
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        match = _EVERY.match(text)
        if text.isdigit():
            amount = int(text)
        elif text and match is not None:
            counts = zip(match.groups(), _UNITS, strict=True)
            amount = sum(int(n) * size for n, (_, size) in counts if n)
        else:
            raise ValueError(
                f"{value!r} is not an interval; write it like 90s, 15m, 1h30m, 2d or 1w "
                "(or a number of seconds)"
            )
    elif not isinstance(value, dt.timedelta | int | float) or isinstance(value, bool):
        raise ValueError(f"an interval is a duration such as 15m, got {type(value).__name__}")
    every = timevalues.duration(amount, "an interval", zero=True)
    if every < SHORTEST_EVERY:
        raise ValueError(f"an interval must be at least 1 second, got {format_every(every)}")
    if every % dt.timedelta(seconds=1):
        raise ValueError(f"an interval must be whole seconds, got {every.total_seconds()} s")
    return every


def format_every(every: dt.timedelta) -> str:
    """``every`` written as :func:`parse_every` reads it (``1h30m``; ``0s`` for nothing)."""
    seconds = int(every.total_seconds())
    if seconds <= 0:
        return f"{every.total_seconds():g}s"
    parts = []
    for unit, size in _UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


@dataclass(frozen=True)
class Cadence:
    """The ticks of one schedule: ``cron`` read in ``zone``, or every ``every``.

    Every method takes and returns aware datetimes; what it returns is in UTC.
    """

    cron: str = ""
    every: dt.timedelta | None = None
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))

    @classmethod
    def of(cls, cron: str, every: dt.timedelta | None, zone: str) -> Cadence:
        """The cadence of stored values (ValueError when they are not valid)."""
        if every is not None:
            return cls(every=parse_every(every), zone=check_zone(zone))
        return cls(cron=check_cron(cron), zone=check_zone(zone))

    def describe(self) -> str:
        """``cron 30 2 * * * (Europe/Berlin)`` or ``every 15m``."""
        if self.every is not None:
            return f"every {format_every(self.every)}"
        return f"cron {self.cron} ({self.zone.key})"

    def after(self, moment: dt.datetime) -> dt.datetime:
        """The first tick strictly after ``moment``."""
        if self.every is not None:
            what = f"the tick after {moment.isoformat()} of {self.describe()}"
            return timevalues.later(self.at_or_before(moment), self.every, what)
        start = moment
        for _ in range(_MAX_SKIPPED):
            start = self._step(start, forward=True)
            if self._counts(start):
                return start
        raise ValueError(f"{self.describe()} found no tick after {moment.isoformat()}")

    def before(self, moment: dt.datetime) -> dt.datetime:
        """The last tick strictly before ``moment``."""
        if self.every is not None:
            return self.at_or_before(moment - ONE_MICROSECOND)
        start = moment
        for _ in range(_MAX_SKIPPED):
            start = self._step(start, forward=False)
            if self._counts(start):
                return start
        raise ValueError(f"{self.describe()} found no tick before {moment.isoformat()}")

    def at_or_before(self, moment: dt.datetime) -> dt.datetime:
        """``moment`` when it is a tick, else the last tick before it."""
        if self.every is not None:
            return EPOCH + ((moment - EPOCH) // self.every) * self.every
        return self.before(moment + ONE_MICROSECOND)

    # ---------------------------------------------------------------- cron

    def _step(self, moment: dt.datetime, *, forward: bool) -> dt.datetime:
        side = "after" if forward else "before"
        try:
            local = moment.astimezone(self.zone)
            it = croniter(self.cron, local)
            found = it.get_next(dt.datetime) if forward else it.get_prev(dt.datetime)
            tick = found.astimezone(UTC)
        except CroniterError as exc:
            raise ValueError(f"{self.describe()}: {exc}") from None
        except (ValueError, OverflowError):  # past the years a datetime holds
            raise InvalidTime(
                f"{self.describe()} has no tick {side} {moment.isoformat()} that a date can hold"
            ) from None
        what = f"the tick {side} {moment.isoformat()} of {self.describe()}"
        return timevalues.instant(tick, what)

    def _counts(self, tick: dt.datetime) -> bool:
        """False for the second occurrence of a wall-clock time the clock repeats, unless the
        expression fires every hour."""
        if self._every_hour:
            return True
        local = tick.astimezone(self.zone)
        if local.fold == 0:
            return True
        return local.replace(fold=0).utcoffset() == local.utcoffset()

    @property
    def _every_hour(self) -> bool:
        expanded = croniter(self.cron).expanded
        return bool(expanded[1] == ["*"])
