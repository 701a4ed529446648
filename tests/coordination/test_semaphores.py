"""Semaphores: at most ``limit`` live holders, idempotent per owner, slots lapse with the TTL."""

from __future__ import annotations

from django_reactor.coordination.backends.base import CoordinationBackend
from tests.coordination.conftest import wait_until_server_time


def test_at_most_limit_holders(backend: CoordinationBackend, key: str) -> None:
    grants = [backend.acquire_semaphore(key, owner, limit=2, ttl=10) for owner in "abc"]
    assert [g.holders if g else None for g in grants] == [1, 2, None]
    assert grants[0] is not None
    assert grants[0].limit == 2
    assert sorted(backend.semaphore_holders(key)) == ["a", "b"]


def test_acquire_is_idempotent_for_a_holder(backend: CoordinationBackend, key: str) -> None:
    assert backend.acquire_semaphore(key, "a", limit=2, ttl=10) is not None
    again = backend.acquire_semaphore(key, "a", limit=2, ttl=10)
    assert again is not None
    assert again.reentered is True
    assert again.holders == 1
    assert backend.acquire_semaphore(key, "b", limit=2, ttl=10) is not None
    # A holder keeps its slot even when the semaphore is full.
    assert backend.acquire_semaphore(key, "a", limit=2, ttl=10) is not None
    assert sorted(backend.semaphore_holders(key)) == ["a", "b"]


def test_release_frees_a_slot_and_forged_or_double_release_is_a_no_op(
    backend: CoordinationBackend, key: str
) -> None:
    assert backend.acquire_semaphore(key, "a", limit=1, ttl=10) is not None
    assert backend.release_semaphore(key, "forger") is False
    assert backend.acquire_semaphore(key, "b", limit=1, ttl=10) is None
    assert backend.release_semaphore(key, "a") is True
    assert backend.release_semaphore(key, "a") is False
    assert backend.acquire_semaphore(key, "b", limit=1, ttl=10) is not None
    assert backend.release_semaphore(key, "a") is False
    assert backend.semaphore_holders(key) == ["b"]


def test_a_crashed_holders_slot_comes_back_within_its_ttl(
    backend: CoordinationBackend, key: str
) -> None:
    assert backend.acquire_semaphore(key, "crashed", limit=1, ttl=0.2) is not None
    assert backend.acquire_semaphore(key, "b", limit=1, ttl=10) is None
    wait_until_server_time(backend, backend.server_time() + 0.25)
    assert backend.semaphore_holders(key) == []
    assert backend.extend_semaphore(key, "crashed", ttl=10) is False
    assert backend.release_semaphore(key, "crashed") is False
    grant = backend.acquire_semaphore(key, "b", limit=1, ttl=10)
    assert grant is not None
    assert grant.holders == 1


def test_extend_keeps_a_slot_alive(backend: CoordinationBackend, key: str) -> None:
    assert backend.acquire_semaphore(key, "a", limit=1, ttl=0.3) is not None
    assert backend.extend_semaphore(key, "a", ttl=10) is True
    assert backend.extend_semaphore(key, "b", ttl=10) is False
    wait_until_server_time(backend, backend.server_time() + 0.35)
    assert backend.semaphore_holders(key) == ["a"]
    assert backend.acquire_semaphore(key, "b", limit=1, ttl=10) is None
