"""What a time value may be (``engine.timevalues``), and every declaration that gives one
refusing, at class definition, what no date can hold."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_reactor import Reactor, Retry, interrupt, sleep, sleep_until, step
from django_reactor.engine import timevalues
from django_reactor.engine.coordination import Lock, Period, RateLimit, Semaphore
from django_reactor.engine.journal import MemoryJournal
from django_reactor.engine.supervision import Watch, supervised
from django_reactor.exceptions import DefinitionError, InvalidTime, ReactorError

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
#: What is left from NOW to the latest time accepted, in seconds.
LEFT = (timevalues.LATEST - NOW).total_seconds()
#: The last moment a datetime holds, shown five hours behind UTC (year 10000 in UTC).
PAST_THE_END = dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-5)))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (90, 90.0),
        (1.5, 1.5),
        (dt.timedelta(days=3), 259200.0),
        (LEFT, LEFT),
        (dt.timedelta(seconds=LEFT), LEFT),
    ],
)
def test_a_duration_a_date_can_hold_is_seconds(value: object, expected: float) -> None:
    assert timevalues.seconds(value, "the delay", now=NOW) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "the delay must be a timedelta or a number of seconds, got str 'soon'"),
        (True, "the delay must be a timedelta or a number of seconds, got bool True"),
        (None, "the delay must be a timedelta or a number of seconds, got NoneType None"),
        (float("nan"), "the delay is not a number (NaN); give a timedelta or a number of seconds"),
        (
            float("inf"),
            "the delay cannot be infinite; give a finite timedelta or number of seconds",
        ),
        (-1, "the delay must be longer than zero, got -1"),
        (0, "the delay must be longer than zero, got 0"),
        (float("-inf"), "the delay must be longer than zero, got -inf"),
        (10**400, "the delay is a number of seconds too large for any date; give a shorter one"),
        (
            1e12,
            "the delay is 1e+12 s (about 31,688 years), longer than a date can hold: the latest "
            "time django_reactor accepts, 9999-01-01 (UTC), is 2.51477e+11 s (about 7,969 "
            "years) after 2030-01-01; give a shorter one",
        ),
        (LEFT + 1, "longer than a date can hold"),
        (dt.timedelta(days=999999999), "longer than a date can hold"),
    ],
)
def test_a_duration_no_date_can_hold_is_refused_with_a_plain_message(
    value: object, message: str
) -> None:
    with pytest.raises(InvalidTime) as refused:
        timevalues.seconds(value, "the delay", now=NOW)
    assert message in str(refused.value)
    # Callers that catch ValueError (or any django_reactor error) catch it too.
    assert isinstance(refused.value, ReactorError)
    assert isinstance(refused.value, ValueError)


def test_zero_is_a_duration_only_where_it_means_something() -> None:
    assert timevalues.seconds(0, "a sleep", zero=True) == 0.0
    with pytest.raises(InvalidTime, match=r"a sleep cannot be negative, got -0\.5"):
        timevalues.seconds(-0.5, "a sleep", zero=True)
    assert timevalues.duration(90, "an interval") == dt.timedelta(seconds=90)
    week = dt.timedelta(weeks=1)
    assert timevalues.duration(week, "an interval") is week


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (NOW, NOW),
        ("2030-01-01T01:00:00+01:00", NOW),
        (timevalues.LATEST, timevalues.LATEST),
        (timevalues.EARLIEST, timevalues.EARLIEST),
    ],
)
def test_an_instant_a_date_can_hold_is_an_aware_datetime(value: object, expected: Any) -> None:
    assert timevalues.instant(value, "sleep_until", text=True) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (dt.datetime(2030, 1, 1), "a time without a time zone; give an aware datetime"),
        ("tomorrow", "sleep_until got 'tomorrow', which is not an ISO 8601 time"),
        (5, "sleep_until must be a datetime (or ISO 8601 text), got int 5"),
        (
            PAST_THE_END,
            "sleep_until is 9999-12-31T23:59:59.999999-05:00, later than a date can hold: the "
            "latest time django_reactor accepts is 9999-01-01T00:00:00+00:00; give an earlier one",
        ),
        ("9999-06-01T00:00:00+00:00", "later than a date can hold"),
        ("0001-01-01T00:00:00+01:00", "earlier than a date can hold"),
    ],
)
def test_an_instant_no_date_can_hold_is_refused(value: object, message: str) -> None:
    with pytest.raises(InvalidTime) as refused:
        timevalues.instant(value, "sleep_until", text=True)
    assert message in str(refused.value)


def test_text_is_read_only_where_text_is_a_time() -> None:
    with pytest.raises(InvalidTime, match=r"run\(at=...\) must be a datetime, got str"):
        timevalues.instant("2030-01-01T00:00:00+00:00", "run(at=...)")


def test_moving_a_time_stays_inside_what_a_date_holds() -> None:
    assert timevalues.later(NOW, 60, "the deadline") == NOW + dt.timedelta(minutes=1)
    assert timevalues.later(NOW, dt.timedelta(seconds=LEFT), "x") == timevalues.LATEST
    with pytest.raises(InvalidTime, match=r"the deadline is .* after 2030-01-01T00:00:00"):
        timevalues.later(NOW, LEFT + 1, "the deadline")
    assert timevalues.earlier(NOW, dt.timedelta(days=1), "x") == NOW - dt.timedelta(days=1)
    assert timevalues.ago(0, "--days 0", now=NOW) == NOW
    with pytest.raises(InvalidTime, match=r"--days 999999 is .* earlier than a date can hold"):
        timevalues.ago(999999 * 86400, "--days 999999", now=NOW)
    with pytest.raises(InvalidTime, match="--days -1 cannot be negative"):
        timevalues.ago(-1, "--days -1", now=NOW)


def test_the_longest_duration_is_what_is_left_until_the_latest_time() -> None:
    assert timevalues.longest(NOW) == LEFT
    assert timevalues.longest(timevalues.LATEST + dt.timedelta(days=1)) == 0.0
    assert 0 < timevalues.longest() < LEFT + 5 * 365.25 * 86400


@pytest.mark.parametrize(
    ("amount", "expected"),
    [
        (1.5, 1.5),
        (-3.0, 0.0),
        (float("inf"), timevalues.LONGEST_WAIT),
        (1e300, timevalues.LONGEST_WAIT),
        (float("nan"), timevalues.LONGEST_WAIT),  # never a wait of 0 in a loop that spins
    ],
)
def test_a_wait_is_sliced_to_what_a_thread_can_wait(amount: float, expected: float) -> None:
    assert timevalues.wait_slice(amount) == expected


def test_the_longest_wait_is_one_both_a_thread_event_and_time_sleep_take() -> None:
    # Waited for real (ended at once): OverflowError or OSError here would be the bug.
    assert threading.Event().wait(0) is False
    done = threading.Event()
    done.set()
    assert done.wait(timevalues.LONGEST_WAIT) is True
    assert timevalues.LONGEST_WAIT <= threading.TIMEOUT_MAX
    # time.sleep refuses a wait whose end (monotonic clock + wait, in ns) passes 2**63.
    assert (time.monotonic() + timevalues.LONGEST_WAIT) * 1e9 < 2**63


def test_an_unbounded_timeout_waits_for_the_body_and_never_abandons_it() -> None:
    """A timeout of inf (REACTOR["STEP_TIMEOUT"], or a spec built by hand) used to raise
    OverflowError from the wait while the body went on in its thread; now the body is waited
    for and what it returns is the attempt's result."""
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def body() -> str:
        started.set()
        assert release.wait(10), "the test never released the body"
        finished.append("body")
        return "paid"

    watch = Watch(MemoryJournal(), "charge")
    releaser = threading.Thread(target=lambda: (started.wait(10), release.set()))
    releaser.start()
    result = supervised(
        body, watch, timeout=float("inf"), heartbeat_timeout=None, on_thread_end=lambda: None
    )
    releaser.join(10)
    assert result == "paid"
    assert finished == ["body"]
    assert not watch.abandoned


def define(**body: Any) -> Callable[[], type]:
    return lambda: type("Bounded", (Reactor,), {"__module__": __name__, **body})


def meta(**options: Any) -> type:
    return type("Meta", (), options)


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (
            define(a=step(lambda: 1), Meta=meta(deadline=float("inf"))),
            "Bounded.Meta.deadline cannot be infinite; give a finite timedelta or number of "
            "seconds",
        ),
        (
            define(a=step(lambda: 1), Meta=meta(deadline=dt.timedelta(days=999999999))),
            "Bounded.Meta.deadline is 8.64e+13 s (about 2,737,851 years), longer than a date "
            "can hold",
        ),
        (
            define(a=step(lambda: 1, timeout=float("inf"))),
            "Bounded.a: timeout cannot be infinite",
        ),
        (
            define(a=step(lambda: 1, timeout=1e15)),
            "Bounded.a: timeout is 1e+15 s (about 31,688,088 years), longer than a date can hold",
        ),
        (
            define(a=step(lambda: 1, heartbeat_timeout=float("nan"))),
            "Bounded.a: heartbeat_timeout is not a number (NaN)",
        ),
        (lambda: sleep(1e15), "a sleep is 1e+15 s (about 31,688,088 years), longer than"),
        (lambda: sleep(float("inf")), "a sleep cannot be infinite"),
        (lambda: sleep_until(PAST_THE_END), "sleep_until is 9999-12-31T23:59:59.999999-05:00"),
        (lambda: interrupt(timeout=float("inf")), "interrupt(timeout=...) cannot be infinite"),
        (lambda: interrupt(timeout=1e15), "interrupt(timeout=...) is 1e+15 s"),
        (lambda: Retry(delay=float("inf")), "Retry(delay=...) cannot be infinite"),
        (lambda: Retry(delay=float("nan")), "Retry(delay=...) is not a number (NaN)"),
        (lambda: Retry(max_delay=1e15), "Retry(max_delay=...) is 1e+15 s"),
        (lambda: Retry(delay=dt.timedelta(seconds=5)), "takes a number of seconds, got"),
        (lambda: Lock("k", ttl=1e15), "Lock ttl is 1e+15 s"),
        (lambda: Lock("k", wait=float("inf")), "Lock wait cannot be infinite"),
        (lambda: Semaphore("k", ttl=float("nan")), "Semaphore ttl is not a number (NaN)"),
        (lambda: RateLimit("k", limits=[(1, 1e15)]), "a RateLimit window is 1e+15 s"),
        (lambda: Period("k", every=dt.timedelta(days=999999999)), "Period every is 8.64e+13 s"),
    ],
)
def test_a_declared_time_no_date_can_hold_is_refused_at_definition(
    declare: Callable[[], object], message: str
) -> None:
    with pytest.raises(DefinitionError) as refused:
        declare()
    assert message in str(refused.value)


def test_a_backoff_never_grows_past_what_a_date_can_hold() -> None:
    unbounded = Retry(attempts=5000, backoff="exponential", delay=1, max_delay=None)
    assert unbounded.delay_after(2, jitter_source=None) == 2.0
    bound = timevalues.longest()  # before: the longest a delay can be shrinks as time passes
    longest = unbounded.delay_after(4999, jitter_source=None)
    assert 0 < longest <= bound
    assert Retry(attempts=3, backoff="linear", delay=2).delay_after(3, jitter_source=None) == 6.0
