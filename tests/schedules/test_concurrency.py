"""Exactly-once firing: two sweepers, each in a thread with its own database connection, race
for every tick of ten schedules, round after round, on PostgreSQL."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from django_reactor import services
from django_reactor.models import Execution, ScheduleFire
from django_reactor.services.schedules import FireReport, idempotency_key
from django_reactor.store import outbox
from django_reactor.testing import make_schedules_due
from tests.schedules.reactors import NightlyReport

SCHEDULES = 10
ROUNDS = 100  # 10 x 100 = 1,000 ticks


@pytest.fixture
def captured_publisher() -> Iterator[None]:
    """The runs' tasks go nowhere (no worker takes them in this test)."""

    class Capture:
        def publish(self, dispatches: Any) -> list[int]:
            return []

    previous = outbox.register_publisher(Capture())
    yield
    outbox.register_publisher(previous[0], after_commit=previous[1])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_sweepers_fire_each_of_1000_ticks_exactly_once(captured_publisher: None) -> None:
    schedules = [
        # A yearly cron: no tick of its own comes during the test; each round makes one due.
        services.schedules.create(
            NightlyReport,
            cron="0 0 1 1 *",
            inputs={"region": "eu"},
            overlap="allow",
            name=f"race-{i}",
        )
        for i in range(SCHEDULES)
    ]
    start = threading.Barrier(3, timeout=60)
    done = threading.Barrier(3, timeout=120)
    reports: dict[str, list[FireReport]] = {"a": [], "b": []}
    errors: list[BaseException] = []

    def sweeper(name: str) -> None:
        try:
            for _ in range(ROUNDS):
                start.wait()
                try:
                    reports[name].append(services.schedules.fire_due())
                finally:
                    done.wait()
        except BaseException as exc:  # reported below; the barriers break for the others
            errors.append(exc)
            start.abort()
            done.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweeper, args=(n,)) for n in reports]
    for thread in threads:
        thread.start()
    try:
        for _ in range(ROUNDS):
            assert make_schedules_due() == SCHEDULES  # the next tick of every schedule comes
            start.wait()
            done.wait()
    finally:
        for thread in threads:
            thread.join(timeout=120)
    assert errors == []

    started = {name: sum(r.started for r in rs) for name, rs in reports.items()}
    assert sum(started.values()) == SCHEDULES * ROUNDS
    assert min(started.values()) > 0  # both won ticks: they raced for them
    assert all(r.skipped == r.queued == r.refused == 0 for rs in reports.values() for r in rs)

    fires = list(ScheduleFire.objects.values_list("schedule_id", "fire_at", "outcome"))
    assert len(fires) == SCHEDULES * ROUNDS
    assert {outcome for _, _, outcome in fires} == {"started"}
    per_schedule = collections.Counter(schedule_id for schedule_id, _, _ in fires)
    assert per_schedule == {s.id: ROUNDS for s in schedules}

    # One run per tick, keyed by the tick.
    runs = dict(ScheduleFire.objects.values_list("execution_id", "schedule_id"))
    assert len(runs) == SCHEDULES * ROUNDS
    assert Execution.objects.count() == SCHEDULES * ROUNDS
    keys = set(Execution.objects.values_list("idempotency_key", flat=True))
    assert keys == {idempotency_key(schedule_id, at) for schedule_id, at, _ in fires}
