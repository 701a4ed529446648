"""Deliveries sent at every moment around a run's arrival at its interrupt and its receive.

Each round parks a run at ``go``; one thread resumes it (the run travels on to ``legal``, an
interrupt, and ``paid``, a receive), another delivers to both at once, after a random number
of round trips to the database, so that over the rounds the deliveries land before the run
writes its waits, while it writes them, while it moves past them and after it paused. Every
delivery must be applied exactly once, and none answered ``NotWaiting``.

``REACTOR_RACE_DELIVERIES`` sets how many deliveries (two per round); the suite runs 60.
"""

from __future__ import annotations

import os
import random
import threading
from typing import Any

import pytest
from django.db import connection, connections

import django_reactor
from django_reactor import Dispatched, Reactor, arg, interrupt, receive, services, step
from django_reactor.models import Execution, Message
from django_reactor.states import ExecutionStatus, MessageStatus
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)

DELIVERIES = int(os.environ.get("REACTOR_RACE_DELIVERIES", "60"))


class Racing(Reactor):
    start = step(Tracked)
    go = interrupt(after="start")
    legal = interrupt(after="go")
    paid = receive("payment", after="go")
    ship = step(Tracked, legal=arg.result("legal", "n"), paid=arg.result("paid", "n"))


def round_trips(count: int) -> None:
    with connection.cursor() as cursor:
        for _ in range(count):
            cursor.execute("SELECT 1")


def test_every_delivery_around_the_arrival_is_applied_exactly_once() -> None:
    chooser = random.Random(29)
    landed: dict[str, int] = {}
    for number in range(DELIVERIES // 2):
        run_id = Racing.run({}).execution_id
        barrier = threading.Barrier(2, timeout=10)
        results: dict[str, Any] = {}
        delay = chooser.randrange(0, 300)
        order = chooser.random() < 0.5

        def arrive(run_id: Any = run_id, barrier: Any = barrier, results: Any = results) -> None:
            try:
                barrier.wait()
                results["go"] = services.resume_interrupt(run_id, step="go", payload={})
            except Exception as exc:  # reported below
                results["go"] = exc
            finally:
                connections.close_all()

        def deliver(
            run_id: Any = run_id,
            barrier: Any = barrier,
            results: Any = results,
            delay: int = delay,
            order: bool = order,
            number: int = number,
        ) -> None:
            try:
                barrier.wait()
                round_trips(delay)
                sends = [
                    ("legal", lambda: services.resume_interrupt(
                        run_id, step="legal", payload={"n": number}
                    )),
                    ("paid", lambda: django_reactor.send(run_id, "payment", {"n": number})),
                ]  # fmt: skip
                for name, call in sends if order else reversed(sends):
                    try:
                        results[name] = call()
                    except Exception as exc:  # reported below
                        results[name] = exc
            finally:
                connections.close_all()

        threads = [threading.Thread(target=arrive), threading.Thread(target=deliver)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

        failures = {k: v for k, v in results.items() if isinstance(v, Exception)}
        assert not failures, (number, failures)
        for name in ("legal", "paid"):
            kind = type(results[name]).__name__
            landed[kind] = landed.get(kind, 0) + 1
        if Execution.objects.get(pk=run_id).status == ExecutionStatus.PENDING:
            assert Dispatched in {type(r) for r in results.values()}, results
            services.resume(run_id)
        row = Execution.objects.get(pk=run_id)
        assert row.status == ExecutionStatus.COMPLETED, (number, results)
        assert row.steps.get(step="ship").result == {
            "step": "ship",
            "legal": number,
            "paid": number,
        }
        events = list(row.events.values_list("kind", "step"))
        for name in ("legal", "paid"):
            assert events.count(("payload", name)) == 1, (number, events)
        assert list(
            Message.objects.filter(execution_id=run_id).values_list("status", flat=True)
        ) == [MessageStatus.CONSUMED] * len(Message.objects.filter(execution_id=run_id))
    # Deliveries landed both before the run got there (kept) and after (taken by the run).
    assert len(landed) > 1, landed
