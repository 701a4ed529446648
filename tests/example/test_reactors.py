"""The example shop sagas: real side effects on real tables, and their rollback."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from django_reactor import Completed, Halted, Paused, services
from django_reactor.exceptions import InvalidPayload
from testproject.example.models import GatewayCall, Order, Payment, Product, Shipment, Subscription
from testproject.example.reactors import (
    ApproveRefund,
    PlaceOrder,
    RenewDueSubscriptions,
    RenewSubscription,
)

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


@pytest.fixture
def order() -> Order:
    return Order.objects.create(customer_email="ada@example.com", total=Decimal("38.00"))


def test_a_refund_waits_for_approval_then_settles(order: Order) -> None:
    paused = ApproveRefund.run({"order_id": order.pk, "amount_cents": 1500})
    assert isinstance(paused, Paused)
    assert (paused.step, paused.correlation_id) == ("approval", f"refund-{order.pk}")
    assert paused.expires_at is not None
    assert paused.results["hold"] == {"order_id": order.pk, "amount_cents": 1500, "status": "held"}

    outcome = services.resume_interrupt(
        correlation_id=f"refund-{order.pk}",
        payload={"approved": True, "approver": "grace@example.com"},
        background=False,
    )

    assert isinstance(outcome, Completed)
    assert outcome.value == {
        "order_id": order.pk,
        "amount_cents": 1500,
        "status": "settled",
        "approved_by": "grace@example.com",
        "note": "",
    }


def test_a_declined_refund_halts_at_settle(order: Order) -> None:
    paused = ApproveRefund.run({"order_id": order.pk, "amount_cents": 1500})
    outcome = services.resume_interrupt(
        paused.execution_id,
        payload={"approved": False, "approver": "grace", "note": "outside the return window"},
        background=False,
    )
    assert isinstance(outcome, Halted)
    assert outcome.step == "settle"
    assert outcome.reason == "refund declined by grace: outside the return window"


def test_invalid_approvals_are_counted_and_the_third_fails_the_run(order: Order) -> None:
    paused = ApproveRefund.run({"order_id": order.pk, "amount_cents": 1500})
    attempts = [
        ({"approved": True}, {"approver"}),
        ({"approved": "maybe", "approver": "grace"}, {"approved"}),
    ]
    for attempt, (payload, fields) in enumerate(attempts, start=1):
        with pytest.raises(InvalidPayload) as refused:
            services.resume_interrupt(paused.execution_id, payload=payload, background=False)
        assert (refused.value.attempts, refused.value.max_attempts) == (attempt, 3)
        assert refused.value.run_failed is False
        assert set(refused.value.errors) == fields
    assert services.find(paused.execution_id).status == "paused"

    with pytest.raises(InvalidPayload) as last:
        services.resume_interrupt(
            paused.execution_id, payload={"approver": "x" * 101}, background=False
        )
    assert (last.value.attempts, last.value.run_failed) == (3, True)
    assert set(last.value.errors) == {"approved", "approver"}
    run = services.find(paused.execution_id)
    assert run.status == "failed"
    assert [(e.kind, e.step) for e in run.trace if e.step][-2:] == [
        ("invalid_payload", "approval"),
        ("undo", "hold"),
    ]


def test_a_refund_for_an_unknown_order_or_too_much_fails_without_pausing(order: Order) -> None:
    unknown = ApproveRefund.run({"order_id": order.pk + 1000, "amount_cents": 100})
    assert unknown.status == "failed"
    assert unknown.error.message == f"no order {order.pk + 1000}"
    too_much = ApproveRefund.run({"order_id": order.pk, "amount_cents": 3801})
    assert too_much.status == "failed"
    assert "more than order" in too_much.error.message
    invalid = ApproveRefund.run({"order_id": order.pk, "amount_cents": 0})
    assert invalid.error.kind == "input_validation"


def test_renewing_every_due_subscription_is_a_map_over_a_queryset() -> None:
    today = dt.date.today()
    due = [
        Subscription.objects.create(
            customer_email=f"c{i}@example.com", monthly_price=Decimal("5.00"), paid_until=today
        )
        for i in range(3)
    ]
    later = Subscription.objects.create(
        customer_email="later@example.com",
        monthly_price=Decimal("5.00"),
        paid_until=today + dt.timedelta(days=20),
    )
    outcome = RenewDueSubscriptions.run({"due_by": today.isoformat(), "card_token": "tok"})
    assert isinstance(outcome, Completed), outcome
    assert outcome.value == {"renewed": 3, "failed": []}
    for subscription in due:
        subscription.refresh_from_db()
        assert subscription.paid_until == today + dt.timedelta(days=30)
    later.refresh_from_db()
    assert later.paid_until == today + dt.timedelta(days=20)


def test_a_second_checkout_of_the_same_customer_waits_then_fails(stock: None) -> None:
    from django_reactor.coordination import get_backend

    backend = get_backend()
    backend.acquire_lock("lock:customer-ada@example.com", "run:another-checkout", 30)
    try:
        outcome = PlaceOrder.run(ORDER)  # waits up to the lock's wait=5 s
    finally:
        backend.release_lock("lock:customer-ada@example.com", "run:another-checkout")
    assert outcome.status == "failed"
    assert outcome.error.kind == "contention"
    assert "lock 'customer-ada@example.com' is held by execution another-checkout" in str(
        outcome.error.message
    )
    assert not Order.objects.exists()  # nothing ran
