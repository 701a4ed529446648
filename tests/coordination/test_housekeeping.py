"""The database backend's purge of lapsed rows, and its rows' display."""

from __future__ import annotations

import pytest

from django_reactor.coordination import Window
from django_reactor.coordination.backends.database import DatabaseBackend
from django_reactor.coordination.models import (
    CoordinationLock,
    OrderedLockEntry,
    OrderedLockState,
    PeriodMarker,
    RateLimitEvent,
    SemaphoreHolder,
)
from tests.coordination.conftest import wait_until_server_time

pytestmark = pytest.mark.django_db


def test_purge_removes_lapsed_rows_but_keeps_the_fences() -> None:
    backend = DatabaseBackend()
    grant = backend.acquire_lock("lock", "a", ttl=0.1)
    assert grant is not None
    backend.acquire_semaphore("sem", "a", limit=1, ttl=0.1)
    backend.acquire_semaphore("sem", "b", limit=2, ttl=60)
    backend.check_rate("rate", [Window(5, 0.1)])
    backend.reserve_period("period", "2024", "a", ttl=0.1)
    wait_until_server_time(backend, backend.server_time() + 0.15)
    assert backend.purge_expired() == 3
    assert list(SemaphoreHolder.objects.values_list("owner", flat=True)) == ["b"]
    assert not RateLimitEvent.objects.exists()
    assert not PeriodMarker.objects.exists()
    assert CoordinationLock.objects.get(key="lock").fence == grant.fence
    assert backend.acquire_lock("lock", "b", ttl=1).fence == grant.fence + 1  # type: ignore[union-attr]


def test_rows_say_what_they_are() -> None:
    backend = DatabaseBackend()
    backend.acquire_lock("lock", "a", ttl=10)
    backend.enqueue_ordered("queue", "r1")
    backend.complete_ordered("queue", "r1", failed=True, strict=True)
    backend.enqueue_ordered("queue", "r2")
    assert str(CoordinationLock.objects.get()) == "lock (fence 1, a)"
    assert str(OrderedLockState.objects.get()) == "queue (halted after r1 failed)"
    assert str(OrderedLockEntry.objects.get()) == "queue #2: r2"


def test_writes_refuse_to_join_the_callers_transaction() -> None:
    from django.db import transaction

    backend = DatabaseBackend()
    with transaction.atomic(), pytest.raises(RuntimeError, match="durable"):
        backend.acquire_lock("lock", "a", ttl=10)
    with transaction.atomic():  # reads are plain queries
        assert backend.lock_holder("lock") is None
        assert backend.server_time() > 0
