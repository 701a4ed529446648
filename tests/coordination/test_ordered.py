"""Ordered locks: enqueue order, poison-pill skip, strict halt, peek, skip and reset."""

from __future__ import annotations

import logging

import pytest

from django_reactor.coordination.backends.base import CoordinationBackend
from tests.coordination.conftest import wait_until_server_time


def test_owners_take_turns_in_enqueue_order(backend: CoordinationBackend, key: str) -> None:
    assert [backend.enqueue_ordered(key, o) for o in ["r1", "r2", "r3"]] == [0, 1, 2]
    assert backend.enqueue_ordered(key, "r2") == 1  # idempotent
    assert backend.peek_ordered(key) == ["r1", "r2", "r3"]
    order = []
    while (head := backend.ordered_head(key, poison_after=60)) is not None:
        order.append(head)
        assert backend.complete_ordered(key, head, failed=False, strict=True)
    assert order == ["r1", "r2", "r3"]
    assert backend.complete_ordered(key, "r1", failed=False, strict=True) is False
    assert backend.ordered_status(key).reason == f"ordered lock {key!r} has no queued owner"


def test_a_stuck_head_is_skipped_after_the_poison_pill_timeout(
    backend: CoordinationBackend, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    for owner in ["stuck", "r2"]:
        backend.enqueue_ordered(key, owner)
    became_head = backend.ordered_status(key).head_since
    assert became_head is not None
    assert backend.ordered_head(key, poison_after=0.2) == "stuck"
    wait_until_server_time(backend, became_head + 0.25)
    with caplog.at_level(logging.WARNING, logger="django_reactor.coordination"):
        assert backend.ordered_head(key, poison_after=0.2) == "r2"
    assert "skipped stuck" in caplog.text
    status = backend.ordered_status(key)
    assert status.queue == ("r2",)
    assert status.skipped == ("stuck",)
    assert backend.complete_ordered(key, "stuck", failed=False, strict=True) is False


def test_a_heartbeat_keeps_a_slow_head(backend: CoordinationBackend, key: str) -> None:
    for owner in ["slow", "r2"]:
        backend.enqueue_ordered(key, owner)
    start = backend.ordered_status(key).head_since
    assert start is not None
    wait_until_server_time(backend, start + 0.2)
    assert backend.heartbeat_ordered(key, "slow") is True
    assert backend.heartbeat_ordered(key, "r2") is False
    wait_until_server_time(backend, start + 0.35)
    assert backend.ordered_head(key, poison_after=0.3) == "slow"


def test_strict_mode_halts_the_chain_after_a_failure(
    backend: CoordinationBackend, key: str
) -> None:
    for owner in ["r1", "r2", "r3"]:
        backend.enqueue_ordered(key, owner)
    assert backend.complete_ordered(key, "r1", failed=True, strict=True)
    assert backend.ordered_head(key, poison_after=60) is None
    status = backend.ordered_status(key)
    assert status.halted
    assert status.halted_after == "r1"
    assert status.head is None
    assert status.reason == f"ordered lock {key!r} halted after r1 failed"
    # Later owners learn it, leave, and a later failure does not rename the culprit.
    assert backend.enqueue_ordered(key, "r4") == 2
    assert backend.complete_ordered(key, "r2", failed=True, strict=True)
    assert backend.ordered_status(key).halted_after == "r1"
    assert backend.reset_ordered(key) == 2
    status = backend.ordered_status(key)
    assert (status.queue, status.halted_after, status.skipped) == ((), None, ())
    backend.enqueue_ordered(key, "r5")
    assert backend.ordered_head(key, poison_after=60) == "r5"


def test_without_strict_mode_a_failure_lets_the_next_go(
    backend: CoordinationBackend, key: str
) -> None:
    for owner in ["r1", "r2"]:
        backend.enqueue_ordered(key, owner)
    assert backend.complete_ordered(key, "r1", failed=True, strict=False)
    assert backend.ordered_head(key, poison_after=60) == "r2"
    assert not backend.ordered_status(key).halted


def test_operators_skip_an_owner(backend: CoordinationBackend, key: str) -> None:
    for owner in ["r1", "r2", "r3"]:
        backend.enqueue_ordered(key, owner)
    assert backend.skip_ordered(key, "r2") is True
    assert backend.skip_ordered(key, "r2") is False
    assert backend.peek_ordered(key) == ["r1", "r3"]
    assert backend.skip_ordered(key, "r1") is True
    assert backend.ordered_head(key, poison_after=60) == "r3"
    assert backend.ordered_status(key).skipped == ("r2", "r1")
