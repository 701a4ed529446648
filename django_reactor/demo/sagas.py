"""The demo's sagas: placing an order, renewing subscriptions, and approving a refund.

``DemoOrder`` creates an order, reserves stock, charges the card, books shipping and confirms;
if a step fails, the completed ones are undone newest first (refund, release stock, cancel the
order). ``DemoRenewal`` halts cleanly for an inactive subscription and retries a flaky payment
gateway; ``DemoRenewAll`` renews every due subscription, one map element each. ``DemoRefund``
pauses until a person approves or declines the refund.

The names start with ``Demo`` so that they never take the short name of a project's own
reactor (``reactor_run PlaceOrder``) in a process that imported them.
"""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal
from typing import Any

from rest_framework import serializers

from .. import Failure, Halt, Lock, Reactor, Retry, Step, Success, arg, interrupt, map_over, step
from .shop import SHOP, GatewayTimeout, Order, OutOfStock

logger = logging.getLogger(__name__)


class LineSerializer(serializers.Serializer):
    sku = serializers.CharField(max_length=32)
    quantity = serializers.IntegerField(min_value=1, max_value=100)


class CreateOrder(Step):
    """Create the order, priced from the catalogue; its id comes from the step's idempotency
    key, so a re-run creates nothing twice."""

    def run(self, customer_email: str, items: list[dict[str, Any]]) -> Success | Failure:
        missing = sorted({i["sku"] for i in items} - set(SHOP.products))
        if missing:
            return Failure(f"unknown products: {', '.join(missing)}", retryable=False)
        lines = {i["sku"]: i["quantity"] for i in items}
        total = sum((SHOP.products[sku].price * n for sku, n in lines.items()), Decimal("0"))
        order_id = "ord_" + self.context.idempotency_key[:8]
        order = SHOP.orders.setdefault(order_id, Order(order_id, customer_email, lines, total))
        return Success({"order_id": order.id, "total": order.total})

    def undo(self, result: dict[str, Any], **arguments: Any) -> None:
        SHOP.orders[result["order_id"]].status = "cancelled"


class ReserveStock(Step):
    """Take the ordered quantities out of stock."""

    def run(self, order_id: str) -> Success:
        order = SHOP.orders[order_id]
        if not order.reserved:
            for sku, quantity in order.lines.items():
                if SHOP.products[sku].stock < quantity:
                    raise OutOfStock(f"not enough {sku} for {quantity}")
            for sku, quantity in order.lines.items():
                SHOP.products[sku].stock -= quantity
            order.reserved = True
        return Success({"lines": [{"sku": s, "quantity": n} for s, n in order.lines.items()]})

    def undo(self, result: dict[str, Any], order_id: str) -> None:
        order = SHOP.orders[order_id]
        if order.reserved:
            for sku, quantity in order.lines.items():
                SHOP.products[sku].stock += quantity
            order.reserved = False


class ChargeCard(Step):
    """Charge the amount; the gateway deduplicates by the step's idempotency key."""

    retry = Retry(attempts=4, backoff="exponential", delay=0.05, jitter=0.2, on=(GatewayTimeout,))
    gateway_timeouts = 0

    def run(self, amount: Decimal, card_token: str) -> Success:
        payment = SHOP.charge(
            amount=amount,
            card_token=card_token,
            idempotency_key=self.context.idempotency_key,
            timeouts=self.gateway_timeouts,
        )
        return Success({"reference": payment.reference, "amount": payment.amount})

    def undo(self, result: dict[str, Any], **arguments: Any) -> None:
        SHOP.refund(result["reference"])


class BookShipping(Step):
    """Book a parcel with the carrier."""

    def run(self, order_id: str, country: str) -> Success:
        return Success({"tracking_number": SHOP.book_parcel(SHOP.orders[order_id], country)})

    def undo(self, result: dict[str, Any], **arguments: Any) -> None:
        SHOP.cancel_parcel(result["tracking_number"])


class DemoOrder(Reactor):
    """Create an order, reserve stock, charge, ship, and confirm; undo all of it on failure."""

    class Inputs(serializers.Serializer):
        customer_email = serializers.EmailField()
        items = LineSerializer(many=True, allow_empty=False)
        card_token = serializers.CharField(write_only=True)  # write_only: a secret, redacted
        country = serializers.CharField(max_length=2)

    create_order = step(CreateOrder)
    reserve = step(ReserveStock, order_id=arg.result("create_order", "order_id"))
    charge = step(ChargeCard, amount=arg.result("create_order", "total"), wait_for=["reserve"])
    ship = step(BookShipping, order_id=arg.result("create_order", "order_id"), wait_for=["charge"])

    @step(
        order_id=arg.result("create_order", "order_id"),
        payment=arg.result("charge", "reference"),
        tracking=arg.result("ship", "tracking_number"),
    )
    def confirm(order_id: str, payment: str, tracking: str) -> dict[str, Any]:
        SHOP.orders[order_id].status = "placed"
        return {"order_id": order_id, "payment": payment, "tracking": tracking}

    class Meta:
        returns = "confirm"
        # One checkout per customer at a time (a double click waits up to 5 s, then fails).
        coordination = [Lock("customer-{customer_email}", ttl=60, wait=5)]


class FlakyGatewayCharge(ChargeCard):
    """A charge through a gateway that times out twice before answering."""

    gateway_timeouts = 2


class DemoRenewal(Reactor):
    """Renew a subscription for a month: halts if it is inactive, retries a flaky gateway."""

    class Inputs(serializers.Serializer):
        subscription_id = serializers.IntegerField()
        card_token = serializers.CharField(write_only=True)

    @step(subscription_id=arg.input("subscription_id"))
    def load(subscription_id: int) -> Any:
        subscription = SHOP.subscriptions.get(subscription_id)
        if subscription is None:
            return Failure(f"no subscription {subscription_id}", retryable=False)
        if not subscription.active:
            return Halt(f"subscription {subscription_id} is no longer active; nothing to renew")
        return {"price": subscription.monthly_price, "paid_until": subscription.paid_until}

    charge = step(FlakyGatewayCharge, amount=arg.result("load", "price"))

    @step(
        subscription_id=arg.input("subscription_id"),
        current=arg.result("load", "paid_until"),
        wait_for=["charge"],
    )
    def extend(subscription_id: int, current: dt.date) -> dt.date:
        new_date = dt.date.fromisoformat(str(current)) + dt.timedelta(days=30)
        SHOP.subscriptions[subscription_id].paid_until = new_date
        return new_date

    @extend.undo
    def shorten(result: dt.date, subscription_id: int, current: dt.date) -> None:
        SHOP.subscriptions[subscription_id].paid_until = dt.date.fromisoformat(str(current))

    class Meta:
        returns = "extend"


def _renewal_summary(results: Any) -> dict[str, Any]:
    summary = results.summary()
    return {
        "renewed": summary["succeeded"],
        "failed": [f"element {f['index']}: {f['message']}" for f in summary["failures"]],
    }


class DemoRenewAll(Reactor):
    """Renew every active subscription due by a date, one map element per subscription. A
    renewal that fails undoes itself; the others go on."""

    class Inputs(serializers.Serializer):
        due_by = serializers.DateField()
        card_token = serializers.CharField(write_only=True)

    renewals = map_over(
        arg.input("due_by", transform=SHOP.due),
        DemoRenewal,
        subscription_id=arg.element(),
        card_token=arg.input("card_token"),
        atomic=False,
        collect=_renewal_summary,
    )

    class Meta:
        returns = "renewals"


class RefundApprovalSerializer(serializers.Serializer):
    """What the person deciding on a refund sends back."""

    approved = serializers.BooleanField()
    approver = serializers.CharField(max_length=100)
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class DemoRefund(Reactor):
    """Hold a refund, wait (up to two days) for a person to approve it, then settle it.

    The run pauses at ``approval``; deliver the decision by correlation id with
    ``services.resume_interrupt(correlation_id="refund-<order id>", payload={...})``. Three
    invalid payloads, or no decision within two days, undo the hold and fail the run. A
    declined refund halts at ``settle``.
    """

    class Inputs(serializers.Serializer):
        order_id = serializers.CharField(max_length=32)
        amount_cents = serializers.IntegerField(min_value=1)

    @step(order_id=arg.input("order_id"), amount_cents=arg.input("amount_cents"))
    def hold(order_id: str, amount_cents: int) -> Any:
        order = SHOP.orders.get(order_id)
        if order is None:
            return Failure(f"no order {order_id}", retryable=False)
        if amount_cents > order.total * 100:
            return Failure(
                f"a refund of {amount_cents} cents is more than order {order_id}'s total "
                f"({order.total})",
                retryable=False,
            )
        return {"order_id": order_id, "amount_cents": amount_cents, "status": "held"}

    @hold.undo
    def release(result: dict[str, Any], order_id: str, amount_cents: int) -> None:
        # The hold is only this step's result: releasing it needs no write, just a record.
        logger.info("released the refund hold of %s cents on order %s", amount_cents, order_id)

    approval = interrupt(
        after=["hold"],
        payload=RefundApprovalSerializer,
        correlation_id=lambda run: f"refund-{run.inputs['order_id']}",
        timeout=dt.timedelta(days=2),
        max_attempts=3,
    )

    @step(held=arg.result("hold"), decision=arg.result("approval"))
    def settle(held: dict[str, Any], decision: dict[str, Any]) -> Any:
        if not decision["approved"]:
            reason = f"refund declined by {decision['approver']}"
            if decision.get("note"):
                reason += f": {decision['note']}"
            return Halt(reason)
        return {
            "order_id": held["order_id"],
            "amount_cents": held["amount_cents"],
            "status": "settled",
            "approved_by": decision["approver"],
            "note": decision.get("note", ""),
        }

    class Meta:
        returns = "settle"
