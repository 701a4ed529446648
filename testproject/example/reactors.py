"""Example sagas: placing an order, renewing a subscription, approving a refund, moving
money between accounts, and restocking a product.

``PlaceOrder`` creates an order, reserves stock, charges the card, books shipping and writes a
receipt; if a step fails, the completed ones are undone newest first (refund, release stock,
cancel the order). ``RenewSubscription`` halts cleanly for inactive subscriptions and retries a
flaky payment gateway. ``ApproveRefund`` pauses until a person approves or declines the refund.
``TransferFunds`` moves money with atomic steps: each step's ledger writes commit with its
checkpoint, so a crash never debits or credits twice.
``RestockProduct`` runs on Celery workers and waits for a supplier's signed webhook.
"""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F
from rest_framework import serializers

from django_reactor import (
    Failure,
    Halt,
    Lock,
    Reactor,
    Retry,
    Step,
    Success,
    arg,
    interrupt,
    map_over,
    step,
    step_context,
)

from .models import Account, LedgerEntry, Order, OrderLine, Product, Subscription
from .services import Carrier, GatewayTimeout, PaymentGateway

logger = logging.getLogger(__name__)


class OutOfStock(Exception):
    """Not enough stock for an order line."""

    retryable = False


class LineSerializer(serializers.Serializer):
    sku = serializers.CharField(max_length=32)
    quantity = serializers.IntegerField(min_value=1, max_value=100)


class CreateOrder(Step):
    """Create the order and its lines, priced from the catalogue."""

    def run(self, customer_email: str, items: list[dict[str, Any]]) -> Success | Failure:
        products = {p.sku: p for p in Product.objects.filter(sku__in=[i["sku"] for i in items])}
        missing = sorted({i["sku"] for i in items} - set(products))
        if missing:
            return Failure(f"unknown products: {', '.join(missing)}", retryable=False)
        total = sum((products[i["sku"]].price * i["quantity"] for i in items), Decimal("0"))
        with transaction.atomic():
            order = Order.objects.create(customer_email=customer_email, total=total)
            OrderLine.objects.bulk_create(
                OrderLine(order=order, product=products[i["sku"]], quantity=i["quantity"])
                for i in items
            )
        return Success({"order_id": order.pk, "total": total})

    def undo(self, result: dict[str, Any], **arguments: Any) -> None:
        Order.objects.filter(pk=result["order_id"]).update(status=Order.Status.CANCELLED)


class ReserveStock(Step):
    """Take the ordered quantities out of stock."""

    def run(self, order_id: int) -> Success:
        reserved = []
        with transaction.atomic():
            for line in OrderLine.objects.filter(order_id=order_id, reserved=False):
                taken = Product.objects.filter(pk=line.product_id, stock__gte=line.quantity).update(
                    stock=F("stock") - line.quantity
                )
                if not taken:
                    raise OutOfStock(f"not enough {line.product.sku} for {line.quantity}")
                line.reserved = True
                line.save(update_fields=["reserved"])
                reserved.append({"sku": line.product.sku, "quantity": line.quantity})
        return Success({"lines": reserved})

    def undo(self, result: dict[str, Any], order_id: int) -> None:
        with transaction.atomic():
            for line in OrderLine.objects.filter(order_id=order_id, reserved=True):
                Product.objects.filter(pk=line.product_id).update(stock=F("stock") + line.quantity)
                line.reserved = False
                line.save(update_fields=["reserved"])


class ChargeCard(Step):
    """Charge the order total; the gateway deduplicates by the step's idempotency key."""

    retry = Retry(attempts=4, backoff="exponential", delay=0.05, jitter=0.2, on=(GatewayTimeout,))
    gateway_timeouts = 0

    def run(self, amount: Decimal, card_token: str) -> Success:
        payment = PaymentGateway(timeouts=self.gateway_timeouts).charge(
            amount=amount, card_token=card_token, idempotency_key=self.context.idempotency_key
        )
        return Success({"reference": payment.reference, "amount": payment.amount})

    def undo(self, result: dict[str, Any], **arguments: Any) -> None:
        PaymentGateway().refund(result["reference"])


class BookShipping(Step):
    """Book a parcel with the carrier."""

    def run(self, order_id: int, country: str) -> Success:
        shipment = Carrier().book(Order.objects.get(pk=order_id), country)
        return Success({"tracking_number": shipment.tracking_number})

    def undo(self, result: dict[str, Any], **arguments: Any) -> None:
        Carrier().cancel(result["tracking_number"])


class PlaceOrder(Reactor):
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
    def confirm(order_id: int, payment: str, tracking: str) -> dict[str, Any]:
        Order.objects.filter(pk=order_id).update(status=Order.Status.PLACED)
        return {"order_id": order_id, "payment": payment, "tracking": tracking}

    class Meta:
        returns = "confirm"
        # One checkout per customer at a time (a double click waits up to 5 s, then fails).
        coordination = [Lock("customer-{customer_email}", ttl=60, wait=5)]


class FlakyGatewayCharge(ChargeCard):
    """A charge through a gateway that times out twice before answering."""

    gateway_timeouts = 2


class RenewSubscription(Reactor):
    """Renew a subscription for a month: halts if it is inactive, retries a flaky gateway."""

    class Inputs(serializers.Serializer):
        subscription_id = serializers.IntegerField()
        card_token = serializers.CharField(write_only=True)

    @step(subscription_id=arg.input("subscription_id"))
    def load(subscription_id: int) -> Any:
        sub = Subscription.objects.filter(pk=subscription_id).first()
        if sub is None:
            return Failure(f"no subscription {subscription_id}", retryable=False)
        if not sub.active:
            return Halt(f"subscription {subscription_id} is no longer active; nothing to renew")
        return {"price": sub.monthly_price, "paid_until": sub.paid_until}

    charge = step(FlakyGatewayCharge, amount=arg.result("load", "price"))

    @step(
        subscription_id=arg.input("subscription_id"),
        current=arg.result("load", "paid_until"),
        wait_for=["charge"],
    )
    def extend(subscription_id: int, current: dt.date) -> dt.date:
        new_date = current + dt.timedelta(days=30)
        Subscription.objects.filter(pk=subscription_id).update(paid_until=new_date)
        return new_date

    @extend.undo
    def shorten(result: dt.date, subscription_id: int, current: dt.date) -> None:
        Subscription.objects.filter(pk=subscription_id).update(paid_until=current)

    class Meta:
        returns = "extend"


def _renewal_summary(results: Any) -> dict[str, Any]:
    summary = results.summary()
    return {
        "renewed": summary["succeeded"],
        "failed": [f"element {f['index']}: {f['message']}" for f in summary["failures"]],
    }


class RenewDueSubscriptions(Reactor):
    """Renew every active subscription due by a date: one element per subscription, read from
    the database in pages. A renewal that fails undoes itself; the others go on."""

    class Inputs(serializers.Serializer):
        due_by = serializers.DateField()
        card_token = serializers.CharField(write_only=True)

    renewals = map_over(
        arg.input(
            "due_by",
            transform=lambda due_by: Subscription.objects.filter(
                active=True, paid_until__lte=due_by
            ),
        ),
        RenewSubscription,
        subscription_id=arg.element("pk"),
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


class ApproveRefund(Reactor):
    """Hold a refund, wait (up to two days) for a person to approve it, then settle it.

    The run pauses at ``approval``; deliver the decision by correlation id::

        services.resume_interrupt(
            correlation_id="refund-42",
            payload={"approved": True, "approver": "ada@example.com"},
        )

    or ``python manage.py reactor_resume --correlation-id refund-42 approved=true
    approver=ada@example.com``. The payload is handed to a worker (``resume="background"``)
    unless the caller asks for ``background=False``. Three invalid payloads, or no decision
    within two days, undo the hold and fail the run. A declined refund halts at ``settle``.
    """

    class Inputs(serializers.Serializer):
        order_id = serializers.IntegerField()
        amount_cents = serializers.IntegerField(min_value=1)

    @step(order_id=arg.input("order_id"), amount_cents=arg.input("amount_cents"))
    def hold(order_id: int, amount_cents: int) -> Any:
        order = Order.objects.filter(pk=order_id).first()
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
    def release(result: dict[str, Any], order_id: int, amount_cents: int) -> None:
        # The hold is only this step's result: releasing it needs no write, just a record.
        logger.info("released the refund hold of %s cents on order %s", amount_cents, order_id)

    approval = interrupt(
        after=["hold"],
        payload=RefundApprovalSerializer,
        correlation_id=lambda run: f"refund-{run.inputs['order_id']}",
        timeout=dt.timedelta(days=2),
        max_attempts=3,
        resume="background",
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


class InsufficientFunds(Exception):
    """The account to debit holds less than the amount."""

    retryable = False


def move(account: str, amount: Decimal, *, step: str) -> dict[str, Any]:
    """Change an account's balance by ``amount`` and write the ledger entry that says so."""
    context = step_context()
    row = Account.objects.select_for_update().get(name=account)
    if row.balance + amount < 0:
        raise InsufficientFunds(f"{account} holds {row.balance}, less than {-amount}")
    Account.objects.filter(pk=row.pk).update(balance=F("balance") + amount)
    entry = LedgerEntry.objects.create(
        account=row, amount=amount, execution_id=context.execution_id, step=step
    )
    return {"account": account, "amount": str(amount), "entry": entry.pk}


class TransferFunds(Reactor):
    """Debit one account and credit another, each exactly once.

    Both steps are atomic: a step's ledger entry and balance change commit in the same
    transaction as the record that the step is done, so a worker that dies at any point never
    moves the money twice, and the undo of ``debit`` (when ``credit`` fails) puts it back once.
    """

    class Inputs(serializers.Serializer):
        source = serializers.CharField(max_length=64)
        target = serializers.CharField(max_length=64)
        amount = serializers.DecimalField(
            max_digits=12, decimal_places=2, min_value=Decimal("0.01")
        )

    @step(source=arg.input("source"), amount=arg.input("amount"), atomic=True)
    def debit(source: str, amount: Decimal) -> Any:
        return move(source, -Decimal(amount), step="debit")

    @debit.undo
    def refund_debit(result: dict[str, Any], source: str, amount: Decimal) -> None:
        move(source, Decimal(amount), step="undo:debit")

    @step(target=arg.input("target"), amount=arg.input("amount"), wait_for=["debit"], atomic=True)
    def credit(target: str, amount: Decimal) -> Any:
        if not Account.objects.filter(name=target).exists():
            return Failure(f"no account {target!r}", retryable=False)
        return move(target, Decimal(amount), step="credit")

    class Meta:
        returns = "credit"


class DeliverySerializer(serializers.Serializer):
    """What the supplier's system reports when the goods arrive."""

    quantity = serializers.IntegerField(min_value=0, max_value=10_000)
    delivery_note = serializers.CharField(max_length=100)


class RestockProduct(Reactor):
    """Reorder a product from its supplier and book the delivery into stock, on workers."""

    class Inputs(serializers.Serializer):
        sku = serializers.CharField(max_length=32)
        quantity = serializers.IntegerField(min_value=1, max_value=10_000)

    @step(sku=arg.input("sku"), quantity=arg.input("quantity"))
    def purchase(sku: str, quantity: int) -> Any:
        if not Product.objects.filter(sku=sku).exists():
            return Failure(f"no product {sku}", retryable=False)
        # A real shop would send the purchase order to the supplier here.
        return {"sku": sku, "ordered": quantity}

    @purchase.undo
    def cancel_purchase(result: dict[str, Any], sku: str, quantity: int) -> None:
        logger.info("cancelled the purchase order of %s x %s", quantity, sku)

    # Pause until the supplier's system reports the delivery (a signed webhook); a worker
    # runs the rest.
    delivery = interrupt(
        after=["purchase"],
        payload=DeliverySerializer,
        correlation_id=lambda run: f"restock-{run.inputs['sku']}",
        timeout=dt.timedelta(days=14),
        resume="background",
    )

    @step(sku=arg.input("sku"), delivery=arg.result("delivery"))
    def receive(sku: str, delivery: dict[str, Any]) -> dict[str, Any]:
        Product.objects.filter(sku=sku).update(stock=F("stock") + delivery["quantity"])
        return {
            "sku": sku,
            "added": delivery["quantity"],
            "delivery_note": delivery["delivery_note"],
            "stock": Product.objects.get(sku=sku).stock,
        }

    @receive.undo
    def return_to_supplier(result: dict[str, Any], sku: str, delivery: dict[str, Any]) -> None:
        Product.objects.filter(sku=sku).update(stock=F("stock") - result["added"])

    class Meta:
        returns = "receive"
        background = "all"  # run() returns at once; Celery workers run every step
