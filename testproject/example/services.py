"""Fake external services the example steps call: a payment gateway and a carrier.

Both behave like real providers: they take an idempotency key, so a retried call does its work
once.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal

from django.db import IntegrityError, transaction

from .models import GatewayCall, Order, Payment, Shipment

SHIPPING_COUNTRIES = frozenset({"DE", "FR", "GB", "NL", "US"})


class GatewayTimeout(Exception):
    """The gateway did not answer in time; trying again is safe (same idempotency key)."""


class CardDeclined(Exception):
    """The card was refused; trying again will not help."""

    retryable = False


class ShippingUnavailable(Exception):
    """The carrier does not deliver to that country."""

    retryable = False


class PaymentGateway:
    """Charges and refunds. ``timeouts`` makes the first N calls per key time out."""

    def __init__(self, timeouts: int = 0) -> None:
        self.timeouts = timeouts

    def charge(self, *, amount: Decimal, card_token: str, idempotency_key: str) -> Payment:
        if card_token.startswith("tok_declined"):
            raise CardDeclined(f"card {card_token[:8]}... was declined")
        calls = GatewayCall.objects.filter(idempotency_key=idempotency_key).count()
        if calls < self.timeouts:
            GatewayCall.objects.create(idempotency_key=idempotency_key, succeeded=False)
            raise GatewayTimeout(f"gateway timed out (call {calls + 1})")
        GatewayCall.objects.create(idempotency_key=idempotency_key, succeeded=True)
        reference = "pay_" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:12]
        try:
            with transaction.atomic():
                return Payment.objects.create(
                    idempotency_key=idempotency_key, reference=reference, amount=amount
                )
        except IntegrityError:  # the same request again: the first charge stands
            return Payment.objects.get(idempotency_key=idempotency_key)

    def refund(self, reference: str) -> None:
        Payment.objects.filter(reference=reference).update(status=Payment.Status.REFUNDED)


class Carrier:
    """Books and cancels parcels."""

    def book(self, order: Order, country: str) -> Shipment:
        if country not in SHIPPING_COUNTRIES:
            raise ShippingUnavailable(
                f"the carrier does not deliver to {country!r} "
                f"(it delivers to {', '.join(sorted(SHIPPING_COUNTRIES))})"
            )
        shipment, _ = Shipment.objects.get_or_create(
            order=order,
            defaults={"tracking_number": f"TRK{order.pk:08d}", "country": country},
        )
        return shipment

    def cancel(self, tracking_number: str) -> None:
        Shipment.objects.filter(tracking_number=tracking_number).update(cancelled=True)
