"""Periods: one successful run per calendar bucket; failures do not claim."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_reactor.coordination import bucket_for, period_seconds
from django_reactor.coordination.backends.base import CoordinationBackend
from tests.coordination.conftest import wait_until_server_time

MOMENT = datetime(2024, 12, 30, 23, 59, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("every", "bucket"),
    [
        ("minute", "2024-12-30T23:59"),
        ("hour", "2024-12-30T23"),
        ("day", "2024-12-30"),
        ("week", "2025-W01"),  # ISO week: 30 December 2024 is in the first week of 2025
        ("month", "2024-12"),
        ("year", "2024"),
        (timedelta(minutes=15), f"900s:{int(MOMENT.timestamp()) // 900}"),
    ],
)
def test_buckets(every: str | timedelta, bucket: str) -> None:
    assert bucket_for(every, MOMENT) == bucket
    assert bucket_for(every, MOMENT.timestamp()) == bucket


def test_bucket_edges_and_errors() -> None:
    assert bucket_for("day", datetime(2024, 1, 1, 23, 59, 59, 999999, tzinfo=UTC)) == "2024-01-01"
    assert bucket_for("day", datetime(2024, 1, 2, tzinfo=UTC)) == "2024-01-02"
    assert period_seconds("month") == 31 * 86400
    assert period_seconds(timedelta(hours=2)) == 7200
    with pytest.raises(ValueError, match="unknown period"):
        bucket_for("fortnight", 0.0)
    with pytest.raises(ValueError, match="aware"):
        bucket_for("day", datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="positive"):
        bucket_for(timedelta(0), 0.0)


def test_a_reserved_bucket_refuses_others_and_names_the_holder(
    backend: CoordinationBackend, key: str
) -> None:
    claim = backend.reserve_period(key, "2024-12-30", "run-1", ttl=10)
    assert (claim.granted, claim.holder, claim.state) == (True, "run-1", "reserved")
    other = backend.reserve_period(key, "2024-12-30", "run-2", ttl=10)
    assert (other.granted, other.holder, other.state) == (False, "run-1", "reserved")
    assert backend.reserve_period(key, "2024-12-30", "run-1", ttl=10).granted  # idempotent
    assert backend.reserve_period(key, "2024-12-31", "run-2", ttl=10).granted  # next bucket


def test_success_claims_the_bucket(backend: CoordinationBackend, key: str) -> None:
    assert backend.reserve_period(key, "b", "run-1", ttl=10).granted
    assert backend.confirm_period(key, "b", "run-1", keep_for=60) is True
    second = backend.reserve_period(key, "b", "run-2", ttl=10)
    assert (second.granted, second.holder, second.state) == (False, "run-1", "claimed")
    assert backend.confirm_period(key, "b", "run-2", keep_for=60) is False
    assert backend.release_period(key, "b", "run-1") is False  # a claim is not released


def test_failure_does_not_claim(backend: CoordinationBackend, key: str) -> None:
    assert backend.reserve_period(key, "b", "run-1", ttl=10).granted
    assert backend.release_period(key, "b", "forger") is False
    assert backend.release_period(key, "b", "run-1") is True
    assert backend.release_period(key, "b", "run-1") is False
    assert backend.reserve_period(key, "b", "run-2", ttl=10).granted


def test_a_lapsed_reservation_frees_the_bucket(backend: CoordinationBackend, key: str) -> None:
    assert backend.reserve_period(key, "b", "crashed", ttl=0.2).granted
    wait_until_server_time(backend, backend.server_time() + 0.25)
    assert backend.reserve_period(key, "b", "run-2", ttl=10).granted
    assert backend.confirm_period(key, "b", "crashed", keep_for=60) is False
    # A success whose reservation lapsed with nobody else there still claims.
    assert backend.release_period(key, "b", "run-2") is True
    assert backend.confirm_period(key, "b", "crashed", keep_for=60) is True
    assert backend.reserve_period(key, "b", "run-3", ttl=10).holder == "crashed"
