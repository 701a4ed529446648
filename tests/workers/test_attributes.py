"""Business attributes set by steps that real Celery workers run: written with the worker's
checkpoints, on the run (and on a composed child, the child), found by them at once."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import Dispatched, services, store
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.integration.attribute_reactors import Order, Parent
from tests.workers.harness import wait_until
from tests.workers.test_background import finished

pytestmark = pytest.mark.django_db(transaction=True)


def test_attributes_set_on_a_worker_are_kept_with_its_checkpoints(start_worker: Any) -> None:
    start_worker()
    order = services.run_in_background(Order, {"customer_id": 42, "tenant": "acme"})
    parent = services.run_in_background(Parent, {"customer_id": 7})
    assert isinstance(order, Dispatched)
    assert isinstance(parent, Dispatched)
    # Written with the run, by the caller, before any worker took it.
    assert services.find(order.execution_id).attributes == {
        "channel": "web",
        "customer_id": "42",
        "priority": "false",
        "tenant": "acme",
    }

    for outcome in (order, parent):
        row = wait_until(lambda o=outcome: finished(o.execution_id), what="the runs to finish")
        assert row.status == ExecutionStatus.COMPLETED

    assert services.find(order.execution_id).attributes == {
        "channel": "web",
        "customer_id": "42",
        "payment_id": "pay-1",
        "priority": "false",
        "stage": "shipped",
        "tenant": "acme",
    }
    child = Execution.objects.get(parent_id=parent.execution_id)
    assert services.find(parent.execution_id).attributes == {"customer_id": "7"}
    assert services.find(child.pk).attributes == {
        "attempt": "1",
        "child_of": "7",
        "payment_id": "pay-1",
    }
    runs = store.with_attributes(Execution.objects.all(), {"payment_id": "pay-1"})
    assert list(runs.values_list("pk", flat=True)) == [child.pk, order.execution_id]
