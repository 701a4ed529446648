"""Clock independence: TTLs and windows follow the backend server's clock, not the process's."""

from __future__ import annotations

import time

import pytest

from django_reactor.coordination import Window
from django_reactor.coordination.backends.base import CoordinationBackend
from tests.coordination.conftest import wait_until_server_time


@pytest.mark.parametrize("skew", [-30.0, 1e6], ids=["30s-behind", "11-days-ahead"])
def test_a_skewed_process_clock_changes_nothing(
    backend: CoordinationBackend, key: str, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    before = backend.server_time()
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + skew)
    monkeypatch.setattr(time, "time_ns", lambda: int((real_time() + skew) * 1e9))

    now = backend.server_time()
    assert before <= now < before + 5
    # A lock taken for 0.3 s is held now and lapses 0.3 s later on the server.
    grant = backend.acquire_lock(key, "a", ttl=0.3)
    assert grant is not None
    assert backend.acquire_lock(key, "b", ttl=10) is None
    assert backend.acquire_semaphore(key, "a", limit=1, ttl=0.3) is not None
    assert backend.acquire_semaphore(key, "b", limit=1, ttl=10) is None
    window = Window(2, 0.3)
    decisions = [backend.check_rate(key, [window]) for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert all(abs(d.at - now) < 5 for d in decisions)
    assert 0 < decisions[-1].retry_after <= 0.3
    # Past the window of the last charge (and so past the lock's and the slot's 0.3 s, taken
    # before it), by the server's clock: on a loaded machine the charges come well after now.
    wait_until_server_time(backend, max(d.at for d in decisions) + window.period + 0.05)
    assert backend.acquire_lock(key, "b", ttl=10) is not None
    assert backend.acquire_semaphore(key, "b", limit=1, ttl=10) is not None
    assert backend.check_rate(key, [window]).allowed
