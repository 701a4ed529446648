"""The async API (``Reactor.arun``, ``handle.await_outcome``, ``arefresh``, ``acancel``,
``services.aresume_interrupt``, ``asend``, ``aemit``) and ``async def`` step bodies.

The same API under a real ASGI server with 200 concurrent requests is in
``tests/workers/test_asgi.py``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.test import override_settings
from rest_framework import serializers

import django_reactor
from django_reactor import (
    Cancelled,
    Completed,
    Failed,
    Paused,
    Reactor,
    interrupt,
    receive,
    services,
    step,
    wait_for_event,
)
from django_reactor.exceptions import ExecutionNotFound, TransactionActive, WaitTimedOut
from django_reactor.models import Execution
from django_reactor.runtime import aio
from django_reactor.states import ExecutionStatus
from tests.workers.harness import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class Inline(Reactor):
    class Inputs(serializers.Serializer):
        n = serializers.IntegerField()

    @step(n=django_reactor.arg.input("n"))
    def double(n: int) -> int:
        return n * 2

    class Meta:
        returns = "double"


class InBackground(Reactor):
    @step()
    def only() -> int:
        return 7

    class Meta:
        background = "all"


class Approved(Reactor):
    @step()
    def ask() -> str:
        return "asked"

    approval = interrupt(after="ask")

    @step(approval=django_reactor.arg.result("approval"))
    def done(approval: Any) -> Any:
        return approval

    class Meta:
        returns = "done"


class Paid(Reactor):
    @step()
    def order() -> str:
        return "ordered"

    paid = receive("payment", after="order")

    class Meta:
        returns = "paid"


class Refunded(Reactor):
    @step()
    def charge() -> str:
        return "charged"

    refunded = wait_for_event(
        "charge.refunded", match=django_reactor.arg.value("R1"), resume="inline"
    )

    class Meta:
        returns = "refunded"


def other_connections() -> int:
    """Sessions on the test database other than this thread's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return int(cursor.fetchone()[0])


# The tests marked django_db without a transaction await through async_to_sync: their
# thread-sensitive calls run on the test's thread, inside its transaction. The others commit:
# the await poller reads from a thread of its own.


@pytest.mark.django_db
def test_arun_returns_what_run_returns_and_replays_an_idempotency_key() -> None:
    async def twice() -> tuple[Any, Any]:
        first = await Inline.arun({"n": 21}, idempotency_key="k1")
        again = await Inline.arun({"n": 21}, idempotency_key="k1")
        return first, again

    first, again = async_to_sync(twice)()
    assert isinstance(first, Completed)
    assert first.value == 42
    assert again.execution_id == first.execution_id
    assert again.idempotent_replay
    assert Execution.objects.count() == 1


def test_a_call_closes_the_connections_it_opened_and_keeps_those_open_before() -> None:
    connection.close()
    async_to_sync(Inline.arun)({"n": 1})  # on this thread, as thread-sensitive calls run
    assert connection.connection is None
    connection.ensure_connection()  # the thread's own (a worker's may hold session locks)
    async_to_sync(Inline.arun)({"n": 2})
    assert connection.connection is not None
    assert Execution.objects.count() == 2


@pytest.mark.django_db
def test_arun_reports_invalid_inputs_as_run_does() -> None:
    outcome = async_to_sync(Inline.arun)({"n": "many"})
    assert isinstance(outcome, Failed)
    assert outcome.error.field_errors == {"n": ["A valid integer is required."]}


def test_await_outcome_returns_once_another_thread_finishes_the_run() -> None:
    execution_id = InBackground.run({}).execution_id

    async def wait_while_a_worker_runs_it() -> Any:
        handle = await InBackground.afind(execution_id)
        waiting = asyncio.ensure_future(handle.await_outcome(timeout=30))
        await asyncio.sleep(0.05)  # the waiter has read the run pending at least once
        assert not waiting.done()
        await asyncio.to_thread(resume_as_a_worker, execution_id)
        return await waiting, handle

    outcome, handle = asyncio.run(wait_while_a_worker_runs_it())
    assert isinstance(outcome, Completed)
    assert outcome.value == {"only": 7}
    assert handle.status == ExecutionStatus.COMPLETED  # the handle shows the run as it stands


def resume_as_a_worker(execution_id: Any) -> None:
    try:
        services.resume(execution_id)
    finally:
        connection.close()


@pytest.mark.postgres  # counts the sessions in pg_stat_activity
def test_many_awaits_share_one_poller_and_leave_no_connection_open() -> None:
    before = other_connections()
    ids = [InBackground.run({}).execution_id for _ in range(20)]

    async def wait_for_all() -> list[Any]:
        handles = [await InBackground.afind(i) for i in ids]
        waits = [asyncio.ensure_future(h.await_outcome(timeout=30)) for h in handles]
        await asyncio.sleep(0.05)
        poller = aio._pollers[asyncio.get_running_loop()]
        assert len(poller.waiting) == 20
        for execution_id in ids:
            await asyncio.to_thread(resume_as_a_worker, execution_id)
        return await asyncio.gather(*waits)

    outcomes = asyncio.run(wait_for_all())
    assert all(isinstance(o, Completed) for o in outcomes)
    # A closed session leaves pg_stat_activity once its backend has exited: a bounded wait.
    wait_until(lambda: other_connections() == before, timeout=10, what="the sessions to close")


def test_await_outcome_times_out_with_a_timeout_error_saying_why() -> None:
    handle = services.find(InBackground.run({}).execution_id)  # no worker takes it here
    started = time.monotonic()
    with pytest.raises(WaitTimedOut) as timed_out:
        asyncio.run(handle.await_outcome(timeout=0.3))
    assert 0.3 <= time.monotonic() - started < 3
    assert isinstance(timed_out.value, TimeoutError)
    assert timed_out.value.status == ExecutionStatus.PENDING
    assert str(timed_out.value).startswith(f"execution {handle.id} is still pending after 0.3 s")


@pytest.mark.django_db
def test_await_outcome_is_refused_inside_a_transaction_and_for_a_bad_timeout() -> None:
    handle = services.find(InBackground.run({}).execution_id)
    with transaction.atomic(), pytest.raises(TransactionActive, match="inside transaction"):
        async_to_sync(handle.await_outcome)(timeout=1)
    with pytest.raises(ValueError, match="cannot be negative"):
        async_to_sync(handle.await_outcome)(timeout=-1)


def test_await_outcome_of_a_pruned_run_says_so() -> None:
    handle = services.find(InBackground.run({}).execution_id)
    Execution.objects.filter(pk=handle.id).delete()
    with pytest.raises(ExecutionNotFound, match="no longer exists"):
        asyncio.run(handle.await_outcome(timeout=1))


def test_a_paused_run_is_awaited_at_once_and_aresume_interrupt_finishes_it() -> None:
    async def pause_then_resume() -> tuple[Any, Any, Any]:
        started = await Approved.arun({})
        handle = await Approved.afind(started.execution_id)
        paused = await handle.await_outcome(timeout=5)
        resumed = await services.aresume_interrupt(
            started.execution_id, step="approval", payload={"ok": True}
        )
        return paused, resumed, await handle.arefresh()

    paused, resumed, refreshed = asyncio.run(pause_then_resume())
    assert isinstance(paused, Paused)
    assert [p.step for p in paused.interrupts] == ["approval"]
    assert isinstance(resumed, Completed)
    assert resumed.value == {"ok": True}
    assert refreshed.status == ExecutionStatus.COMPLETED


@pytest.mark.django_db
def test_asend_and_aemit_resume_the_runs_waiting_for_them() -> None:
    async def send_and_emit() -> tuple[Any, Any, Any]:
        paid = await Paid.arun({})
        refunded = await Refunded.arun({})
        sent = await django_reactor.asend(paid.execution_id, "payment", {"amount": 5})
        emitted = await django_reactor.aemit("charge.refunded", {"amount": 3}, key="R1")
        return sent, emitted, refunded.execution_id

    sent, emitted, refunded_id = async_to_sync(send_and_emit)()
    assert isinstance(sent, Completed)
    assert sent.value == {"amount": 5}
    assert emitted.resumed == (refunded_id,)
    assert services.find(refunded_id).status == ExecutionStatus.COMPLETED


def test_acancel_cancels_the_run() -> None:
    async def cancel() -> Any:
        handle = await Approved.afind((await Approved.arun({})).execution_id)
        cancelled = await handle.acancel("not needed")
        return await cancelled.await_outcome(timeout=5)

    assert isinstance(asyncio.run(cancel()), Cancelled)


@pytest.mark.django_db
def test_calls_wait_for_a_slot_beyond_async_database_calls() -> None:
    inside = 0
    most = 0
    lock = threading.Lock()

    def counted() -> None:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.02)
        with lock:
            inside -= 1

    async def many() -> None:
        # Threads of their own, as requests under Django's ASGI handler have.
        await asyncio.gather(*(in_a_thread_of_its_own(counted) for _ in range(12)))

    with override_settings(REACTOR={"ASYNC_DATABASE_CALLS": 3}):
        asyncio.run(many())
    assert most == 3


async def in_a_thread_of_its_own(fn: Any) -> None:
    from asgiref.sync import ThreadSensitiveContext

    async with ThreadSensitiveContext():
        await aio.call(fn)
