"""The example shop sagas: real side effects on real tables, and their rollback."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from django_reactor import services
from testproject.example.models import GatewayCall, Order, Payment, Product, Shipment, Subscription
from testproject.example.reactors import PlaceOrder, RenewSubscription

pytestmark = pytest.mark.django_db


@pytest.fixture
def stock() -> None:
    Product.objects.create(sku="MUG", name="Mug", price=Decimal("9.50"), stock=10)
    Product.objects.create(sku="TEE", name="Tee", price=Decimal("19.00"), stock=1)


ORDER = {
    "customer_email": "ada@example.com",
    "items": [{"sku": "MUG", "quantity": 2}],
    "card_token": "tok_visa",
    "country": "DE",
}


def test_an_order_completes_with_every_effect(stock: None) -> None:
    outcome = PlaceOrder.run(ORDER)
    assert outcome.ok
    order = Order.objects.get(pk=outcome.value["order_id"])
    assert order.status == Order.Status.PLACED
    assert order.total == Decimal("19.00")
    assert Product.objects.get(sku="MUG").stock == 8
    assert Payment.objects.get().status == Payment.Status.CAPTURED
    assert Shipment.objects.get(order=order).cancelled is False


def test_a_refused_shipment_rolls_back_payment_stock_and_order(stock: None) -> None:
    outcome = PlaceOrder.run({**ORDER, "country": "XX"})
    assert outcome.status == "failed"
    assert outcome.error.step == "ship"
    assert outcome.error.exception_class == "testproject.example.services.ShippingUnavailable"
    assert Product.objects.get(sku="MUG").stock == 10
    assert Payment.objects.get().status == Payment.Status.REFUNDED
    assert Order.objects.get().status == Order.Status.CANCELLED
    trace = [(e.kind, e.step) for e in services.find(outcome.execution_id).trace if e.step]
    assert trace == [
        ("run", "create_order"),
        ("run", "reserve"),
        ("run", "charge"),
        ("fail", "ship"),
        ("compensate_skipped", "ship"),
        ("undo", "charge"),
        ("undo", "reserve"),
        ("undo", "create_order"),
    ]


def test_out_of_stock_fails_without_retry_and_undoes_the_order(stock: None) -> None:
    outcome = PlaceOrder.run({**ORDER, "items": [{"sku": "TEE", "quantity": 2}]})
    assert outcome.error.step == "reserve"
    assert outcome.error.retryable is False
    assert Order.objects.get().status == Order.Status.CANCELLED
    assert Product.objects.get(sku="TEE").stock == 1


def test_a_declined_card_is_not_retried(stock: None) -> None:
    outcome = PlaceOrder.run({**ORDER, "card_token": "tok_declined_1"})
    assert outcome.error.step == "charge"
    assert outcome.error.attempts == 1
    assert Product.objects.get(sku="MUG").stock == 10


def test_renewal_retries_the_flaky_gateway_and_charges_once() -> None:
    sub = Subscription.objects.create(
        customer_email="g@example.com", monthly_price=Decimal("12"), paid_until=dt.date(2026, 1, 1)
    )
    outcome = RenewSubscription.run({"subscription_id": sub.pk, "card_token": "tok"})
    assert outcome.value == dt.date(2026, 1, 31)
    assert list(GatewayCall.objects.values_list("succeeded", flat=True)) == [False, False, True]
    assert Payment.objects.count() == 1
    charge = services.find(outcome.execution_id).step("charge")
    assert charge.attempts == 3


def test_renewal_of_an_inactive_subscription_halts() -> None:
    sub = Subscription.objects.create(
        customer_email="g@example.com",
        monthly_price=Decimal("12"),
        paid_until=dt.date(2026, 1, 1),
        active=False,
    )
    outcome = RenewSubscription.run({"subscription_id": sub.pk, "card_token": "tok"})
    assert outcome.status == "halted"
    assert outcome.step == "load"
    assert Payment.objects.count() == 0
