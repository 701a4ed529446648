"""async_step and async_reactor without workers: declaration, dispatch, waiting limits."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import Outcome, Reactor, arg, async_reactor, async_step, services, step
from django_reactor.exceptions import DefinitionError
from django_reactor.models import Dispatch, Execution
from django_reactor.states import ExecutionStatus, StepStatus
from tests.integration.reactors import Tracked, ledger

pytestmark = pytest.mark.django_db


class Needs(Reactor):
    class Inputs(serializers.Serializer):
        count = serializers.IntegerField(min_value=1)

    only = step(Tracked)


class DispatchesBadChild(Reactor):
    first = step(Tracked)
    child = async_reactor(Needs, count=arg.value(0), wait_for=["first"])


def test_invalid_child_inputs_fail_the_dispatching_step_and_create_nothing() -> None:
    outcome = DispatchesBadChild.run({})
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.kind == "contract"
    assert outcome.error.field_errors == {
        "count": ["Ensure this value is greater than or equal to 1."]
    }
    assert Execution.objects.count() == 1
    assert ledger.calls == [("run", "first"), ("undo", "first")]


class FireAndForget(Reactor):
    first = step(Tracked)
    unit = async_step(Tracked, wait_for=["first"])
    last = step(Tracked, wait_for=["first"])


def test_a_unit_is_dispatched_and_nobody_waits_for_it_unless_they_read_it() -> None:
    outcome = FireAndForget.run({})
    assert outcome.ok
    unit = Execution.objects.get(parent=outcome.execution_id)
    assert (unit.status, unit.detached, unit.reactor) == (
        ExecutionStatus.PENDING, True, f"{FireAndForget.definition.name}:unit",
    )  # fmt: skip
    assert Dispatch.objects.get(execution=unit).reason == "start"
    record = services.find(outcome.execution_id).step("unit")
    assert record.status == StepStatus.DISPATCHED
    assert record.result == {"execution_id": str(unit.id)}
    # A worker would run it: here, in this process.
    assert services.resume(unit.id).ok
    assert ledger.calls == [("run", "first"), ("run", "last"), ("run", "unit")]


def test_the_parent_never_undoes_its_units() -> None:
    outcome = FireAndForget.run({})
    unit = Execution.objects.get(parent=outcome.execution_id)
    services.resume(unit.id)
    ledger.clear()
    services.undo(outcome.execution_id)
    assert ledger.calls == [("undo", "last"), ("undo", "first")]


class Reads(Reactor):
    unit = async_step(Tracked)

    @step(value=arg.result("unit"))
    def reader(value: Any) -> Any:
        return value


def test_an_inline_reader_gives_up_after_the_wait_timeout(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "ASYNC_WAIT_TIMEOUT": 0.3, "ASYNC_POLL_INTERVAL": 0.1}
    outcome = Reads.run({})
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.step == "reader"
    assert "did not finish within 0.3 s" in outcome.error.message
    assert "is a Celery worker running?" in outcome.error.message


def test_returns_cannot_name_an_async_unit() -> None:
    with pytest.raises(DefinitionError, match="an async unit"):

        class Bad(Reactor):
            unit = async_step(Tracked)

            class Meta:
                returns = "unit"


def test_a_unit_can_be_steered_but_not_retried_apart_from_its_reader() -> None:
    from django_reactor.exceptions import InvalidTransition

    outcome = FireAndForget.run({})
    unit = Execution.objects.get(parent=outcome.execution_id)
    assert services.cancel(unit.id, reason="not needed").status == ExecutionStatus.CANCELLED
    Execution.objects.filter(pk=unit.pk).update(status=ExecutionStatus.FAILED)
    with pytest.raises(InvalidTransition, match="async unit run by step 'unit'"):
        services.retry(unit.id)


class ReadsInBackground(Reactor):
    unit = async_step(Tracked)

    @step(value=arg.result("unit"))
    def reader(value: Any) -> Any:
        return value.status if isinstance(value, Outcome) else value

    class Meta:
        background = "all"
        returns = "reader"


def parked_parent() -> tuple[Any, Execution]:
    outcome = ReadsInBackground.run({})
    parked = services.resume(outcome.execution_id)  # dispatches the unit, then parks the reader
    assert parked is not None
    assert parked.status == ExecutionStatus.PENDING
    assert [e.kind for e in services.find(outcome.execution_id).trace][-1] == "park"
    return outcome, Execution.objects.get(parent=outcome.execution_id)


def test_a_unit_that_aborted_settles_its_reader() -> None:
    outcome, unit = parked_parent()
    Execution.objects.filter(pk=unit.pk).update(status=ExecutionStatus.ABORTED)
    Execution.objects.filter(pk=outcome.execution_id).update(wake_at=None)
    result = services.resume(outcome.execution_id)
    assert result is not None
    assert result.value == "aborted"


def test_a_unit_parked_for_attention_wakes_its_reader() -> None:
    outcome, unit = parked_parent()
    Execution.objects.filter(pk=unit.pk).update(reactor="gone.Unit")
    services.resume(unit.id)  # the unit's reactor is gone: parked as needs_attention
    parent = Execution.objects.get(pk=outcome.execution_id)
    assert parent.wake_at is None
    assert Dispatch.objects.filter(execution=parent, reason="wake").exists()
    result = services.resume(outcome.execution_id)
    assert result is not None
    assert result.value == "needs_attention"


def test_a_unit_finishing_wakes_its_parked_reader() -> None:
    outcome, unit = parked_parent()
    assert services.resume(unit.id).ok
    parent = Execution.objects.get(pk=outcome.execution_id)
    assert parent.wake_at is None
    assert Dispatch.objects.filter(execution=parent, reason="wake").exists()
    assert services.resume(outcome.execution_id).value == {"step": "unit"}
