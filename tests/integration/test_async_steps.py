"""``async def`` step bodies: run to completion on the worker (or inline), in an event loop of
their own, their async ORM calls on the step's own thread, connection and transaction."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from rest_framework import serializers

import django_reactor
from django_reactor import Completed, Failed, Reactor, Step, Success, services, step
from testproject.example.models import Effect

# Not transactional: the bodies' ORM calls come back to the test's thread, inside its
# transaction (a call on another connection would not see the run's rows).
pytestmark = pytest.mark.django_db


class AsyncLast(Step):
    async def run(self, fail: bool) -> Any:
        if fail:
            raise RuntimeError("the last step failed")
        return Success(await sync_to_async(Effect.objects.count)())


class AsyncBodies(Reactor):
    class Inputs(serializers.Serializer):
        key = serializers.CharField()
        fail = serializers.BooleanField(default=False)

    @step(key=django_reactor.arg.input("key"))
    async def record(key: str) -> str:
        effect = await Effect.objects.acreate(key=key, execution_id=current_run(), step="record")
        await asyncio.sleep(0)
        return effect.key

    @record.undo
    async def unrecord(result: str, key: str) -> None:
        await Effect.objects.filter(key=result).adelete()

    last = step(AsyncLast, fail=django_reactor.arg.input("fail"), wait_for="record")

    class Meta:
        returns = "record"


def current_run() -> Any:
    return django_reactor.step_context().execution_id


class AtomicAsync(Reactor):
    @step(atomic=True)
    async def write_then_fail() -> None:
        await Effect.objects.acreate(key="atomic", execution_id=current_run(), step="w")
        raise RuntimeError("after the write")


def test_async_def_bodies_run_and_use_the_async_orm() -> None:
    outcome = AsyncBodies.run({"key": "e1"})
    assert isinstance(outcome, Completed), outcome
    assert outcome.value == "e1"
    assert services.find(outcome.execution_id).step_result("last") == 1
    assert Effect.objects.get(key="e1").execution_id == outcome.execution_id


def test_an_async_undo_rolls_back_an_async_body() -> None:
    outcome = AsyncBodies.run({"key": "e2", "fail": True})
    assert isinstance(outcome, Failed)
    assert outcome.error.message == "the last step failed"
    assert not Effect.objects.filter(key="e2").exists()
    assert services.find(outcome.execution_id).step("record").rollback == "undone"


def test_an_atomic_async_body_writes_in_its_steps_transaction() -> None:
    outcome = AtomicAsync.run({})
    assert isinstance(outcome, Failed)
    assert outcome.error.message == "after the write"
    assert not Effect.objects.filter(key="atomic").exists()  # rolled back with the attempt


@pytest.mark.django_db(transaction=True)
def test_async_bodies_of_a_run_started_by_arun_reach_the_orm() -> None:
    outcome = asyncio.run(AsyncBodies.arun({"key": "e3"}))
    assert isinstance(outcome, Completed), outcome
    assert Effect.objects.filter(key="e3").exists()


class SlowAsync(Reactor):
    @step(timeout=0.1, retry=django_reactor.Retry(attempts=1))
    async def slow() -> str:
        for _ in range(50):
            if django_reactor.step_context().should_stop():
                return "stopped"  # abandoned: what it returns is thrown away
            await asyncio.sleep(0.01)
        return "too late"


def test_an_async_body_past_its_timeout_fails_the_attempt_as_a_sync_one_does() -> None:
    started = time.monotonic()
    outcome = SlowAsync.run({})
    assert isinstance(outcome, Failed)
    assert outcome.error.exception_class == "django_reactor.exceptions.StepTimedOut"
    assert time.monotonic() - started < 0.45  # it did not wait for the body's 0.5 s
