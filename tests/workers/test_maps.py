"""Fanned-out maps on real prefork Celery workers: fan-in, a worker killed mid-map, rollback.

Elements record every run and undo in Redis (``tests.workers.reactors.MapTick``), per index
and per worker process, so the tests can tell an element run again after its worker died
(allowed: at-least-once) from a duplicated slot or a second wake-up of the run (never).
The workers run with ``LEASE_SECONDS=2`` (the slot lease) and ``REDISPATCH_AFTER=3`` (see
``conftest.py``); the last two tests hold a slot longer than that lease in a live task.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db.models import Count

from django_reactor import services
from django_reactor.models import Execution, MapChunk, MapResult, MapRun
from django_reactor.states import ElementStatus, ExecutionStatus, MapStatus
from tests.workers.harness import Worker, wait_until
from tests.workers.reactors import FannedOutTicks, TwoTaskTicks
from tests.workers.test_background import finished
from tests.workers.test_crashes import sweep_until_finished


class Recorder:
    """What the elements of one test wrote to Redis."""

    def __init__(self) -> None:
        self.ns = f"maptest:{uuid.uuid4().hex}"
        self.client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)

    def inputs(self, size: int, *, fail_at: int = -1, pause: float = 0.0) -> dict[str, Any]:
        return {
            "items": list(range(size)),
            "ns": self.ns,
            "redis_url": settings.REDIS_URL,
            "fail_at": fail_at,
            "pause": pause,
        }

    def counts(self, kind: str, size: int) -> dict[int, int]:
        values = self.client.mget([f"{self.ns}:{kind}:{i}" for i in range(size)])
        return {i: int(v or 0) for i, v in enumerate(values)}

    def entries(self, kind: str) -> list[tuple[int, int]]:
        """``(pid, index)`` in the order the elements wrote them."""
        return [
            (int(pid), int(index))
            for pid, index in (e.split(":") for e in self.client.lrange(f"{self.ns}:{kind}", 0, -1))
        ]

    def waiting(self) -> list[tuple[int, int]]:
        """``(pid, index)`` of the elements waiting at the barrier."""
        members = self.client.smembers(f"{self.ns}:waiting")
        return sorted((int(pid), int(index)) for pid, index in (e.split(":") for e in members))

    def clear(self) -> None:
        keys = list(self.client.scan_iter(f"{self.ns}:*"))
        if keys:
            self.client.delete(*keys)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    yield recorder
    recorder.clear()


def slots(execution_id: Any) -> dict[int, MapResult]:
    return {r.index: r for r in MapResult.objects.filter(map_run__execution_id=execution_id)}


def duplicated_indices(execution_id: Any) -> list[int]:
    return list(
        MapResult.objects.filter(map_run__execution_id=execution_id)
        .values("index")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .values_list("index", flat=True)
    )


def kinds_after_map(execution_id: Any) -> list[str]:
    """Run-level and map-step events from the map's park on."""
    trace = [(e.kind, e.step) for e in services.find(execution_id).trace]
    first_park = trace.index(("park", "ticks"))
    return [kind for kind, _ in trace[first_park:]]


@pytest.mark.mariadb
@pytest.mark.behind_pgbouncer
def test_a_map_of_200_elements_over_two_workers_completes_and_wakes_the_run_once(
    start_worker: Any, recorder: Recorder
) -> None:
    start_worker()
    start_worker()
    outcome = FannedOutTicks.run(recorder.inputs(200))
    row = wait_until(lambda: finished(outcome.execution_id), what="the map to finish")
    assert row.status == ExecutionStatus.COMPLETED, row.failure
    assert services.find(row.id).outcome.value == sum(i * 2 for i in range(200))

    run = MapRun.objects.get(execution_id=row.id)
    assert (run.size, run.settled, run.succeeded, run.failed) == (200, 200, 200, 0)
    assert run.collected
    assert run.status == MapStatus.SETTLED
    assert run.stop_reason == ""
    found = slots(row.id)
    assert sorted(found) == list(range(200))
    assert {s.status for s in found.values()} == {ElementStatus.SUCCEEDED}
    assert all(found[i].value == i * 2 for i in range(200))
    assert duplicated_indices(row.id) == []
    # No worker died: every element ran once, claimed once.
    assert recorder.counts("runs", 200) == dict.fromkeys(range(200), 1)
    assert {s.attempts for s in found.values()} == {1}
    # Both workers' processes took part (4 element tasks in flight).
    assert len({pid for pid, _ in recorder.entries("started")}) >= 2

    # The run parked once for the map and was resumed exactly once, by the last settle.
    after = kinds_after_map(row.id)
    assert after.count("resume") == 1, after
    assert after.count("park") == 1, after
    assert after[-1] == "complete"
    assert [(e.kind, e.step) for e in services.find(row.id).trace] == [
        ("start", ""), ("resume", ""), ("park", "ticks"), ("resume", ""), ("run", "ticks"),
        ("complete", ""),
    ]  # fmt: skip


@pytest.mark.mariadb
def test_a_worker_killed_mid_map_is_replaced_and_the_map_completes_once(
    start_worker: Any, recorder: Recorder
) -> None:
    size = 40
    recorder.client.set(f"{recorder.ns}:hold", "1")  # every element waits at the barrier
    doomed: Worker = start_worker(concurrency=2)
    outcome = TwoTaskTicks.run(recorder.inputs(size))
    # Both element tasks are inside the first element of their chunk (0..4 and 5..9 claimed).
    waiting = wait_until(
        lambda: (w := recorder.waiting()) and len(w) == 2 and w,
        what="both worker processes to be inside an element",
    )
    in_flight = {index for _, index in waiting}
    assert in_flight == {0, 5}
    assert {pid for pid, _ in waiting} <= set(doomed.children())
    wait_until(
        lambda: Execution.objects.filter(
            pk=outcome.execution_id, status=ExecutionStatus.PENDING, lease_owner__isnull=True
        ).exists(),
        what="the run to park for the map",
    )
    # The elements in flight are the items of the chunks the workers hold; none has a slot
    # yet (a slot is written when its chunk settles).
    held = MapChunk.objects.filter(
        map_run__execution_id=outcome.execution_id, status=MapChunk.Status.RUNNING
    )
    claimed = {chunk.first + offset for chunk in held for offset in range(chunk.size)}
    assert claimed == set(range(10))
    assert not MapResult.objects.filter(map_run__execution_id=outcome.execution_id).exists()

    assert doomed.process is not None
    os.killpg(os.getpgid(doomed.process.pid), signal.SIGKILL)
    doomed.process.wait(timeout=10)
    recorder.client.delete(f"{recorder.ns}:hold")
    replacement = start_worker(concurrency=2)

    row = sweep_until_finished(outcome.execution_id, timeout=45)
    assert row.status == ExecutionStatus.COMPLETED, row.failure
    assert services.find(row.id).outcome.value == sum(i * 2 for i in range(size))
    run = MapRun.objects.get(execution_id=row.id)
    assert (run.size, run.settled, run.succeeded, run.failed) == (size, size, size, 0)
    found = slots(row.id)
    assert sorted(found) == list(range(size))
    assert {s.status for s in found.values()} == {ElementStatus.SUCCEEDED}
    assert duplicated_indices(row.id) == []
    # At least once: exactly the elements in flight in the killed worker ran twice; the rest
    # of its claimed chunks had not started and ran once, on the replacement.
    runs = recorder.counts("runs", size)
    assert {i for i, n in runs.items() if n == 2} == in_flight
    assert {i for i, n in runs.items() if n == 1} == set(range(size)) - in_flight
    reran = [(pid, i) for pid, i in recorder.entries("started") if i in in_flight]
    assert len({pid for pid, _ in reran}) >= 2
    assert set(replacement.children()) & {pid for pid, _ in recorder.entries("started")}
    # The killed chunks were claimed twice (the lapsed lease let the replacement take them).
    assert {i for i, s in found.items() if s.attempts == 2} == claimed
    assert {i for i, s in found.items() if s.attempts == 1} == set(range(size)) - claimed
    kinds = [e.kind for e in services.find(row.id).trace]
    assert kinds.count("complete") == 1


def test_an_atomic_map_failing_on_workers_undoes_what_completed_once_highest_first(
    start_worker: Any, recorder: Recorder
) -> None:
    size, fail_at, chunk = 200, 30, 5
    start_worker()
    start_worker()
    outcome = FannedOutTicks.run(recorder.inputs(size, fail_at=fail_at, pause=0.02))
    row = wait_until(lambda: finished(outcome.execution_id), what="the run to fail")
    assert row.status == ExecutionStatus.FAILED, row.status
    assert row.failure["step"] == "ticks"
    assert f"map element {fail_at} (of {size}) failed" in row.failure["message"]
    assert f"element {fail_at} failed" in row.failure["message"]

    run = MapRun.objects.get(execution_id=row.id)
    assert run.stop_reason == "failed"
    assert run.status == MapStatus.ROLLED_BACK
    assert run.first_failure == fail_at
    found = slots(row.id)
    assert sorted(found) == list(range(size))
    assert duplicated_indices(row.id) == []
    by_status: dict[str, set[int]] = {}
    for index, slot in found.items():
        by_status.setdefault(slot.status, set()).add(index)
    assert ElementStatus.SUCCEEDED not in by_status
    assert ElementStatus.RUNNING not in by_status
    assert by_status[ElementStatus.FAILED] == {fail_at}

    runs = recorder.counts("runs", size)
    undos = recorder.counts("undos", size)
    started = {i for i, n in runs.items() if n}
    assert all(n <= 1 for n in runs.values())  # no worker died: nothing ran twice
    # Every element that completed was undone exactly once; the failed one and the ones that
    # never started were not.
    undone = by_status[ElementStatus.UNDONE]
    assert undone == started - {fail_at}
    assert {i for i, n in undos.items() if n} == undone
    assert all(undos[i] == 1 for i in undone)
    assert by_status[ElementStatus.NOT_STARTED] == set(range(size)) - started
    # Claims take the lowest pending chunk: the claimed slots are a prefix of the indices, no
    # element outside it started, and the stop kept most of the map from being claimed.
    claimed = {i for i, s in found.items() if s.attempts}
    last = max(claimed)
    assert claimed == set(range(last + 1))
    assert max(started) <= last
    assert last < size - 4 * chunk
    # Rollback claims the highest succeeded chunk first, so every process undid its elements
    # in strictly descending index order, and the highest was undone in the first chunk.
    order = recorder.entries("undone")
    assert sorted(i for _, i in order) == sorted(undone)
    for pid in {pid for pid, _ in order}:
        mine = [i for p, i in order if p == pid]
        assert mine == sorted(mine, reverse=True), (pid, mine)
    # At most 4 undo tasks claim before any element is undone: the first undone element is
    # in one of the 4 highest chunks.
    assert order[0][1] in sorted(undone, reverse=True)[: 4 * chunk]

    trace = [(e.kind, e.step) for e in services.find(row.id).trace]
    assert ("fail", "ticks") in trace
    assert ("compensate", "ticks") in trace
    # Woken once when the map settled (it failed), once when its elements were undone.
    assert trace == [
        ("start", ""), ("resume", ""), ("park", "ticks"),
        ("resume", ""), ("fail", "ticks"), ("park", "ticks"),
        ("resume", ""), ("rollback", ""), ("compensate", "ticks"), ("fail", ""),
    ]  # fmt: skip
    parks = [e.data for e in services.find(row.id).trace if e.kind == "park"]
    assert [p["waiting_for"] for p in parks] == ["map", "map rollback"]


# ---------------------------------------------------------------------------- slow elements
#
# No worker dies in these two tests: a slot's lease must not lapse under a live task that is
# still working on it, as a run's lease does not under a long step (its lease keeper extends
# it), or another task takes the slot and runs (or undoes) the element a second time.


def test_an_element_slower_than_the_lease_is_not_run_again_by_a_live_task(
    start_worker: Any, recorder: Recorder
) -> None:
    size = 30
    recorder.client.set(f"{recorder.ns}:slow:5", "3.5")  # > LEASE_SECONDS=2 of the workers
    start_worker(concurrency=2)
    outcome = TwoTaskTicks.run(recorder.inputs(size, pause=0.1))
    row = wait_until(lambda: finished(outcome.execution_id), what="the map to finish")
    assert row.status == ExecutionStatus.COMPLETED, row.failure
    found = slots(row.id)
    assert {s.status for s in found.values()} == {ElementStatus.SUCCEEDED}
    assert duplicated_indices(row.id) == []
    runs = recorder.counts("runs", size)
    assert {i: n for i, n in runs.items() if n != 1} == {}, recorder.entries("started")
    assert {i: s.attempts for i, s in found.items() if s.attempts != 1} == {}


def test_an_undo_chunk_slower_than_the_lease_undoes_each_element_once(
    start_worker: Any, recorder: Recorder
) -> None:
    size = 20
    # A chunk of 5 undos takes 3.5 s, longer than LEASE_SECONDS=2 of the workers.
    recorder.client.set(f"{recorder.ns}:undo_pause", "0.7")
    start_worker(concurrency=2)
    outcome = TwoTaskTicks.run(recorder.inputs(size, fail_at=size - 1))
    row = wait_until(lambda: finished(outcome.execution_id), timeout=45, what="the run to fail")
    assert row.status == ExecutionStatus.FAILED, row.status
    found = slots(row.id)
    assert {i for i, s in found.items() if s.status == ElementStatus.UNDONE} == set(range(size - 1))
    undos = recorder.counts("undos", size)
    assert {i: n for i, n in undos.items() if n != 1} == {size - 1: 0}, recorder.entries("undone")
