"""Events emitted while real workers carry runs to their wait_for_event: each taken once."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

import django_reactor
from django_reactor import Dispatched, services
from django_reactor.models import Execution, Message
from django_reactor.states import MessageKind
from tests.workers.harness import wait_until
from tests.workers.message_reactors import WaitsOnWorkers
from tests.workers.test_background import body_runs
from tests.workers.test_messages import completed, kinds

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = int(os.environ.get("REACTOR_WORKER_EVENT_ROUNDS", "15"))


def test_events_racing_runs_on_workers_to_their_waits_are_taken_exactly_once(
    start_worker: Callable[..., Any],
) -> None:
    start_worker(concurrency=2)
    chooser = random.Random(2031)
    runs = []
    for number in range(ROUNDS):
        order = f"W{number}"
        run_id = WaitsOnWorkers.run({"order": order}).execution_id
        assert isinstance(services.resume_interrupt(run_id, step="go", payload={}), Dispatched)
        # Spread the moments the event lands: before the worker wrote the wait, while it
        # writes it, after it paused.
        with connection.cursor() as cursor:
            for _ in range(chooser.randrange(0, 400)):
                cursor.execute("SELECT 1")
        emitted = django_reactor.emit("worker.shipped", {"n": number}, key=order)
        assert not emitted.errors
        runs.append((run_id, number))
    for run_id, number in runs:
        row = wait_until(lambda run_id=run_id: completed(run_id), what="the workers to finish")
        assert row.steps.get(step="shipped").result == {"n": number}
        assert kinds(row.id).count(("payload", "shipped")) == 1
        assert body_runs(row.id) == {"first": 1, "ship": 1}
        assert list(
            Message.objects.filter(execution_id=row.id, kind=MessageKind.EVENT).values_list(
                "status", flat=True
            )
        ) == ["consumed"]
    assert Execution.objects.filter(reactor=WaitsOnWorkers.definition.name).count() == ROUNDS
