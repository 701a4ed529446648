"""Reactors whose composed children pause at interrupts (one and two levels deep)."""

from __future__ import annotations

from rest_framework import serializers

from django_reactor import ContinueWith, Reactor, arg, async_reactor, compose, interrupt, step
from tests.integration.reactors import Tracked


class Approval(serializers.Serializer):
    approved = serializers.BooleanField()
    note = serializers.CharField(max_length=20, required=False, default="")


class ApprovedCheckout(Reactor):
    """The child: charges, waits for an approval, ships."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    charge = step(Tracked, order=arg.input("order"))
    approval = interrupt(
        after="charge",
        payload=Approval,
        correlation_id=lambda run: f"checkout-{run.inputs['order']}",
        timeout=3600,
        max_attempts=3,
    )
    ship = step(Tracked, approved=arg.result("approval", "approved"))

    class Meta:
        name = "tests.nested.ApprovedCheckout"
        returns = "ship"


class NestedOrder(Reactor):
    """The root: reserves, runs ApprovedCheckout (which pauses it), then sends a receipt."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    reserve = step(Tracked, order=arg.input("order"))
    checkout = compose(ApprovedCheckout, order=arg.input("order"), wait_for=["reserve"])
    receipt = step(Tracked, shipped=arg.result("checkout", "approved"))

    class Meta:
        name = "tests.nested.NestedOrder"


class ApprovedCheckoutInBackground(Reactor):
    """A child whose interrupt resumes on a worker."""

    charge = step(Tracked)
    approval = interrupt(after="charge", payload=Approval, resume="background")
    ship = step(Tracked, approved=arg.result("approval", "approved"))

    class Meta:
        name = "tests.nested.ApprovedCheckoutInBackground"


class NestedOrderInBackground(Reactor):
    reserve = step(Tracked)
    checkout = compose(ApprovedCheckoutInBackground, wait_for=["reserve"])
    receipt = step(Tracked, wait_for=["checkout"])

    class Meta:
        name = "tests.nested.NestedOrderInBackground"


class NestedFulfil(Reactor):
    """A middle level: picks, runs ApprovedCheckout, packs."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    pick = step(Tracked)
    checkout = compose(ApprovedCheckout, order=arg.input("order"), wait_for=["pick"])
    pack = step(Tracked, wait_for=["checkout"])

    class Meta:
        name = "tests.nested.NestedFulfil"


class NestedSubscribe(Reactor):
    """Two levels: NestedSubscribe -> NestedFulfil -> ApprovedCheckout, which pauses."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    enrol = step(Tracked)
    fulfil = compose(NestedFulfil, order=arg.input("order"), wait_for=["enrol"])
    confirm = step(Tracked, wait_for=["fulfil"])

    class Meta:
        name = "tests.nested.NestedSubscribe"


class Review(serializers.Serializer):
    ok = serializers.BooleanField()


class NestedOrderWithReview(Reactor):
    """Waits at an interrupt of its own and at its child's at once; a third step runs meanwhile."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    reserve = step(Tracked, order=arg.input("order"))
    checkout = compose(ApprovedCheckout, order=arg.input("order"), wait_for=["reserve"])
    review = interrupt(after="reserve", payload=Review)
    audit = step(Tracked, wait_for=["reserve"])
    receipt = step(Tracked, wait_for=["checkout", "review"])

    class Meta:
        name = "tests.nested.NestedOrderWithReview"


class TwoApprovalsInTurn(Reactor):
    """A child that waits twice, one interrupt after the other."""

    draft = step(Tracked)
    first = interrupt(after="draft", payload=Approval)
    second = interrupt(after="first", payload=Approval)
    sign = step(Tracked, wait_for=["second"])

    class Meta:
        name = "tests.nested.TwoApprovalsInTurn"


class NestedContract(Reactor):
    prepare = step(Tracked)
    approvals = compose(TwoApprovalsInTurn, wait_for=["prepare"])
    archive = step(Tracked, wait_for=["approvals"])

    class Meta:
        name = "tests.nested.NestedContract"


class ApprovedCheckoutWithDefault(Reactor):
    """A child whose interrupt goes on with a default payload when it expires."""

    charge = step(Tracked)
    approval = interrupt(
        after="charge",
        payload=Approval,
        timeout=60,
        on_timeout=ContinueWith({"approved": False, "note": "timed out"}),
    )
    ship = step(Tracked, approved=arg.result("approval", "approved"))

    class Meta:
        name = "tests.nested.ApprovedCheckoutWithDefault"


class NestedOrderWithDefault(Reactor):
    reserve = step(Tracked)
    checkout = compose(ApprovedCheckoutWithDefault, wait_for=["reserve"])

    class Meta:
        name = "tests.nested.NestedOrderWithDefault"


class FiresNestedOrder(Reactor):
    """Runs NestedOrder as an async unit: the unit is the run that pauses for its child."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    unit = async_reactor(NestedOrder, order=arg.input("order"))
    after = step(Tracked)

    class Meta:
        name = "tests.nested.FiresNestedOrder"


class NestedOrderSideBySide(Reactor):
    """Steps side by side (max_concurrency) around a child that pauses."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    reserve = step(Tracked, order=arg.input("order"))
    checkout = compose(ApprovedCheckout, order=arg.input("order"), wait_for=["reserve"])
    audit = step(Tracked, wait_for=["reserve"])
    notify = step(Tracked, wait_for=["reserve"])
    receipt = step(Tracked, wait_for=["checkout", "audit", "notify"])

    class Meta:
        name = "tests.nested.NestedOrderSideBySide"
        max_concurrency = 2
