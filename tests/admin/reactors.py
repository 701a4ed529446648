"""Reactors for the admin tests: one per status an operator meets, and a composed one."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from django_reactor import (
    Failure,
    Halt,
    Lock,
    OrderedLock,
    Period,
    RateLimit,
    Reactor,
    Retry,
    Semaphore,
    Step,
    arg,
    compose,
    interrupt,
    map_over,
    step,
)

# Step names that misbehave; tests set and clear it.
TRIGGERS: set[str] = set()


class Booked(Step):
    """Completes, with an undo (so undo has something to roll back)."""

    def run(self, **arguments: Any) -> Any:
        # Never echo the card: results are stored as returned (only arguments are redacted).
        return {"step": self.context.step, **{k: v for k, v in arguments.items() if k != "card"}}

    def undo(self, result: Any, **arguments: Any) -> Any:
        if "undo-fails" in TRIGGERS:
            return Failure("the refund service is down")
        return None


class Booking(Reactor):
    """reserve -> charge -> confirm; ``charge`` can be made to raise or halt."""

    class Inputs(serializers.Serializer):
        guest = serializers.CharField()
        card = serializers.CharField(write_only=True)

    reserve = step(Booked, guest=arg.input("guest"), card=arg.input("card"))

    @step(wait_for=["reserve"])
    def charge() -> Any:
        if "charge" in TRIGGERS:
            raise RuntimeError("card declined <script>alert(1)</script>")
        if "halt" in TRIGGERS:
            return Halt("manual review")
        return {"charged": True}

    confirm = step(Booked, wait_for=["charge"])


class Approval(serializers.Serializer):
    approved = serializers.BooleanField(help_text="Whether the refund may go ahead.")
    note = serializers.CharField(max_length=20, required=False, default="")


class Refund(Reactor):
    """Pauses for an approval (two invalid payloads fail it)."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    request = step(Booked, order=arg.input("order"))
    approval = interrupt(
        after=["request"],
        payload=Approval,
        correlation_id=lambda run: f"refund-{run.inputs['order']}",
        max_attempts=2,
    )
    pay = step(Booked, approved=arg.result("approval", "approved"))


class Label(Reactor):
    pack = step(Booked)
    label = step(Booked, wait_for=["pack"])


class Shipment(Reactor):
    """A composed child run as step ``ship``."""

    prepare = step(Booked)
    ship = compose(Label, wait_for=["prepare"])
    notify = step(Booked, wait_for=["ship"])


# ---------------------------------------------------------------------------- maps


class Pack(Step):
    """A map element: packs one item; fails for ``item-<n>`` in TRIGGERS, or every odd item
    with ``odd``."""

    def run(self, item: int) -> Any:
        if f"item-{item}" in TRIGGERS or ("odd" in TRIGGERS and item % 2):
            raise RuntimeError(f"the label printer jammed on item {item}")
        return {"item": item}

    def undo(self, result: Any, item: int) -> Any:
        return None


class Items(serializers.Serializer):
    items = serializers.ListField(child=serializers.IntegerField())


class Warehouse(Reactor):
    """An atomic map: the first failed item fails the run, the packed ones are undone."""

    Inputs = Items
    pack = map_over(arg.input("items"), Pack, item=arg.element())


class TolerantWarehouse(Reactor):
    """A map that completes whatever fails (up to 1,000 failed items)."""

    Inputs = Items
    pack = map_over(arg.input("items"), Pack, item=arg.element(), atomic=False, max_failures=1000)


class FannedWarehouse(Reactor):
    """A map whose elements run on workers: the run parks until they settle."""

    Inputs = Items
    pack = map_over(
        arg.input("items"), Pack, item=arg.element(), fan_out=True, batch_size=4, chunk_size=2
    )


# ---------------------------------------------------------------------------- the console


class Gateway(Step):
    """Times out on its first attempt when ``flaky`` is in TRIGGERS (retried at once)."""

    retry = Retry(attempts=3, delay=0)

    def run(self, **arguments: Any) -> Any:
        if "flaky" in TRIGGERS and self.context.attempt == 1:
            raise TimeoutError("the card gateway timed out")
        return {"paid": True}

    def undo(self, result: Any, **arguments: Any) -> Any:
        return None


class Payment(Reactor):
    """hold -> pay (retried) -> ship; ``ship`` raises when told to, so hold and pay are undone."""

    hold = step(Booked)
    pay = step(Gateway, wait_for=["hold"])

    @step(wait_for=["pay"])
    def ship() -> Any:
        if "ship" in TRIGGERS:
            raise RuntimeError("no courier for this postcode")
        return {"shipped": True}


class Payout(Reactor):
    """Declares one of each coordination primitive (the panel says who declares a key)."""

    class Inputs(serializers.Serializer):
        account = serializers.IntegerField()

    send = step(Booked, account=arg.input("account"))

    class Meta:
        coordination = [
            Lock("account-{account}", ttl=30),
            Semaphore("bank-api", limit=4),
            RateLimit("payouts-{account}", limits={"second": 5, "minute": 100}),
            Period("statement-{account}", every="day"),
            OrderedLock("payouts-{account}"),
        ]
