"""Locks: exclusive, owner-based, re-entrant, fenced, expiring on the server's clock."""

from __future__ import annotations

import pytest

from django_reactor.coordination.backends.base import CoordinationBackend
from tests.coordination.conftest import wait_until_server_time


def test_a_lock_is_exclusive_until_released(backend: CoordinationBackend, key: str) -> None:
    grant = backend.acquire_lock(key, "a", ttl=10)
    assert grant is not None
    assert (grant.key, grant.owner, grant.ttl, grant.reentered) == (key, "a", 10.0, False)
    assert backend.acquire_lock(key, "b", ttl=10) is None
    assert backend.lock_holder(key) == "a"
    assert backend.release_lock(key, "a") is True
    assert backend.lock_holder(key) is None
    assert backend.acquire_lock(key, "b", ttl=10) is not None
    assert backend.lock_holder(key) == "b"


def test_reacquire_by_the_owner_is_reentrant_with_the_same_fence(
    backend: CoordinationBackend, key: str
) -> None:
    first = backend.acquire_lock(key, "a", ttl=10)
    again = backend.acquire_lock(key, "a", ttl=10)
    assert first is not None
    assert again is not None
    assert again.fence == first.fence
    assert again.reentered is True


def test_every_fresh_grant_has_a_larger_fence(backend: CoordinationBackend, key: str) -> None:
    fences = []
    for owner in ["a", "b", "a", "c"]:
        grant = backend.acquire_lock(key, owner, ttl=10)
        assert grant is not None
        fences.append(grant.fence)
        assert backend.release_lock(key, owner)
    assert fences == sorted(set(fences))


def test_forged_and_double_release_are_no_ops(backend: CoordinationBackend, key: str) -> None:
    assert backend.release_lock(key, "nobody") is False  # never taken
    assert backend.acquire_lock(key, "a", ttl=10) is not None
    assert backend.release_lock(key, "forger") is False
    assert backend.lock_holder(key) == "a"
    assert backend.release_lock(key, "a") is True
    assert backend.release_lock(key, "a") is False


def test_a_lapsed_holder_cannot_extend_and_the_next_grant_is_fenced_above_it(
    backend: CoordinationBackend, key: str
) -> None:
    first = backend.acquire_lock(key, "a", ttl=0.2)
    assert first is not None
    assert backend.extend_lock(key, "a", ttl=0.2) is True
    assert backend.extend_lock(key, "b", ttl=10) is False
    wait_until_server_time(backend, backend.server_time() + 0.25)
    assert backend.lock_holder(key) is None
    assert backend.extend_lock(key, "a", ttl=10) is False
    assert backend.release_lock(key, "a") is False
    second = backend.acquire_lock(key, "b", ttl=10)
    assert second is not None
    assert second.fence > first.fence
    # The lapsed holder coming back is a fresh grant too, not a re-entry.
    assert backend.release_lock(key, "b")
    third = backend.acquire_lock(key, "a", ttl=10)
    assert third is not None
    assert third.reentered is False
    assert third.fence > second.fence


def test_extend_keeps_the_lock_past_its_first_ttl(backend: CoordinationBackend, key: str) -> None:
    assert backend.acquire_lock(key, "a", ttl=0.3) is not None
    assert backend.extend_lock(key, "a", ttl=10) is True
    wait_until_server_time(backend, backend.server_time() + 0.35)
    assert backend.lock_holder(key) == "a"
    assert backend.acquire_lock(key, "b", ttl=10) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "a", 1), "non-empty string"),
        (("k", "", 1), "owner"),
        (("k" * 256, "a", 1), "at most 255"),
        (("k", "a", 0), "longer than zero"),
        (("k", "a", float("nan")), "not a number"),
        (("k", "a", float("inf")), "cannot be infinite"),
        (("k", "a", 1e15), "longer than a date can hold"),
        (("k", "a", "5"), "number of seconds"),
    ],
)
def test_bad_arguments_are_refused(
    backend: CoordinationBackend, args: tuple[object, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        backend.acquire_lock(*args)  # type: ignore[arg-type]


def test_keys_of_different_primitives_never_collide(backend: CoordinationBackend, key: str) -> None:
    assert backend.acquire_lock(key, "a", ttl=10) is not None
    assert backend.acquire_semaphore(key, "b", limit=1, ttl=10) is not None
    assert backend.enqueue_ordered(key, "c") == 0
    assert backend.lock_holder(key) == "a"


@pytest.mark.redis
def test_redis_fences_keep_growing_after_redis_loses_the_keys(prefix: str) -> None:
    from tests.coordination.conftest import drop_redis_keys, redis_backend

    backend = redis_backend(prefix)
    try:
        first = backend.acquire_lock("k", "a", ttl=10)
        assert first is not None
        drop_redis_keys(prefix)  # a restart without persistence, a failover, a FLUSHDB
        assert backend.lock_holder("k") is None
        second = backend.acquire_lock("k", "b", ttl=10)
        assert second is not None
        assert second.fence > first.fence
    finally:
        drop_redis_keys(prefix)
