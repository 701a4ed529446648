"""The shop the demo's sagas change, in plain Python objects: stock, orders, subscriptions.

A real saga's steps write to your database or call a provider's API. The demo keeps its shop in
memory, so it runs in any project that installs django_reactor; the command starts from a fresh
shop every time it runs (:func:`Shop.reset`). The fake payment gateway and carrier behave like
real providers: they take an idempotency key, so a retried call does its work once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

SHIPPING_COUNTRIES = frozenset({"DE", "FR", "GB", "NL", "US"})


class GatewayTimeout(Exception):
    """The gateway did not answer in time; trying again is safe (same idempotency key)."""


class ShippingUnavailable(Exception):
    """The carrier does not deliver to that country."""

    retryable = False


class OutOfStock(Exception):
    """Not enough stock for an order line."""

    retryable = False


@dataclass
class Product:
    """Something the shop sells, with the stock on hand."""

    sku: str
    name: str
    price: Decimal
    stock: int


@dataclass
class Order:
    """A customer's order: ``lines`` maps a SKU to its quantity."""

    id: str
    customer_email: str
    lines: dict[str, int]
    total: Decimal
    status: str = "new"
    reserved: bool = False


@dataclass
class Payment:
    """A charge at the fake gateway."""

    reference: str
    amount: Decimal
    status: str = "captured"


@dataclass
class Subscription:
    """A monthly plan that renews by charging the customer."""

    id: int
    customer_email: str
    monthly_price: Decimal
    paid_until: dt.date
    active: bool = True


@dataclass
class Shop:
    """Everything the demo's steps read and change."""

    products: dict[str, Product] = field(default_factory=dict)
    orders: dict[str, Order] = field(default_factory=dict)
    #: By the idempotency key of the charge: the same key charges once.
    payments: dict[str, Payment] = field(default_factory=dict)
    #: Calls the gateway received, by idempotency key (the flaky gateway times out on the first).
    gateway_calls: Counter[str] = field(default_factory=Counter)
    #: Booked parcels: tracking number to the order it ships; cancelled ones are dropped.
    shipments: dict[str, str] = field(default_factory=dict)
    subscriptions: dict[int, Subscription] = field(default_factory=dict)

    def reset(self) -> None:
        """Empty the shop and stock it again: two products, no orders, no subscriptions."""
        self.products = {
            "MUG": Product("MUG", "Mug", Decimal("9.50"), 10),
            "TEE": Product("TEE", "T-shirt", Decimal("19.00"), 5),
        }
        self.orders.clear()
        self.payments.clear()
        self.gateway_calls.clear()
        self.shipments.clear()
        self.subscriptions.clear()

    def stock(self) -> str:
        """``MUG=10, TEE=5``: the stock on hand of every product."""
        return ", ".join(f"{sku}={self.products[sku].stock}" for sku in sorted(self.products))

    def subscribe(
        self, customer_email: str, monthly_price: Decimal, *, active: bool = True
    ) -> Subscription:
        """A new subscription, paid until today."""
        subscription = Subscription(
            len(self.subscriptions) + 1, customer_email, monthly_price, dt.date.today(), active
        )
        self.subscriptions[subscription.id] = subscription
        return subscription

    def due(self, day: dt.date | str) -> list[int]:
        """The ids of the active subscriptions paid until ``day`` or earlier."""
        until = dt.date.fromisoformat(str(day))
        return [s.id for s in self.subscriptions.values() if s.active and s.paid_until <= until]

    def charge(
        self, *, amount: Decimal, card_token: str, idempotency_key: str, timeouts: int = 0
    ) -> Payment:
        """Charge ``amount``; the first ``timeouts`` calls with a key time out."""
        calls = self.gateway_calls[idempotency_key]
        self.gateway_calls[idempotency_key] += 1
        if calls < timeouts:
            raise GatewayTimeout(f"gateway timed out (call {calls + 1})")
        if idempotency_key not in self.payments:  # the same request again: the first charge stands
            reference = "pay_" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:12]
            self.payments[idempotency_key] = Payment(reference, amount)
        return self.payments[idempotency_key]

    def refund(self, reference: str) -> None:
        """Refund the payment ``reference``."""
        for payment in self.payments.values():
            if payment.reference == reference:
                payment.status = "refunded"

    def book_parcel(self, order: Order, country: str) -> str:
        """Book a parcel for ``order``; its tracking number."""
        if country not in SHIPPING_COUNTRIES:
            raise ShippingUnavailable(
                f"the carrier does not deliver to {country!r} "
                f"(it delivers to {', '.join(sorted(SHIPPING_COUNTRIES))})"
            )
        tracking_number = "TRK" + order.id.removeprefix("ord_").upper()
        self.shipments[tracking_number] = order.id
        return tracking_number

    def cancel_parcel(self, tracking_number: str) -> None:
        """Cancel the parcel ``tracking_number``."""
        self.shipments.pop(tracking_number, None)


#: The one shop of this process; the command resets it before it runs the sagas.
SHOP = Shop()
