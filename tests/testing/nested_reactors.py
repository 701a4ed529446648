"""Reactors with composed children, async units and maps, for the nested testing helpers."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from django_reactor import (
    Halt,
    Reactor,
    Step,
    arg,
    async_reactor,
    async_step,
    compose,
    map_over,
    step,
)
from tests.integration.reactors import FAIL_AT, Tracked, ledger

# ---------------------------------------------------------------------------- compose


class Shipment(Reactor):
    """pack -> label; composed by Fulfil."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    pack = step(Tracked, order=arg.input("order"))
    label = step(Tracked, order=arg.input("order"), wait_for=["pack"])

    class Meta:
        returns = "label"


class Fulfil(Reactor):
    """reserve -> ship (Shipment composed) -> notify."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    reserve = step(Tracked, order=arg.input("order"))
    ship = compose(Shipment, order=arg.input("order"), wait_for=["reserve"])
    notify = step(Tracked, wait_for=["ship"])

    class Meta:
        returns = "ship"


class FulfilLater(Reactor):
    """Fulfil, run by a worker after ``reserve``."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    reserve = step(Tracked, order=arg.input("order"))
    ship = compose(Shipment, order=arg.input("order"), wait_for=["reserve"])

    class Meta:
        returns = "ship"
        background = {"after": "reserve"}


class Outer(Reactor):
    """Three levels: Outer.fulfil -> Fulfil.ship -> Shipment.pack."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    fulfil = compose(Fulfil, order=arg.input("order"))

    class Meta:
        returns = "fulfil"


# ---------------------------------------------------------------------------- async units


class Dispatching(Reactor):
    """Starts a Shipment and a one-step unit; nobody waits for them."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    first = step(Tracked)
    shipment = async_reactor(Shipment, order=arg.input("order"), wait_for=["first"])
    receipt = async_step(Tracked, order=arg.input("order"), wait_for=["first"])


# ---------------------------------------------------------------------------- maps


def price(item: int) -> int:
    ledger("run", f"price-{item}")
    return item * 10


class LineCharge(Step):
    def run(self, item: int, amount: int) -> Any:
        ledger("run", f"charge-{item}")
        if f"item-{item}" in FAIL_AT:
            raise RuntimeError(f"card declined for {item}")
        if f"halt-{item}" in FAIL_AT:
            return Halt(f"item {item} needs review")
        return {"item": item, "charged": amount}

    def undo(self, result: Any, item: int, amount: int) -> None:
        ledger("undo", f"charge-{item}")
        if f"undo-{item}" in FAIL_AT:
            raise RuntimeError(f"refund failed for {item}")


class Line(Reactor):
    """One element: price it, then charge it."""

    class Inputs(serializers.Serializer):
        item = serializers.IntegerField()

    price = step(price, item=arg.input("item"))
    charge = step(LineCharge, item=arg.input("item"), amount=arg.result("price"))

    class Meta:
        returns = "charge"


class Items(serializers.Serializer):
    items = serializers.ListField(child=serializers.IntegerField())


class Basket(Reactor):
    """An atomic map of Line elements, run inline, then a total."""

    Inputs = Items

    lines = map_over(arg.input("items"), Line, item=arg.element())

    @step(lines=arg.result("lines"))
    def total(lines: Any) -> Any:
        return sum(line["charged"] for line in lines)

    class Meta:
        returns = "total"


class FannedBasket(Reactor):
    """The same map, its elements fanned out to workers two at a time."""

    Inputs = Items

    lines = map_over(arg.input("items"), Line, item=arg.element(), fan_out=True, chunk_size=2)

    @step(lines=arg.result("lines"))
    def total(lines: Any) -> Any:
        return sum(line["charged"] for line in lines)

    class Meta:
        returns = "total"


class TolerantBasket(Reactor):
    """Completes while at most two elements fail."""

    Inputs = Items

    lines = map_over(arg.input("items"), Line, item=arg.element(), atomic=False, max_failures=2)


def double(item: int) -> int:
    ledger("run", f"double-{item}")
    return item * 2


class Doubling(Reactor):
    """A map whose element is one function step."""

    Inputs = Items

    doubled = map_over(arg.input("items"), double, item=arg.element())


class Warehouse(Reactor):
    """A composed child with a map: Warehouse.stock -> Basket.lines."""

    Inputs = Items

    stock = compose(Basket, items=arg.input("items"))
