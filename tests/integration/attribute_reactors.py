"""Reactors with business attributes, shared by the tests of attributes (database, API, admin,
commands)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from django_reactor import Reactor, Retry, Step, Success, arg, compose, on_event, step
from tests.helpers import FAIL_AT, ledger
from tests.integration.reactors import Tracked


class OrderInputs(serializers.Serializer):
    customer_id = serializers.IntegerField()
    tenant = serializers.CharField(required=False)
    priority = serializers.BooleanField(default=False)
    card = serializers.CharField(write_only=True, required=False)


class Charge(Step):
    """Sets the payment's id as an attribute; fails its first attempt when 'charge' is in
    FAIL_AT (after setting one)."""

    retry = Retry(attempts=2, backoff="fixed", delay=0)

    def run(self, **arguments: Any) -> Any:
        ledger("run", self.context.step)
        self.context.set_attribute("attempt", self.context.attempt)
        if self.context.step in FAIL_AT and self.context.attempt == 1:
            raise RuntimeError("the card was declined")
        self.context.set_attribute("payment_id", f"pay-{self.context.attempt}")
        return Success({"paid": True})


class Clears(Step):
    """Removes the attribute 'attempt' and sets 'stage'."""

    def run(self, **arguments: Any) -> Any:
        if self.context.step in FAIL_AT:
            self.context.set_attribute("stage", "never kept")
            raise RuntimeError(f"{self.context.step} exploded")
        self.context.set_attribute("attempt", None)
        self.context.set_attribute("stage", "shipped")
        return Success(None)


class Order(Reactor):
    """Found by its customer, tenant, priority and channel; a step sets the payment's id."""

    Inputs = OrderInputs

    charge = step(Charge)
    ship = step(Clears, wait_for=["charge"])

    class Meta:
        attributes = {
            "customer_id": arg.input("customer_id"),
            "tenant": arg.input("tenant"),
            "priority": arg.input("priority"),
            "channel": arg.value("web"),
        }


class Plain(Reactor):
    """No attributes at all."""

    first = step(Tracked)
    second = step(Tracked, wait_for=["first"])


class Child(Reactor):
    class Inputs(serializers.Serializer):
        customer_id = serializers.IntegerField()

    charge = step(Charge)

    class Meta:
        attributes = {"child_of": arg.input("customer_id")}


class Parent(Reactor):
    Inputs = OrderInputs

    first = compose(Child, customer_id=arg.input("customer_id"))

    class Meta:
        attributes = {"customer_id": arg.input("customer_id")}


class RoutedOrder(Reactor):
    """Order's shape, routed to the second database (``ROUTED``)."""

    Inputs = OrderInputs

    charge = step(Charge)

    class Meta:
        name = "tests.RoutedAttributes"
        attributes = {"customer_id": arg.input("customer_id")}


#: ``REACTOR["DATABASE"]`` of the sharding tests of attributes.
ROUTED = {"default": "default", "tests.RoutedAttributes": "shard"}


class StartedByEvent(Reactor):
    """Started by each ``attr.order`` event, found by its customer."""

    class Inputs(serializers.Serializer):
        customer = serializers.CharField()

    only = step(Tracked)

    class Meta:
        triggers = [on_event("attr.order", inputs=lambda event: dict(event.payload or {}))]
        attributes = {"customer": arg.input("customer")}
