"""Rate limits: a sliding-window log, several windows all-or-nothing, named limits."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_reactor.coordination import UnknownRateLimit, Window, named_rate_limit, parse_windows
from django_reactor.coordination.backends.base import CoordinationBackend
from django_reactor.coordination.validation import settings_problems
from django_reactor.exceptions import ReactorImproperlyConfigured
from tests.coordination.conftest import wait_until_server_time


def test_a_window_allows_its_limit_then_says_when_to_retry(
    backend: CoordinationBackend, key: str
) -> None:
    window = Window(3, 0.5)
    decisions = [backend.check_rate(key, [window]) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.counts for d in decisions] == [(1,), (2,), (3,), (3,)]
    denied = decisions[-1]
    assert denied.limited_by == window
    # The first charge leaves the window half a second after it was made.
    assert denied.retry_after == pytest.approx(decisions[0].at + 0.5 - denied.at, abs=0.002)
    assert 0 < denied.retry_after <= 0.5
    wait_until_server_time(backend, denied.at + denied.retry_after)
    assert backend.check_rate(key, [window]).allowed


def test_a_denial_charges_no_window(backend: CoordinationBackend, key: str) -> None:
    per_second, per_minute = Window(2, 1), Window(5, 60)
    for _ in range(2):
        assert backend.check_rate(key, [per_second, per_minute]).allowed
    for _ in range(10):
        denied = backend.check_rate(key, [per_second, per_minute])
        assert not denied.allowed
        assert denied.limited_by == per_second
    assert backend.rate_count(key, per_minute) == 2
    assert backend.rate_count(key, per_second) == 2


def test_the_window_that_needs_the_longest_wait_is_reported(
    backend: CoordinationBackend, key: str
) -> None:
    short, long = Window(5, 0.2), Window(2, 30)
    assert backend.check_rate(key, [short, long]).allowed
    assert backend.check_rate(key, [short, long]).allowed
    denied = backend.check_rate(key, [short, long])
    assert not denied.allowed
    assert denied.limited_by == long
    assert 29 < denied.retry_after <= 30


def test_sliding_windows_never_let_twice_the_limit_through_at_a_boundary(
    backend: CoordinationBackend, key: str
) -> None:
    window = Window(4, 0.4)
    first = [backend.check_rate(key, [window]) for _ in range(4)]
    assert all(d.allowed for d in first)
    # Well past where a fixed window would have reset, but inside the sliding one.
    wait_until_server_time(backend, first[0].at + 0.25)
    assert not backend.check_rate(key, [window]).allowed
    wait_until_server_time(backend, first[-1].at + 0.4)
    assert [backend.check_rate(key, [window]).allowed for _ in range(5)] == [True] * 4 + [False]


def test_a_cost_counts_as_several_charges(backend: CoordinationBackend, key: str) -> None:
    window = Window(5, 60)
    assert backend.check_rate(key, [window], cost=3).counts == (3,)
    denied = backend.check_rate(key, [window], cost=3)
    assert not denied.allowed
    assert denied.counts == (3,)
    assert backend.check_rate(key, [window], cost=2).allowed
    assert backend.rate_count(key, window) == 5
    with pytest.raises(ValueError, match="can never fit"):
        backend.check_rate(key, [window], cost=6)


@pytest.mark.parametrize(
    "windows", [[], [Window(1, 1), Window(2, 1)], [(1, 1)]], ids=["none", "same", "tuple"]
)
def test_bad_windows_are_refused(backend: CoordinationBackend, key: str, windows: list) -> None:
    with pytest.raises(ValueError):
        backend.check_rate(key, windows)


def test_specifications() -> None:
    assert parse_windows({"minute": 100, "second": 3}) == (Window(3, 1), Window(100, 60))
    assert parse_windows([[3, 1], (10, 2.5)]) == (Window(3, 1), Window(10, 2.5))
    for bad in [{"fortnight": 1}, [[0, 1]], [[1, -1]], [], "3/s", [[1, 2, 3]], {"second": True}]:
        with pytest.raises(ValueError):
            parse_windows(bad)


@override_settings(REACTOR={"RATE_LIMITS": {"stripe": {"second": 3, "minute": 100}}})
def test_named_limits_come_from_settings() -> None:
    key, windows = named_rate_limit("stripe")
    assert key == "named:stripe"
    assert windows == (Window(3, 1), Window(100, 60))
    with pytest.raises(UnknownRateLimit) as caught:
        named_rate_limit("paypal")
    assert caught.value.name == "paypal"
    assert caught.value.known == ("stripe",)
    assert "'paypal'" in str(caught.value)
    assert "'stripe'" in str(caught.value)
    assert settings_problems() == []


@override_settings(REACTOR={"RATE_LIMITS": {"stripe": {"second": 0}}})
def test_a_bad_named_limit_is_a_configuration_error() -> None:
    with pytest.raises(ReactorImproperlyConfigured, match="stripe"):
        named_rate_limit("stripe")
    assert any("stripe" in problem for problem in settings_problems())
