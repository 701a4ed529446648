"""ExecutionHandle.wait(): the outcome once a run stops moving, a timeout, and refusals.

The wait for a run a real worker finishes is in ``tests/workers/test_background.py``."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import transaction

from django_reactor import Completed, Paused, Reactor, interrupt, services, step
from django_reactor.exceptions import ExecutionNotFound, TransactionActive, WaitTimedOut
from django_reactor.models import Execution
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
