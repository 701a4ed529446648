"""Events emitted at every moment around a run's arrival at its ``wait_for_event``.

Each round parks a run at ``go``; one thread resumes it (the run travels on to ``shipped``, a
wait for an event with a look back), another emits the event after a random number of round
trips to the database, so that over the rounds the event lands before the run writes its
wait, while it writes it, and after it paused. Every event must be taken exactly once: the
emit and the wait take turns on the key, and whichever comes second sees the other.

``REACTOR_RACE_EVENTS`` sets how many rounds; the suite runs 40.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import threading
from typing import Any

import pytest
from django.db import connection, connections

import django_reactor
from django_reactor import Reactor, arg, interrupt, services, step, wait_for_event
from django_reactor.models import Execution, Message
from django_reactor.states import ExecutionStatus, MessageKind, MessageStatus
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = int(os.environ.get("REACTOR_RACE_EVENTS", "40"))


class RacingWait(Reactor):
    start = step(Tracked, order=arg.input("order"))
    go = interrupt(after="start")
    shipped = wait_for_event(
        "race.shipped",
        match=arg.input("order"),
        after="go",
        lookback=dt.timedelta(minutes=1),
        resume="inline",
    )
    notify = step(Tracked, n=arg.result("shipped", "n"))


def round_trips(count: int) -> None:
    with connection.cursor() as cursor:
        for _ in range(count):
            cursor.execute("SELECT 1")


def test_every_event_around_the_arrival_at_the_wait_is_taken_exactly_once() -> None:
    chooser = random.Random(31)
    for number in range(ROUNDS):
        order = f"R{number}"
        run_id = RacingWait.run({"order": order}).execution_id
        barrier = threading.Barrier(2, timeout=10)
        errors: list[BaseException] = []
        delay = chooser.randrange(0, 200)

        def arrive(run_id: Any = run_id, barrier: Any = barrier, errors: Any = errors) -> None:
            try:
                barrier.wait()
                services.resume_interrupt(run_id, step="go", payload={})
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                connections.close_all()

        def emit(
            order: str = order,
            delay: int = delay,
            number: int = number,
            barrier: Any = barrier,
            errors: Any = errors,
        ) -> None:
            try:
                barrier.wait()
                round_trips(delay)
                django_reactor.emit("race.shipped", {"n": number}, key=order)
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=arrive), threading.Thread(target=emit)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors, errors
        assert not any(thread.is_alive() for thread in threads)
        # A run the emit found moving records the event when it pauses, and a worker takes
        # it on: finish it here as the worker would.
        if Execution.objects.get(pk=run_id).status == ExecutionStatus.PENDING:
            services.resume(run_id)
        row = Execution.objects.get(pk=run_id)
        assert row.status == ExecutionStatus.COMPLETED, (number, delay, row.status)
        assert row.steps.get(step="notify").result == {"step": "notify", "n": number}
        given = Message.objects.filter(execution_id=run_id, kind=MessageKind.EVENT)
        assert [m.status for m in given] == [MessageStatus.CONSUMED], (number, delay)
