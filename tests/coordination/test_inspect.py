"""Inspection: what a backend holds now, as the admin's coordination panel lists it."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor.coordination import Window
from django_reactor.coordination.backends.base import CoordinationBackend


def test_an_idle_backend_holds_nothing(backend: CoordinationBackend) -> None:
    snapshot = backend.inspect()
    assert snapshot.locks == snapshot.semaphores == snapshot.rates == ()
    assert snapshot.period_holds == snapshot.ordered == ()
    assert snapshot.cut == ()
    assert abs(snapshot.at - backend.server_time()) < 5
    assert snapshot.periods == (1.0, 60.0, 3600.0)


def test_it_lists_every_kind_with_owners_fences_and_time_left(
    backend: CoordinationBackend, key: str
) -> None:
    grant = backend.acquire_lock(f"lock:{key}", "run-a", ttl=30)
    assert grant is not None
    backend.acquire_lock(f"lock:{key}-released", "run-b", ttl=30)
    backend.release_lock(f"lock:{key}-released", "run-b")
    backend.acquire_semaphore(f"semaphore:{key}", "run-a", limit=3, ttl=20)
    backend.acquire_semaphore(f"semaphore:{key}", "run-b", limit=3, ttl=40)
    windows = [Window(5, 1), Window(100, 60)]
    for _ in range(3):
        assert backend.check_rate(f"rate:{key}", windows).allowed
    assert backend.reserve_period(f"period:{key}", "2026-12-03", "run-a", ttl=50).granted
    assert backend.confirm_period(f"period:{key}", "2026-12-02", "run-c", keep_for=100)
    for owner in ["run-a", "run-b", "run-c"]:
        backend.enqueue_ordered(f"ordered:{key}", owner)
    backend.enqueue_ordered(f"ordered:{key}-halted", "run-x")
    backend.complete_ordered(f"ordered:{key}-halted", "run-x", failed=True, strict=True)

    snapshot = backend.inspect(periods=[60, 1])

    assert snapshot.periods == (1.0, 60.0)
    [lock] = snapshot.locks
    assert (lock.key, lock.owner, lock.fence) == (f"lock:{key}", "run-a", grant.fence)
    assert 25 < lock.expires_in <= 30
    [slots] = snapshot.semaphores
    assert slots.key == f"semaphore:{key}"
    assert [owner for owner, _ in slots.holders] == ["run-a", "run-b"]  # soonest expiry first
    assert 15 < slots.holders[0][1] <= 20 < 35 < slots.holders[1][1] <= 40
    [rate] = snapshot.rates
    assert (rate.key, rate.counts) == (f"rate:{key}", (3, 3))
    assert rate.last_at is not None
    assert abs(rate.last_at - snapshot.at) < 5
    holds = {(h.bucket, h.owner, h.state) for h in snapshot.period_holds}
    assert holds == {("2026-12-03", "run-a", "reserved"), ("2026-12-02", "run-c", "claimed")}
    assert {h.key for h in snapshot.period_holds} == {f"period:{key}"}
    queues = {q.key: q for q in snapshot.ordered}
    assert set(queues) == {f"ordered:{key}", f"ordered:{key}-halted"}
    queue = queues[f"ordered:{key}"]
    assert (queue.queued, queue.first, queue.head) == (3, ("run-a", "run-b", "run-c"), "run-a")
    assert queue.head_since is not None
    halted = queues[f"ordered:{key}-halted"]
    assert (halted.queued, halted.halted_after, halted.head) == (0, "run-x", None)
    assert snapshot.cut == ()


def test_a_kind_with_more_than_the_limit_is_cut(backend: CoordinationBackend, key: str) -> None:
    for n in range(4):
        backend.acquire_lock(f"lock:{key}-{n}", f"run-{n}", ttl=30)
    snapshot = backend.inspect(limit=3)
    assert [lock.key for lock in snapshot.locks] == [f"lock:{key}-{n}" for n in range(3)]
    assert snapshot.cut == ("locks",)


def test_a_lapsed_lock_is_not_held(backend: CoordinationBackend, key: str) -> None:
    from tests.coordination.conftest import wait_until_server_time

    backend.acquire_lock(f"lock:{key}", "run-a", ttl=0.05)
    wait_until_server_time(backend, backend.server_time() + 0.1)
    assert backend.inspect().locks == ()


def test_bad_arguments_are_refused(backend: CoordinationBackend) -> None:
    with pytest.raises(ValueError, match="limit"):
        backend.inspect(limit=0)
    with pytest.raises(ValueError, match="period"):
        backend.inspect(periods=[])


@pytest.mark.redis
def test_redis_reads_only_its_own_prefix_even_with_glob_characters_in_it() -> None:
    from tests.coordination.conftest import drop_redis_keys, redis_backend

    mine: Any
    mine, other = redis_backend("reactor-test-[a]*"), redis_backend("reactor-test-a-other")
    try:
        mine.acquire_lock("lock:k", "run-a", ttl=30)
        other.acquire_lock("lock:k", "run-b", ttl=30)
        other.acquire_semaphore("semaphore:k", "run-b", limit=1, ttl=30)
        assert [(lock.key, lock.owner) for lock in mine.inspect().locks] == [("lock:k", "run-a")]
        assert mine.inspect().semaphores == ()
    finally:
        drop_redis_keys("reactor-test-a-other")
        mine.client.delete(mine._key("lock", "lock:k"), mine._key("lock", "lock:k", "fence"))


@pytest.mark.redis
def test_redis_inspects_through_a_client_that_decodes_replies(prefix: str) -> None:
    import redis

    from django_reactor.coordination.backends.redis import RedisBackend
    from tests.coordination.conftest import REDIS_URL, drop_redis_keys

    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    backend = RedisBackend(client=client, prefix=prefix)
    try:
        grant = backend.acquire_lock("lock:k", "run-a", ttl=30)
        assert grant is not None
        backend.reserve_period("period:p", "2026-12-03", "run-a", ttl=30)
        snapshot = backend.inspect()
        assert [(lock.owner, lock.fence) for lock in snapshot.locks] == [("run-a", grant.fence)]
        assert [(h.bucket, h.state) for h in snapshot.period_holds] == [("2026-12-03", "reserved")]
    finally:
        client.close()
        drop_redis_keys(prefix)
