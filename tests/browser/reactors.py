"""Reactors for the browser tests and the admin screenshots: a checkout that fails, a review,
a map over parcels."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from django_reactor import Reactor, Step, arg, interrupt, map_over, step

# Step names (and ``parcel-<n>`` items) that raise; tests set and clear it.
FAIL: set[str] = set()


class Work(Step):
    """Completes (echoing its arguments), or raises when its name is in ``FAIL``."""

    def run(self, **arguments: Any) -> Any:
        if self.context.step in FAIL:
            raise RuntimeError("the payment gateway declined the card (code 51)")
        return {"step": self.context.step, **arguments}

    def undo(self, result: Any, **arguments: Any) -> Any:
        return None


class Checkout(Reactor):
    """Two roots, a join and a fan-out: ``charge_card`` fails when told to."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    reserve_stock = step(Work, order=arg.input("order"))
    price_order = step(Work, order=arg.input("order"))
    charge_card = step(Work, wait_for=["reserve_stock", "price_order"])
    print_label = step(Work, wait_for=["charge_card"])
    email_receipt = step(Work, wait_for=["charge_card"])


class Decision(serializers.Serializer):
    approved = serializers.BooleanField(help_text="Whether the refund may go ahead.")
    note = serializers.CharField(
        max_length=60, required=False, default="", help_text="Kept with the run."
    )


class RefundReview(Reactor):
    """Pauses at ``review``; its resume mode is ``background`` (the form's box starts ticked)."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    open_case = step(Work, order=arg.input("order"))
    review = interrupt(
        after=["open_case"],
        payload=Decision,
        correlation_id=lambda run: f"refund-{run.inputs['order']}",
        max_attempts=3,
        resume="background",
    )
    refund = step(Work, approved=arg.result("review", "approved"))
    notify = step(Work, wait_for=["refund"])


class PrintLabel(Step):
    """A map element: a shipping label for one parcel; raises for ``parcel-<n>`` in ``FAIL``."""

    def run(self, parcel: int) -> Any:
        if f"parcel-{parcel}" in FAIL:
            raise RuntimeError(f"the carrier refused parcel {parcel}: the address has no postcode")
        return {"parcel": parcel, "label": f"LBL-{parcel:05d}"}

    def undo(self, result: Any, parcel: int) -> Any:
        return None


class ShipParcels(Reactor):
    """Labels every parcel on workers, 20 per task; up to 25 refused parcels are tolerated."""

    class Inputs(serializers.Serializer):
        parcels = serializers.ListField(child=serializers.IntegerField())

    label_parcels = map_over(
        arg.input("parcels"),
        PrintLabel,
        parcel=arg.element(),
        fan_out=True,
        atomic=False,
        max_failures=25,
        batch_size=40,
        chunk_size=20,
    )
