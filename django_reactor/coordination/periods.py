"""Calendar buckets for ``Period(key, every)``: at most one successful run per bucket.

Buckets are UTC calendar units (ISO weeks) or, for a ``timedelta``, consecutive spans of that
length counted from the Unix epoch. ``now`` should be the coordination backend's
:meth:`~django_reactor.coordination.backends.base.CoordinationBackend.server_time`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

CALENDAR_UNITS = ("minute", "hour", "day", "week", "month", "year")

# Longest length of each unit, for how long a claimed bucket's marker must be kept.
_LONGEST: dict[str, float] = {
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 7 * 86400.0,
    "month": 31 * 86400.0,
    "year": 366 * 86400.0,
}


def _as_datetime(now: float | datetime) -> datetime:
    if isinstance(now, datetime):
        if now.tzinfo is None:
            raise ValueError("bucket_for() needs an aware datetime or epoch seconds")
        return now.astimezone(UTC)
    return datetime.fromtimestamp(now, tz=UTC)


def _seconds(every: timedelta) -> float:
    seconds = every.total_seconds()
    if seconds <= 0:
        raise ValueError(f"a period must be positive, got {every!r}")
    return seconds


def bucket_for(every: str | timedelta, now: float | datetime) -> str:
    """The bucket that ``now`` falls in, as a string naming it.

    >>> bucket_for("day", 0.0)
    '1970-01-01'
    >>> bucket_for("week", datetime(2024, 12, 30, tzinfo=UTC))
    '2025-W01'
    >>> bucket_for(timedelta(minutes=15), 3600.0)
    '900s:4'
    """
    if isinstance(every, timedelta):
        seconds = _seconds(every)
        moment = now.timestamp() if isinstance(now, datetime) else float(now)
        return f"{seconds:g}s:{math.floor(moment / seconds)}"
    at = _as_datetime(now)
    if every == "minute":
        return at.strftime("%Y-%m-%dT%H:%M")
    if every == "hour":
        return at.strftime("%Y-%m-%dT%H")
    if every == "day":
        return at.strftime("%Y-%m-%d")
    if every == "week":
        year, week, _ = at.isocalendar()
        return f"{year}-W{week:02d}"
    if every == "month":
        return at.strftime("%Y-%m")
    if every == "year":
        return at.strftime("%Y")
    raise ValueError(
        f"unknown period {every!r}: use one of {', '.join(CALENDAR_UNITS)} or a timedelta"
    )


def period_seconds(every: str | timedelta) -> float:
    """The longest length of one bucket, in seconds (a month is 31 days)."""
    if isinstance(every, timedelta):
        return _seconds(every)
    if every not in _LONGEST:
        raise ValueError(
            f"unknown period {every!r}: use one of {', '.join(CALENDAR_UNITS)} or a timedelta"
        )
    return _LONGEST[every]
