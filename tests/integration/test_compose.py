"""compose(): a child reactor as one step, with its own execution and its own rollback."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import Failure, Halt, Reactor, Retry, Step, arg, compose, services, step
from django_reactor.exceptions import DefinitionError, InvalidTransition
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import FAIL_AT, Tracked, ledger

pytestmark = pytest.mark.django_db


class Shipping(Reactor):
    class Inputs(serializers.Serializer):
        order_id = serializers.IntegerField()
        token = serializers.CharField(write_only=True)

    pack = step(Tracked, order_id=arg.input("order_id"))
    label = step(Tracked, wait_for=["pack"])

    @step(order_id=arg.input("order_id"), wait_for=["label"])
    def handover(order_id: int) -> Any:
        ledger("run", "handover")
        if "handover" in FAIL_AT:
            raise RuntimeError("carrier closed")
        if "halt-handover" in FAIL_AT:
            return Halt("address needs checking")
        return {"tracking": f"T{order_id}"}

    class Meta:
        returns = "handover"


class Order(Reactor):
    class Inputs(serializers.Serializer):
        order_id = serializers.IntegerField()
        token = serializers.CharField(write_only=True)

    reserve = step(Tracked)
    ship = compose(Shipping, order_id=arg.input("order_id"), wait_for=["reserve"])
    notify = step(Tracked, tracking=arg.result("ship", "tracking"))

    class Meta:
        returns = "ship"


INPUTS = {"order_id": 7, "token": "secret-token"}


def steps_of(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace if e.step]


def test_a_composed_child_runs_as_one_step_with_its_own_execution() -> None:
    outcome = Order.run(INPUTS)
    assert outcome.ok
    assert outcome.value == {"tracking": "T7"}
    assert ledger.calls == [
        ("run", "reserve"), ("run", "pack"), ("run", "label"), ("run", "handover"),
        ("run", "notify"),
    ]  # fmt: skip
    parent = services.find(outcome.execution_id)
    child = parent.child("ship")
    assert child.parent_id == parent.id
    assert child.status == ExecutionStatus.COMPLETED
    assert child.inputs == {"order_id": 7, "token": "[REDACTED]"}
    assert Execution.objects.get(pk=child.id).root_id == parent.id
    assert steps_of(parent.id) == [("run", "reserve"), ("run", "ship"), ("run", "notify")]
    assert steps_of(child.id) == [("run", "pack"), ("run", "label"), ("run", "handover")]
    assert parent.step("ship").arguments["token"] == "[REDACTED]"


def test_a_failing_child_rolls_itself_back_then_the_parent_undoes() -> None:
    FAIL_AT.add("handover")
    outcome = Order.run(INPUTS)
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.step == "ship"
    assert "composed Shipping failed" in outcome.error.message
    assert "carrier closed" in outcome.error.message
    assert [c for c in ledger.calls if c[0] != "run"] == [
        ("undo", "label"), ("undo", "pack"), ("undo", "reserve"),
    ]  # fmt: skip
    child = services.find(outcome.execution_id).child("ship")
    assert child.status == ExecutionStatus.FAILED
    # Compensating the composed step re-runs the child's rollback: nothing left to do.
    assert steps_of(outcome.execution_id) == [
        ("run", "reserve"), ("fail", "ship"), ("compensate", "ship"), ("undo", "reserve"),
    ]  # fmt: skip


def test_a_completed_child_is_undone_in_place_when_a_later_step_fails() -> None:
    FAIL_AT.add("notify")
    outcome = Order.run(INPUTS)
    assert outcome.status == ExecutionStatus.FAILED
    assert [c for c in ledger.calls if c[0] != "run"] == [
        ("compensate", "notify"), ("undo", "label"), ("undo", "pack"), ("undo", "reserve"),
    ]  # fmt: skip
    parent = services.find(outcome.execution_id)
    assert steps_of(parent.id)[-3:] == [
        ("compensate", "notify"),
        ("undo", "ship"),
        ("undo", "reserve"),
    ]
    child = parent.child("ship")
    assert child.status == ExecutionStatus.CANCELLED
    assert ("undo", "pack") in steps_of(child.id)


def test_a_halt_in_a_child_halts_the_parent() -> None:
    FAIL_AT.add("halt-handover")
    outcome = Order.run(INPUTS)
    assert outcome.status == ExecutionStatus.HALTED
    assert outcome.step == "ship"
    assert outcome.reason == "address needs checking"
    assert ("run", "notify") not in ledger.calls
    assert [c for c in ledger.calls if c[0] == "undo"] == []


STUBBORN: set[str] = set()


class Stubborn(Step):
    def run(self) -> str:
        return "done"

    def undo(self, result: Any) -> Any:
        ledger("undo", "keep")
        return Failure("cannot release") if "stubborn" in STUBBORN else None


class StubbornChild(Reactor):
    keep = step(Stubborn)

    @step(wait_for=["keep"])
    def boom() -> None:
        if "child-fails" in STUBBORN:
            raise RuntimeError("child step failed")


class StubbornParent(Reactor):
    child = compose(StubbornChild)
    after = step(Tracked, wait_for=["child"])


def test_a_child_rollback_failure_surfaces_in_the_parent() -> None:
    STUBBORN.clear()
    STUBBORN.add("stubborn")
    FAIL_AT.add("after")
    outcome = StubbornParent.run({})
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    assert [(f.step, f.action) for f in outcome.rollback_failures] == [("child.keep", "undo")]


def test_undo_retries_what_a_failed_child_could_not_roll_back() -> None:
    STUBBORN.clear()
    STUBBORN.update({"stubborn", "child-fails"})
    outcome = StubbornParent.run({})
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    assert [f.step for f in outcome.rollback_failures] == ["child.keep"]
    STUBBORN.discard("stubborn")
    ledger.clear()
    handle = services.undo(outcome.execution_id)
    assert ledger.calls == [("undo", "keep")]
    assert handle.status == ExecutionStatus.FAILED
    assert handle.child("child").status == ExecutionStatus.FAILED
    assert handle.error is not None
    assert handle.error.rollback_failures == ()


def test_undo_of_a_parent_halted_in_its_child_undoes_the_child() -> None:
    FAIL_AT.add("halt-handover")
    outcome = Order.run(INPUTS)
    assert outcome.status == ExecutionStatus.HALTED
    ledger.clear()
    handle = services.undo(outcome.execution_id)
    assert ledger.calls == [("undo", "label"), ("undo", "pack"), ("undo", "reserve")]
    assert handle.status == ExecutionStatus.CANCELLED


def test_child_inputs_are_validated_before_it_starts() -> None:
    class Parent(Reactor):
        first = step(Tracked)
        ship = compose(
            Shipping, order_id=arg.value("not a number"), token=arg.value("t"), wait_for=["first"]
        )

    outcome = Parent.run({})
    assert outcome.error.kind == "contract"
    assert outcome.error.field_errors == {"order_id": ["A valid integer is required."]}
    assert not Execution.objects.filter(parent__isnull=False).exists()
    assert ledger.calls == [("run", "first"), ("undo", "first")]


def test_compose_is_never_retried_as_a_whole() -> None:
    from django_reactor import Retry

    with pytest.raises(DefinitionError, match="cannot be retried as a whole"):
        compose(Shipping, retry=Retry(attempts=2))
    with pytest.raises(DefinitionError, match="takes a Reactor subclass"):
        compose(Tracked)


def test_undo_of_a_completed_parent_undoes_the_child() -> None:
    outcome = Order.run(INPUTS)
    ledger.clear()
    handle = services.undo(outcome.execution_id)
    assert handle.status == ExecutionStatus.CANCELLED
    assert ledger.calls == [
        ("undo", "notify"),
        ("undo", "label"),
        ("undo", "pack"),
        ("undo", "reserve"),
    ]
    assert handle.child("ship").status == ExecutionStatus.CANCELLED


def test_operations_on_a_child_are_refused() -> None:
    outcome = Order.run(INPUTS)
    child = services.find(outcome.execution_id).child("ship")
    with pytest.raises(InvalidTransition, match="composed child run by step 'ship'"):
        services.undo(child.id)
    with pytest.raises(InvalidTransition, match="cancel that execution instead"):
        services.cancel(child.id)


class RetryingChild(Reactor):
    first = step(Tracked)

    @step(wait_for=["first"], retry=Retry(attempts=3, backoff="fixed", delay=5))
    def flaky() -> None:
        raise TimeoutError("not yet")


class ParkingParent(Reactor):
    before = step(Tracked)
    child = compose(RetryingChild, wait_for=["before"])

    class Meta:
        background = "all"


def test_a_parent_parked_with_its_child_is_undone_with_the_child() -> None:
    outcome = ParkingParent.run({})
    parked = services.resume(outcome.execution_id)  # the child's retry parks both
    assert parked.status == ExecutionStatus.PENDING
    assert parked.reason == "retry"
    services.cancel(outcome.execution_id, reason="stop waiting")
    ledger.clear()
    services.undo(outcome.execution_id)
    assert ledger.calls == [("undo", "first"), ("undo", "before")]
