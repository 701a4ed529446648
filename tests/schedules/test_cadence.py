"""When schedules tick: cron expressions in a time zone (daylight saving time included) and
intervals. Pure functions, no database."""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest

from django_reactor.exceptions import InvalidTime
from django_reactor.services.cadence import (
    Cadence,
    check_cron,
    check_zone,
    format_every,
    parse_every,
)

UTC = dt.UTC
BERLIN = ZoneInfo("Europe/Berlin")


def ticks(cadence: Cadence, start: dt.datetime, count: int) -> list[dt.datetime]:
    found, moment = [], start
    for _ in range(count):
        moment = cadence.after(moment)
        found.append(moment)
    return found


def berlin(*args: int, fold: int = 0) -> dt.datetime:
    return dt.datetime(*args, tzinfo=BERLIN, fold=fold).astimezone(UTC)  # type: ignore[misc]


def test_a_daily_0230_on_the_spring_forward_day_fires_once_right_after_the_jump() -> None:
    # 2025-03-30: Berlin's clocks jump from 02:00 to 03:00; 02:30 does not exist that day.
    nightly = Cadence.of("30 2 * * *", None, "Europe/Berlin")
    fired = ticks(nightly, berlin(2025, 3, 28, 12, 0), 4)
    assert [t.astimezone(BERLIN).strftime("%m-%d %H:%M %Z") for t in fired] == [
        "03-29 02:30 CET",
        "03-30 03:00 CEST",  # the first moment after the jump
        "03-31 02:30 CEST",
        "04-01 02:30 CEST",
    ]
    assert [t.strftime("%H:%M") for t in fired] == ["01:30", "01:00", "00:30", "00:30"]  # UTC


def test_a_daily_0230_on_the_fall_back_day_fires_once_not_twice() -> None:
    # 2025-10-26: Berlin's clocks go from 03:00 back to 02:00; 02:30 happens twice.
    nightly = Cadence.of("30 2 * * *", None, "Europe/Berlin")
    fired = ticks(nightly, berlin(2025, 10, 25, 12, 0), 3)
    assert [t.astimezone(BERLIN).strftime("%m-%d %H:%M %Z") for t in fired] == [
        "10-26 02:30 CEST",  # the first 02:30 only
        "10-27 02:30 CET",
        "10-28 02:30 CET",
    ]
    # Backwards, the same ticks.
    assert nightly.before(fired[1]) == fired[0]
    assert nightly.before(fired[0]) == berlin(2025, 10, 25, 2, 30)


def test_an_every_half_hour_cron_keeps_real_time_through_the_repeated_hour() -> None:
    half_hourly = Cadence.of("*/30 * * * *", None, "Europe/Berlin")
    fired = ticks(half_hourly, berlin(2025, 10, 26, 1, 40), 6)
    assert [(t.astimezone(BERLIN).strftime("%H:%M %Z")) for t in fired] == [
        "02:00 CEST",
        "02:30 CEST",
        "02:00 CET",
        "02:30 CET",
        "03:00 CET",
        "03:30 CET",
    ]
    gaps = {b - a for a, b in itertools.pairwise(fired)}
    assert gaps == {dt.timedelta(minutes=30)}


def test_a_cron_is_read_in_its_time_zone() -> None:
    utc = Cadence.of("0 9 * * 1-5", None, "UTC")
    new_york = Cadence.of("0 9 * * 1-5", None, "America/New_York")
    start = dt.datetime(2025, 1, 6, 0, 0, tzinfo=UTC)  # a Monday
    assert utc.after(start) == dt.datetime(2025, 1, 6, 9, 0, tzinfo=UTC)
    assert new_york.after(start) == dt.datetime(2025, 1, 6, 14, 0, tzinfo=UTC)


def test_at_or_before_and_before() -> None:
    hourly = Cadence.of("@hourly", None, "UTC")
    ten = dt.datetime(2025, 1, 1, 10, 0, tzinfo=UTC)
    assert hourly.at_or_before(ten) == ten
    assert hourly.at_or_before(ten + dt.timedelta(minutes=59)) == ten
    assert hourly.before(ten) == ten - dt.timedelta(hours=1)
    assert hourly.after(ten) == ten + dt.timedelta(hours=1)


def test_intervals_tick_at_multiples_of_the_interval_since_the_epoch() -> None:
    quarter = Cadence.of("", dt.timedelta(minutes=15), "Europe/Berlin")
    moment = dt.datetime(2025, 3, 30, 0, 52, 13, tzinfo=UTC)
    assert quarter.after(moment) == dt.datetime(2025, 3, 30, 1, 0, tzinfo=UTC)
    assert quarter.before(moment) == dt.datetime(2025, 3, 30, 0, 45, tzinfo=UTC)
    assert quarter.at_or_before(dt.datetime(2025, 3, 30, 1, 0, tzinfo=UTC)).minute == 0
    # Elapsed time: the daylight saving change in the zone changes nothing.
    fired = ticks(quarter, moment, 8)
    assert {b - a for a, b in itertools.pairwise(fired)} == {dt.timedelta(minutes=15)}
    assert quarter.describe() == "every 15m"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "enter a cron expression"),
        ("61 * * * *", "not a cron expression croniter can read"),
        ("* * *", "has 3 fields"),
        ("0 0 * * * *", "has 6 fields"),
        ("hello", "has 1 fields"),
        ("@reboot", "not a cron shorthand"),
        ("0 0 31 2 *", "not a cron expression croniter can read"),  # never fires
        ("*/0 * * * *", "not a cron expression croniter can read"),
    ],
)
def test_a_cron_expression_that_does_not_parse_is_refused(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_cron(expression)


def test_cron_expressions_are_tidied() -> None:
    assert check_cron("  */5   *  * * * ") == "*/5 * * * *"
    assert check_cron("@DAILY") == "@daily"
    assert check_cron("0 9 * * MON-FRI") == "0 9 * * MON-FRI"


@pytest.mark.parametrize("name", ["", "Mars/Olympus_Mons", "../etc/passwd", "Europe/"])
def test_an_unknown_time_zone_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="time zone"):
        check_zone(name)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("1h30m", 5400), ("2d", 172800), ("1w", 604800), ("45", 45)],
)
def test_intervals_are_read_from_text(text: str, seconds: int) -> None:
    every = parse_every(text)
    assert every == dt.timedelta(seconds=seconds)
    assert parse_every(format_every(every)) == every


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "not an interval"),
        ("0", "at least 1 second"),
        ("1.5s", "not an interval"),
        (0.5, "at least 1 second"),
        (1.5, "whole seconds"),
        (float("nan"), r"not a number \(NaN\)"),
        (float("inf"), "an interval cannot be infinite"),
        (-60, "an interval cannot be negative"),
        ("3000000d", r"an interval is 2.592e\+11 s \(about 8,214 years\), longer than a date"),
        ("99999999999999999999s", "longer than a date can hold"),
        (10**400, "too large for any date"),
        ([], "an interval is a duration"),
    ],
)
def test_a_bad_interval_is_refused(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_every(value)


def test_a_tick_no_date_can_hold_is_refused_not_an_overflow() -> None:
    """The cron horizon: near the end of dates there is no next tick to give; an interval's
    next tick is checked the same way."""
    yearly = Cadence(cron="0 0 1 1 *")
    latest = dt.datetime(9999, 1, 1, tzinfo=UTC)  # the latest time accepted
    assert yearly.after(dt.datetime(9998, 6, 1, tzinfo=UTC)) == latest
    with pytest.raises(InvalidTime, match=r"cron 0 0 1 1 \* \(UTC\) has no tick after 9999-01"):
        yearly.after(latest)  # year 10000
    monthly = Cadence(cron="0 0 1 * *")
    with pytest.raises(
        InvalidTime, match=r"the tick after 9999-01-15T00:00:00\+00:00 of cron 0 0 1 \* \* \(UTC\)"
    ):
        monthly.after(dt.datetime(9999, 1, 15, tzinfo=UTC))
    weekly = Cadence(every=dt.timedelta(weeks=1))
    with pytest.raises(InvalidTime, match="later than a date can hold"):
        weekly.after(latest)
