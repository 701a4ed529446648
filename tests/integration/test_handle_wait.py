"""ExecutionHandle.wait(): the outcome once a run stops moving, a timeout (saying when no worker
or sweeper is alive to move the run), and refusals.

The wait for a run a real worker finishes is in ``tests/workers/test_background.py``."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import transaction
from django.utils import timezone

from django_reactor import Completed, Paused, Reactor, interrupt, services, sleep, step
from django_reactor.exceptions import ExecutionNotFound, TransactionActive, WaitTimedOut
from django_reactor.models import Execution, ProcessHeartbeat
from django_reactor.services.health import beat_worker
from django_reactor.states import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)


class WaitsForApproval(Reactor):
    @step()
    def request() -> str:
        return "asked"

    approval = interrupt(after="request")


class InBackground(Reactor):
    @step()
    def only() -> int:
        return 7

    class Meta:
        background = "all"


def test_a_paused_run_is_returned_at_once_as_paused() -> None:
    handle = services.find(WaitsForApproval.run({}).execution_id)
    outcome = handle.wait(timeout=5)
    assert isinstance(outcome, Paused)
    assert [p.step for p in outcome.interrupts] == ["approval"]


def test_a_run_nobody_takes_times_out_with_its_status() -> None:
    handle = services.find(InBackground.run({}).execution_id)  # no worker consumes it here
    started = time.monotonic()
    with pytest.raises(WaitTimedOut) as timed_out:
        handle.wait(timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 3
    assert timed_out.value.status == ExecutionStatus.PENDING
    assert timed_out.value.execution_id == handle.id
    assert "is still pending after 0.3 s" in str(timed_out.value)
    assert isinstance(timed_out.value, TimeoutError)


class Naps(Reactor):
    @step()
    def first() -> str:
        return "done"

    nap = sleep(dt.timedelta(hours=1), after=["first"])


def a_worker_beats() -> None:
    beat_worker(
        name="w1@host", queues=["q"], concurrency=1, tasks_done=0, started_at=timezone.now()
    )


def test_a_timed_out_wait_says_no_worker_is_alive_to_take_the_run() -> None:
    handle = services.find(InBackground.run({}).execution_id)
    with pytest.raises(WaitTimedOut) as timed_out:
        handle.wait(timeout=0.1)
    message = str(timed_out.value)
    assert message.startswith(f"execution {handle.id} is still pending after 0.1 s. No worker ")
    assert "start a Celery worker (`celery -A yourproject worker`)" in message
    assert message.endswith("until then this run does not move.")
    assert "reactor_show" not in message
    [warning] = timed_out.value.warnings
    assert warning.startswith("no worker has reported in the last day")

    # A worker seen a minute ago is gone (three heartbeat intervals are 30 s): named.
    a_worker_beats()
    ProcessHeartbeat.objects.update(last_seen_at=timezone.now() - dt.timedelta(minutes=1))
    with pytest.raises(WaitTimedOut) as timed_out:
        handle.wait(timeout=0.1)
    assert "No worker is alive: the last one (w1@host, pid " in str(timed_out.value)


def test_a_timed_out_wait_with_a_worker_alive_says_what_it_said() -> None:
    a_worker_beats()
    handle = services.find(InBackground.run({}).execution_id)
    with pytest.raises(WaitTimedOut) as timed_out:
        handle.wait(timeout=0.1)
    assert str(timed_out.value) == (
        f"execution {handle.id} is still pending after 0.1 s; wait again, or look at it "
        "with reactor_show"
    )
    assert timed_out.value.warnings == ()


def test_a_timed_out_wait_for_a_sleeping_run_says_no_sweeper_wakes_it() -> None:
    a_worker_beats()
    handle = services.find(Naps.run({}).execution_id)
    with pytest.raises(WaitTimedOut) as timed_out:
        handle.wait(timeout=0.1)
    [warning] = timed_out.value.warnings
    assert warning.startswith("no sweeper has run in the last day: start `python manage.py")
    assert warning.endswith("until then this run is not woken")
    services.sweep()  # a sweeper alive: the sleep ends at its time, nothing to say
    with pytest.raises(WaitTimedOut) as timed_out:
        handle.wait(timeout=0.1)
    assert timed_out.value.warnings == ()


def test_wait_sees_a_run_another_thread_finishes() -> None:
    handle = services.find(InBackground.run({}).execution_id)
    waiting = threading.Event()
    done: list[object] = []

    def wait_in_a_thread() -> None:
        waiting.set()
        try:
            done.append(handle.wait(timeout=30))
        finally:
            from django.db import connection

            connection.close()

    waiter = threading.Thread(target=wait_in_a_thread)
    waiter.start()
    assert waiting.wait(timeout=10)
    services.resume(handle.id)  # what a worker's task does
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    (outcome,) = done
    assert isinstance(outcome, Completed)
    assert outcome.value == {"only": 7}


def test_wait_is_refused_inside_a_transaction_and_for_a_bad_timeout() -> None:
    handle = services.find(InBackground.run({}).execution_id)
    with transaction.atomic(), pytest.raises(TransactionActive, match="inside transaction"):
        handle.wait(timeout=1)
    with pytest.raises(ValueError, match="cannot be negative"):
        handle.wait(timeout=-1)


def test_a_run_pruned_while_waiting_is_reported() -> None:
    handle = services.find(InBackground.run({}).execution_id)
    Execution.objects.filter(pk=handle.id).delete()
    with pytest.raises(ExecutionNotFound, match="no longer exists"):
        handle.wait(timeout=1)
