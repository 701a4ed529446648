"""Events across runs: emit() kept once per event id, matched to wait_for_event by key (with a
look back), starting runs (Meta.triggers) and cancelling them (Meta.cancel_on)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

import django_reactor
from django_reactor import (
    Paused,
    Reactor,
    arg,
    step,
    store,
    wait_for_event,
)
from django_reactor.models import Event, Execution
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)


class Refund(serializers.Serializer):
    amount = serializers.IntegerField(min_value=1)


class AwaitRefund(Reactor):
    charge = step(Tracked, order=arg.input("order"))
    refunded = wait_for_event(
        "charge.refunded", match=arg.input("order"), serializer=Refund, resume="inline"
    )
    close = step(Tracked, amount=arg.result("refunded", "amount"))


def trace(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in store.event_rows(execution_id)]


def test_an_event_resumes_the_run_waiting_for_its_key_and_no_other() -> None:
    first = AwaitRefund.run({"order": "A1"})
    second = AwaitRefund.run({"order": "B2"})
    assert isinstance(first, Paused)
    assert isinstance(second, Paused)

    emitted = django_reactor.emit("charge.refunded", {"amount": 5}, key="A1", event_id="re_1")

    assert emitted.resumed == (first.execution_id,)
    assert Execution.objects.get(pk=first.execution_id).status == ExecutionStatus.COMPLETED
    assert Execution.objects.get(pk=second.execution_id).status == ExecutionStatus.PAUSED
    assert Event.objects.get(event_id="re_1").handled_at is not None
