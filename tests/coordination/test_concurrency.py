"""Several processes contend for one semaphore (limit 3) and one lock, on each backend.

Each process starts at a barrier, then takes and gives back the slot or the lock a number of
times. While it holds one it bumps a shared counter of holders (and reads the holders the
server reports); the counter must never exceed the limit. Lock grants append their fence
while the lock is held, so the fences, in grant order, must strictly increase.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import time
import traceback
import uuid
from typing import Any

import pytest
from django.db import connections

from django_reactor.coordination.backends.base import CoordinationBackend
from tests.coordination.conftest import REDIS_URL, drop_redis_keys

PROCESSES = 6
ROUNDS = 8
LIMIT = 3
TTL = 20.0
CONTEXT = multiprocessing.get_context("fork")


def _backend(kind: str, prefix: str) -> CoordinationBackend:
    if kind == "redis":
        import redis

        from django_reactor.coordination.backends.redis import RedisBackend

        return RedisBackend(client=redis.Redis.from_url(REDIS_URL), prefix=prefix)
    from django_reactor.coordination.backends.database import DatabaseBackend

    return DatabaseBackend()


def _contend(
    kind: str,
    prefix: str,
    key: str,
    primitive: str,
    barrier: Any,
    counter: Any,
    peak: Any,
    fences: Any,
    granted: Any,
    errors: Any,
) -> None:
    try:
        backend = _backend(kind, prefix)
        owner = f"proc-{uuid.uuid4().hex[:8]}"
        barrier.wait()
        deadline = time.monotonic() + 30
        done = 0
        while done < ROUNDS:
            assert time.monotonic() < deadline, "no progress in 30 s"
            if primitive == "semaphore":
                grant: Any = backend.acquire_semaphore(key, owner, LIMIT, TTL)
            else:
                grant = backend.acquire_lock(key, owner, TTL)
            if grant is None:
                time.sleep(0.001)  # back off; contention is the point of the test
                continue
            with counter.get_lock():
                counter.value += 1
                peak.value = max(peak.value, counter.value)
                if primitive == "lock":
                    fences[granted.value] = grant.fence
                granted.value += 1
            holders = (
                backend.semaphore_holders(key)
                if primitive == "semaphore"
                else [backend.lock_holder(key)]
            )
            assert owner in holders
            assert len(holders) <= (LIMIT if primitive == "semaphore" else 1)
            time.sleep(0.002)  # the work done while holding it
            with counter.get_lock():
                counter.value -= 1
            released = (
                backend.release_semaphore(key, owner)
                if primitive == "semaphore"
                else backend.release_lock(key, owner)
            )
            assert released
            done += 1
    except BaseException:
        errors.put(traceback.format_exc())
        raise


def _race(kind: str, primitive: str) -> tuple[int, list[int]]:
    prefix = f"reactor-coord-race-{uuid.uuid4().hex}"
    key = f"race-{uuid.uuid4().hex[:8]}"
    barrier = CONTEXT.Barrier(PROCESSES, timeout=20)
    counter, peak, granted = CONTEXT.Value("i", 0), CONTEXT.Value("i", 0), CONTEXT.Value("i", 0)
    fences = CONTEXT.Array("q", PROCESSES * ROUNDS)
    errors = CONTEXT.Queue()
    connections.close_all()  # children open their own connections
    processes = [
        CONTEXT.Process(
            target=_contend,
            args=(kind, prefix, key, primitive, barrier, counter, peak, fences, granted, errors),
        )
        for _ in range(PROCESSES)
    ]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=60)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        if kind == "redis":
            drop_redis_keys(prefix)
    problems = []
    while True:
        try:
            problems.append(errors.get(timeout=0.1))
        except queue.Empty:
            break
    assert problems == []
    assert [p.exitcode for p in processes] == [0] * PROCESSES
    assert granted.value == PROCESSES * ROUNDS
    return peak.value, list(fences[: granted.value])


BACKENDS = [
    pytest.param("redis", marks=pytest.mark.redis, id="redis"),
    pytest.param(
        "database",
        marks=[pytest.mark.postgres, pytest.mark.django_db(transaction=True)],
        id="database",
    ),
]


@pytest.mark.parametrize("kind", BACKENDS)
def test_processes_never_exceed_the_semaphore_limit(kind: str) -> None:
    peak, _ = _race(kind, "semaphore")
    assert 1 <= peak <= LIMIT


@pytest.mark.parametrize("kind", BACKENDS)
def test_processes_take_the_lock_one_at_a_time_with_increasing_fences(kind: str) -> None:
    peak, fences = _race(kind, "lock")
    assert peak == 1
    assert all(a < b for a, b in itertools.pairwise(fences))
