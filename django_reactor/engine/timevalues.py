"""What a time value may be: the instants and durations django_reactor accepts, checked here.

A Python ``datetime`` holds the years 1 to 9999, and arithmetic that leaves them raises
``OverflowError``; a ``timedelta`` holds less than a billion days, a thread waits at most
``threading.TIMEOUT_MAX`` seconds at a time. Every time a caller gives (a sleep, a start time, a
delay, a deadline, a timeout, an interval, a TTL), declared in a class body or read from a
run's inputs and results, is checked by this module where it is given, so a value that is
infinite, not a number, negative, or too far away for a date is refused with a plain message
there, before anything is written, and never fails later as an ``OverflowError``.

The bounds leave a margin inside what a ``datetime`` holds: a stored time shown in any time
zone, or moved on by a lease or a grace period, still fits. A duration may be as long as the
time left from now to :data:`LATEST`: added to now, it gives a date.
"""

from __future__ import annotations

import datetime as dt
import math
import threading

from ..exceptions import DefinitionError, InvalidTime

__all__ = [
    "EARLIEST",
    "LATEST",
    "LONGEST_WAIT",
    "ago",
    "declared",
    "duration",
    "earlier",
    "instant",
    "later",
    "longest",
    "seconds",
    "wait_slice",
]

#: The earliest time django_reactor accepts (a day after the first a ``datetime`` holds).
EARLIEST = dt.datetime(1, 1, 2, tzinfo=dt.UTC)
#: The latest time django_reactor accepts (a year before the last a ``datetime`` holds).
LATEST = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
#: The longest one wait of a thread (``Event.wait``, ``time.sleep``) is given: about 31 years,
#: well inside what both take on every platform (``threading.TIMEOUT_MAX``, and the monotonic
#: clock plus the wait in nanoseconds, which ``time.sleep`` refuses past 2**63).
LONGEST_WAIT = min(1e9, threading.TIMEOUT_MAX)

_YEAR = 365.25 * 86400


def seconds(
    value: object, what: str, *, zero: bool = False, now: dt.datetime | None = None
) -> float:
    """``value`` (a ``timedelta`` or a number of seconds) as seconds; InvalidTime naming
    ``what`` for anything else: not a number, NaN, infinite, negative, zero (unless ``zero``),
    or longer than the time from ``now`` (default: the current time) to :data:`LATEST`."""
    amount = _amount(value, what, zero=zero)
    start = _utc(now) if now is not None else dt.datetime.now(dt.UTC)
    left = longest(start)
    if amount > left:
        raise InvalidTime(
            f"{what} is {_length(amount)}, longer than a date can hold: the latest time "
            f"django_reactor accepts, {LATEST:%Y-%m-%d} (UTC), is {_length(left)} after "
            f"{start:%Y-%m-%d}; give a shorter one"
        )
    return amount


def ago(value: object, what: str, *, now: dt.datetime) -> dt.datetime:
    """The time ``value`` (a ``timedelta`` or a number of seconds, zero or more) before
    ``now``; InvalidTime naming ``what`` for a value :func:`seconds` refuses, and for one that
    reaches back before :data:`EARLIEST`."""
    return earlier(now, _amount(value, what, zero=True), what)


def duration(
    value: object, what: str, *, zero: bool = False, now: dt.datetime | None = None
) -> dt.timedelta:
    """:func:`seconds` as a ``timedelta`` (a ``timedelta`` given comes back as it is)."""
    amount = seconds(value, what, zero=zero, now=now)
    return value if isinstance(value, dt.timedelta) else dt.timedelta(seconds=amount)


def instant(value: object, what: str, *, text: bool = False) -> dt.datetime:
    """``value`` as an aware datetime between :data:`EARLIEST` and :data:`LATEST`; with
    ``text``, ISO 8601 text with an offset is read too. InvalidTime naming ``what`` otherwise."""
    if text and isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise InvalidTime(f"{what} got {value!r}, which is not an ISO 8601 time") from None
    if not isinstance(value, dt.datetime):
        raise InvalidTime(
            f"{what} must be a datetime{' (or ISO 8601 text)' if text else ''}, got "
            f"{type(value).__name__} {value!r}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTime(
            f"{what} got {value.isoformat()}, a time without a time zone; give an aware "
            "datetime (django.utils.timezone.now(), or tzinfo=...)"
        )
    if value > LATEST:
        raise InvalidTime(
            f"{what} is {value.isoformat()}, later than a date can hold: the latest time "
            f"django_reactor accepts is {LATEST.isoformat()}; give an earlier one"
        )
    if value < EARLIEST:
        raise InvalidTime(
            f"{what} is {value.isoformat()}, earlier than a date can hold: the earliest time "
            f"django_reactor accepts is {EARLIEST.isoformat()}; give a later one"
        )
    return value


def later(base: dt.datetime, amount: float | dt.timedelta, what: str) -> dt.datetime:
    """``base`` moved on by ``amount`` (seconds or a ``timedelta``, already checked by
    :func:`seconds`); InvalidTime naming ``what`` when that is past :data:`LATEST`."""
    length = amount.total_seconds() if isinstance(amount, dt.timedelta) else float(amount)
    if length > (LATEST - _utc(base)).total_seconds():
        raise InvalidTime(
            f"{what} is {_length(length)} after {base.isoformat()}, later than a date can "
            f"hold: the latest time django_reactor accepts is {LATEST.isoformat()}; give a "
            "shorter one"
        )
    return base + (amount if isinstance(amount, dt.timedelta) else dt.timedelta(seconds=length))


def earlier(base: dt.datetime, amount: float | dt.timedelta, what: str) -> dt.datetime:
    """``base`` moved back by ``amount`` (seconds or a ``timedelta``, already checked by
    :func:`seconds`); InvalidTime naming ``what`` when that is before :data:`EARLIEST`."""
    length = amount.total_seconds() if isinstance(amount, dt.timedelta) else float(amount)
    if length > (_utc(base) - EARLIEST).total_seconds():
        raise InvalidTime(
            f"{what} is {_length(length)} before {base.isoformat()}, earlier than a date can "
            f"hold: the earliest time django_reactor accepts is {EARLIEST.isoformat()}; give a "
            "shorter one"
        )
    return base - (amount if isinstance(amount, dt.timedelta) else dt.timedelta(seconds=length))


def longest(now: dt.datetime | None = None) -> float:
    """The longest duration, in seconds, a date can hold from ``now`` (default: the current
    time): what is left until :data:`LATEST`."""
    start = _utc(now) if now is not None else dt.datetime.now(dt.UTC)
    return max((LATEST - start).total_seconds(), 0.0)


def declared(value: object, what: str, *, zero: bool = False) -> float:
    """A duration declared in a class body (``Meta.deadline``, a step's ``timeout``, a lock's
    ``ttl``...) as seconds: :func:`seconds`, refusing with DefinitionError."""
    try:
        return seconds(value, what, zero=zero)
    except InvalidTime as exc:
        raise DefinitionError(str(exc)) from None


def wait_slice(amount: float) -> float:
    """``amount`` seconds as a thread can wait them at once: between 0 and
    :data:`LONGEST_WAIT`. A loop that waits for a time waits again for what is left; NaN, which
    no time reaches, waits the longest (never a loop that spins)."""
    if math.isnan(amount):
        return LONGEST_WAIT
    return min(max(amount, 0.0), LONGEST_WAIT)


def _amount(value: object, what: str, *, zero: bool) -> float:
    """``value`` as seconds: a finite ``timedelta`` or number, not negative (nor zero unless
    ``zero``); InvalidTime naming ``what`` otherwise."""
    if isinstance(value, dt.timedelta):
        amount = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            amount = float(value)
        except OverflowError:  # an int too large for a float
            raise InvalidTime(
                f"{what} is a number of seconds too large for any date; give a shorter one"
            ) from None
    else:
        raise InvalidTime(
            f"{what} must be a timedelta or a number of seconds, got {type(value).__name__} "
            f"{value!r}"
        )
    if math.isnan(amount):
        raise InvalidTime(f"{what} is not a number (NaN); give a timedelta or a number of seconds")
    if amount < 0 and zero:
        raise InvalidTime(f"{what} cannot be negative, got {value!r}")
    if amount <= 0 and not zero:
        raise InvalidTime(f"{what} must be longer than zero, got {value!r}")
    if math.isinf(amount):
        raise InvalidTime(
            f"{what} cannot be infinite; give a finite timedelta or number of seconds"
        )
    return amount


def _utc(moment: dt.datetime) -> dt.datetime:
    # Aware times compare and subtract across offsets; a naive one is read as UTC.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _length(amount: float) -> str:
    if amount >= 2 * _YEAR:
        return f"{amount:g} s (about {amount / _YEAR:,.0f} years)"
    return f"{amount:g} s"
