"""Coordination held by background runs on real prefork Celery workers.

The workers get the coordination settings through ``REACTOR_SETTINGS_JSON`` (see
``conftest._process_env``): the Redis backend on the tests' Redis database 8 (or on a private
``redis-server`` for the restart test) and a key prefix of the test's own. The steps
(``tests.workers.reactors.Holder``) record in the suite's Redis, with that server's clock, when
their body held the run's coordination, and count the holders at once.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db.models import Count
from django.test import override_settings

from django_reactor import Dispatched, services
from django_reactor.models import Dispatch, Execution, StepRecord
from django_reactor.states import ExecutionStatus
from tests.coordination.conftest import REDIS_URL, drop_redis_keys
from tests.private_redis import PrivateRedis
from tests.workers.conftest import WorkerDatabase, _process_env
from tests.workers.harness import Worker, wait_until
from tests.workers.reactors import (
    LockedHolder,
    LockedSideBySide,
    LockedWithUnit,
    RateLimitedHolder,
)
from tests.workers.test_background import finished

REDIS_BACKEND = "django_reactor.coordination.backends.redis.RedisBackend"
#: Seconds a worker waits before trying a contended run again (the default is 1 s).
CONTENTION_DELAY = 0.25
#: How much later than its charge a run's body may start (the rate-limit test's allowance).
START_JITTER_US = 250_000


class Holders:
    """What the ``Holder`` steps of one test wrote to the suite's Redis, under ``ns``."""

    def __init__(self) -> None:
        self.ns = f"coordtest-{uuid.uuid4().hex[:12]}"
        self.client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)

    def inputs(self, pause: float = 0.05) -> dict[str, Any]:
        return {"ns": self.ns, "redis_url": settings.REDIS_URL, "pause": pause}

    @property
    def lock_key(self) -> str:
        return f"coord-{self.ns}"

    def entries(self) -> list[dict[str, Any]]:
        """Every body run, in the order they started (server time)."""
        found = [json.loads(e) for e in self.client.lrange(f"{self.ns}:entries", 0, -1)]
        return sorted(found, key=lambda e: e["start"])

    def max_holders(self) -> int:
        return int(self.client.get(f"{self.ns}:max_holders") or 0)

    def holders(self) -> int:
        return int(self.client.get(f"{self.ns}:holders") or 0)

    def overlaps(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Pairs of body runs that held the lock at the same time (by the server's clock)."""
        entries = self.entries()
        return [(a, b) for a, b in itertools.pairwise(entries) if b["start"] < a["end"]]

    def clear(self) -> None:
        keys = list(self.client.scan_iter(f"{self.ns}:*"))
        if keys:
            self.client.delete(*keys)
        self.client.close()


@pytest.fixture
def holders() -> Iterator[Holders]:
    recorder = Holders()
    yield recorder
    recorder.clear()


@pytest.fixture
def coordination() -> Iterator[dict[str, Any]]:
    """The coordination settings of this test (the test process and its workers share them);
    a test may change ``COORDINATION_REDIS`` before it starts a worker."""
    reactor = {
        "COORDINATION_BACKEND": REDIS_BACKEND,
        "COORDINATION_REDIS": REDIS_URL,
        "COORDINATION_KEY_PREFIX": f"reactor-coord-workers-{uuid.uuid4().hex}",
        "CONTENTION_DELAY": CONTENTION_DELAY,
    }
    yield reactor
    if reactor["COORDINATION_REDIS"] == REDIS_URL:
        drop_redis_keys(reactor["COORDINATION_KEY_PREFIX"])


@pytest.fixture
def start_coordinated_worker(
    transactional_db: Any,
    tmp_path: Path,
    coordination: dict[str, Any],
    worker_database: WorkerDatabase,
) -> Iterator[Callable[..., Worker]]:
    """``start_worker`` (conftest.py) with this test's coordination settings."""
    started: list[Worker] = []

    def start(*, concurrency: int = 2, faults: str = "") -> Worker:
        env = _process_env(tmp_path, faults, worker_database)
        env["REACTOR_SETTINGS_JSON"] = json.dumps(
            {**json.loads(env["REACTOR_SETTINGS_JSON"]), **coordination}
        )
        worker = Worker(
            env=env,
            queue=settings.REACTOR["CELERY_QUEUE"],
            log_dir=tmp_path,
            concurrency=concurrency,
        )
        started.append(worker)
        with override_settings(REACTOR={**settings.REACTOR, **coordination}):
            return worker.start()

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def backend(coordination: dict[str, Any]) -> Iterator[Any]:
    """The test's coordination backend, as the workers see it."""
    from django_reactor.coordination.backends.redis import RedisBackend

    with override_settings(REACTOR={**settings.REACTOR, **coordination}):
        yield RedisBackend(
            coordination["COORDINATION_REDIS"], prefix=coordination["COORDINATION_KEY_PREFIX"]
        )


def start_runs(reactor: Any, inputs: dict[str, Any], count: int) -> list[Any]:
    ids = []
    for _ in range(count):
        outcome = reactor.run(inputs)
        assert isinstance(outcome, Dispatched), outcome
        ids.append(outcome.execution_id)
    return ids


def wait_finished(ids: list[Any], *, timeout: float, sweep: bool = False) -> list[Execution]:
    def check() -> list[Execution] | None:
        if sweep:
            services.sweep()
        rows = [finished(i) for i in ids]
        return rows if all(rows) else None  # type: ignore[return-value]

    def left() -> str:
        rows = Execution.objects.filter(id__in=ids).exclude(status=ExecutionStatus.COMPLETED)
        return f"{len(ids)} runs to finish; still: {[(r.id, r.status) for r in rows]}"

    try:
        return wait_until(check, timeout=timeout, what=f"{len(ids)} runs to finish")
    except AssertionError as exc:
        raise AssertionError(left()) from exc


def trace(execution_id: Any) -> list[Any]:
    return list(services.find(execution_id).trace)


def acquires(execution_id: Any, **match: Any) -> list[dict[str, Any]]:
    return [
        e.data
        for e in trace(execution_id)
        if e.kind == "acquire" and all(e.data.get(k) == v for k, v in match.items())
    ]


def parks(execution_id: Any) -> list[dict[str, Any]]:
    return [e.data for e in trace(execution_id) if e.kind == "park"]


def assert_completed(rows: list[Execution]) -> None:
    failed = [(r.id, r.status, r.failure) for r in rows if r.status != ExecutionStatus.COMPLETED]
    assert failed == []


def assert_one_holder_at_a_time(holders: Holders, ids: list[Any]) -> list[dict[str, Any]]:
    """Every run's body ran once, never two at once, with fences increasing in that order."""
    entries = holders.entries()
    seen = "\n".join(json.dumps(e) for e in entries)  # shown when an assertion fails
    assert sorted(e["execution"] for e in entries) == sorted(str(i) for i in ids), seen
    assert holders.max_holders() == 1, seen
    assert [e["holders"] for e in entries] == [1] * len(entries), seen
    assert holders.overlaps() == [], seen
    fences = [e["fences"][holders.lock_key] for e in entries]
    assert fences == sorted(fences), seen
    assert len(set(fences)) == len(fences), seen  # strictly increasing, in the order held
    for entry in entries:
        # One grant per run, the one its body saw.
        granted = acquires(entry["execution"], lock=holders.lock_key)
        expected = [{"lock": holders.lock_key, "fence": entry["fences"][holders.lock_key]}]
        assert granted == expected, [(e.kind, e.data) for e in trace(entry["execution"])]
    return entries


# ---------------------------------------------------------------------------- a lock


@pytest.mark.behind_pgbouncer
def test_twenty_runs_contending_for_one_lock_hold_it_one_at_a_time(
    start_coordinated_worker: Any, holders: Holders, backend: Any
) -> None:
    start_coordinated_worker(concurrency=4)
    ids = start_runs(LockedHolder, holders.inputs(pause=0.05), 20)
    rows = wait_finished(ids, timeout=50)
    assert_completed(rows)
    assert_one_holder_at_a_time(holders, ids)
    snoozed = [i for i in ids if parks(i)]
    assert snoozed, "no run ever found the lock taken"
    reasons = {p["reason"] for i in ids for p in parks(i)}
    assert reasons == {"contention"}
    assert backend.lock_holder(f"lock:{holders.lock_key}") is None  # all given back


# ---------------------------------------------------------------------------- a rate limit


class RateLog:
    """Copies the rate limiter's log (a sorted set of charges scored by the Redis server's
    microseconds, each kept for the window's length) while the runs go: every charge."""

    def __init__(self, backend: Any, key: str) -> None:
        self.client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.key = backend._key("rate", key)
        self.charges: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._copy, daemon=True)

    def _copy(self) -> None:
        while not self.stop.is_set():
            self._copy_once()
            self.stop.wait(0.05)  # the log keeps a charge for 1 s

    def _copy_once(self) -> None:
        for member, score in self.client.zrange(self.key, 0, -1, withscores=True):
            self.charges[member] = int(score)

    def __enter__(self) -> RateLog:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self._copy_once()  # a charge made since the thread's last copy (the runs' last ones)
        self.client.close()


def most_in_a_window(times_us: list[int], window_us: int) -> int:
    """The most of ``times_us`` in any half-open window ``(t - window, t]``."""
    ordered = sorted(times_us)
    most, first = 0, 0
    for last, t in enumerate(ordered):
        while ordered[first] <= t - window_us:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_twenty_runs_under_a_rate_limit_of_five_a_second_start_at_most_five_a_second(
    start_coordinated_worker: Any, holders: Holders, backend: Any
) -> None:
    start_coordinated_worker(concurrency=4)
    with RateLog(backend, f"rate:coord-rate-{holders.ns}") as log:
        ids = start_runs(RateLimitedHolder, holders.inputs(pause=0.0), 20)
        rows = wait_finished(ids, timeout=50)
    assert_completed(rows)
    # Each run was charged once (a denied attempt consumes nothing), and never more than 5
    # charges in any second of the Redis server's clock.
    charges = sorted(log.charges.values())
    assert len(charges) == 20
    assert most_in_a_window(charges, 1_000_000) == 5
    assert charges[-1] - charges[0] >= 3_000_000  # 20 at 5/s: 4 windows
    # The bodies started (Redis server time) at most 5 in any second, give or take the time
    # between a run's charge and its step's start: the limiter bounds charges, and a body
    # starts a few ms after its run's charge (6 bodies in 0.985 s were seen on an idle machine).
    entries = holders.entries()
    assert sorted(e["execution"] for e in entries) == sorted(str(i) for i in ids)
    starts = [e["start"] for e in entries]
    assert most_in_a_window(starts, 1_000_000 - START_JITTER_US) <= 5
    for execution_id in ids:
        assert acquires(execution_id) == [{"rate_limit": f"coord-rate-{holders.ns}"}]
    waited = [p for i in ids for p in parks(i)]
    assert waited, "no run was ever limited"
    assert {p["reason"] for p in waited} == {"contention"}
    assert all("rate limit" in p["waiting_for"] for p in waited)


# ---------------------------------------------------------------------------- park and reattach


def test_a_parked_run_keeps_its_lock_and_reattaches_it_without_a_second_acquire(
    start_coordinated_worker: Any, holders: Holders, backend: Any
) -> None:
    start_coordinated_worker(concurrency=3)
    holders.client.set(f"{holders.ns}:hold", "1", ex=60)  # the unit waits until it is deleted
    first = LockedWithUnit.run(holders.inputs(pause=0.0)).execution_id

    def parked() -> bool:
        row = Execution.objects.get(pk=first)
        return (
            bool(holders.client.get(f"{holders.ns}:unit"))
            and row.status == ExecutionStatus.PENDING
            and any(e.kind == "park" for e in trace(first))
        )

    wait_until(parked, timeout=30, what="the first run to park while its unit runs")
    lock = f"lock:{holders.lock_key}"
    assert backend.lock_holder(lock) == f"run:{first}"  # kept while parked

    second = LockedHolder.run(holders.inputs(pause=0.0)).execution_id
    wait_until(
        lambda: len([p for p in parks(second) if p["reason"] == "contention"]) >= 2,
        timeout=20,
        what="the second run to be snoozed twice",
    )
    assert Execution.objects.get(pk=second).status == ExecutionStatus.PENDING
    assert backend.lock_holder(lock) == f"run:{first}"
    assert acquires(second) == []
    assert [e["execution"] for e in holders.entries()] == [str(first)]  # only its first step

    holders.client.delete(f"{holders.ns}:hold")
    rows = wait_finished([first, second], timeout=30)
    assert_completed(rows)
    assert services.find(first).outcome.value == "unit done"
    # Re-adopted on resume: one grant for the whole run, parked or not.
    kinds = [e.kind for e in trace(first)]
    assert kinds.count("resume") >= 2, kinds
    assert len(acquires(first, lock=holders.lock_key)) == 1
    entries = assert_one_holder_at_a_time(holders, [first, second])
    assert [e["execution"] for e in entries] == [str(first), str(second)]
    # The second run got the lock only after the first one completed.
    completed_at = next(e.at for e in trace(first) if e.kind == "complete")
    acquired_at = next(e.at for e in trace(second) if e.kind == "acquire")
    assert acquired_at >= completed_at
    assert backend.lock_holder(lock) is None


def test_a_run_killed_while_it_holds_its_lock_reattaches_it_when_recovered(
    start_coordinated_worker: Any, holders: Holders, backend: Any
) -> None:
    # The worker process dies right after the run's first step committed, holding the lock.
    start_coordinated_worker(concurrency=2, faults="after_step_commit@first=kill:once")
    first = LockedWithUnit.run(holders.inputs(pause=0.0)).execution_id
    wait_until(lambda: holders.entries(), timeout=30, what="the first run's first step to run")
    second = LockedHolder.run(holders.inputs(pause=0.0)).execution_id
    lock = f"lock:{holders.lock_key}"
    # Until it is recovered, nobody else gets its lock.
    wait_until(
        lambda: any(p["reason"] == "contention" for p in parks(second)),
        timeout=20,
        what="the second run to find the lock taken",
    )
    assert backend.lock_holder(lock) == f"run:{first}"

    rows = wait_finished([first, second], timeout=45, sweep=True)
    assert_completed(rows)
    assert Execution.objects.get(pk=first).recovery_attempts == 1
    assert services.find(first).outcome.value == "unit done"
    # Recovered by another process: the lock re-adopted, not taken again.
    assert len(acquires(first, lock=holders.lock_key)) == 1
    entries = assert_one_holder_at_a_time(holders, [first, second])
    assert [e["execution"] for e in entries] == [str(first), str(second)]
    assert backend.lock_holder(lock) is None


# ---------------------------------------------------------------------------- Redis restarted


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    yield server
    server.kill()


def test_a_coordination_redis_killed_and_restarted_mid_run_corrupts_nothing(
    start_coordinated_worker: Any,
    holders: Holders,
    private_redis: PrivateRedis,
    coordination: dict[str, Any],
) -> None:
    coordination["COORDINATION_REDIS"] = private_redis.url  # the broker stays on the suite's
    start_coordinated_worker(concurrency=3)
    ids = start_runs(LockedHolder, holders.inputs(pause=0.2), 10)
    wait_until(lambda: len(holders.entries()) >= 2, timeout=30, what="two runs to hold the lock")

    private_redis.kill()

    def unavailable() -> int:
        return max(len([p for p in parks(i) if p["reason"] == "unavailable"]) for i in ids)

    # Down long enough for a run to find it down twice (1 s apart).
    wait_until(
        lambda: unavailable() >= 2,
        timeout=20,
        what="a run to be rescheduled twice because Redis is down",
    )
    # The lock's state dies with the server: restart it once no body is inside the lock (a
    # body that outlives the server's data cannot be protected by it; its run's PostgreSQL
    # lease and fence are what keep it the run's only process).
    wait_until(lambda: holders.holders() == 0, timeout=10, what="the bodies in flight to end")
    private_redis.start()

    rows = wait_finished(ids, timeout=45, sweep=True)
    assert_completed(rows)
    entries = assert_one_holder_at_a_time(holders, ids)  # fences kept increasing, too
    assert len(entries) == len(ids)
    reasons = [p["reason"] for i in ids for p in parks(i)]
    assert "unavailable" in reasons
    assert set(reasons) <= {"contention", "unavailable"}
    # The engine's own rows: every run completed once, one record per step, nothing unsent.
    assert all(r.finished_at is not None and r.lease_owner is None for r in rows)
    records = StepRecord.objects.filter(execution_id__in=ids)
    assert sorted(records.values_list("execution_id", flat=True)) == sorted(ids)
    assert set(records.values_list("status", flat=True)) == {"completed"}
    assert not records.values("execution_id", "step").annotate(n=Count("id")).filter(n__gt=1)
    services.sweep()
    assert not Dispatch.objects.filter(execution_id__in=ids, sent_at__isnull=True).exists()
    assert all([e.kind for e in trace(i)].count("complete") == 1 for i in ids)


# ---------------------------------------------------------------------------- side by side


def test_a_run_level_lock_holds_for_steps_side_by_side(
    start_coordinated_worker: Any, holders: Holders, backend: Any
) -> None:
    start_coordinated_worker(concurrency=2)
    ids = start_runs(LockedSideBySide, holders.inputs(pause=0.2), 3)
    rows = wait_finished(ids, timeout=60)
    assert [r.status for r in rows] == [ExecutionStatus.COMPLETED] * 3
    entries = holders.entries()
    assert len(entries) == 9
    spans = {}
    for execution, group in itertools.groupby(
        sorted(entries, key=lambda e: e["execution"]), key=lambda e: e["execution"]
    ):
        group = list(group)
        spans[execution] = (min(e["start"] for e in group), max(e["end"] for e in group))
    # Within a run the three steps overlapped; runs never did (the lock held across them).
    assert holders.max_holders() == 3
    ordered = sorted(spans.values())
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ordered)), ordered
    assert backend.lock_holder(f"lock:{holders.lock_key}") is None
