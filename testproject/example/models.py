"""The shop the example sagas change: stock, orders, payments, shipments, subscriptions."""

from __future__ import annotations

from django.db import models


class Product(models.Model):
    """Something we sell, with the stock on hand."""

    sku = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=100)
    price = models.DecimalField(max_digits=10, decimal_places=2)
    stock = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["sku"]

    def __str__(self) -> str:
        return f"{self.sku} ({self.stock} in stock)"


class Order(models.Model):
    """A customer's order."""

    class Status(models.TextChoices):
        NEW = "new"
        PLACED = "placed"
        CANCELLED = "cancelled"

    customer_email = models.EmailField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.NEW)
    total = models.DecimalField(max_digits=12, decimal_places=2, default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"order {self.pk} ({self.status})"


class OrderLine(models.Model):
    """One product and quantity of an order."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="lines")
    product = models.ForeignKey(Product, on_delete=models.PROTECT)
    quantity = models.PositiveIntegerField()
    reserved = models.BooleanField(default=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.quantity} x {self.product.sku}"


class Payment(models.Model):
    """A charge at the (fake) payment gateway, deduplicated by idempotency key."""

    class Status(models.TextChoices):
        CAPTURED = "captured"
        REFUNDED = "refunded"

    idempotency_key = models.CharField(max_length=64, unique=True)
    reference = models.CharField(max_length=32)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CAPTURED)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.reference} {self.amount} ({self.status})"


class GatewayCall(models.Model):
    """Every call the fake gateway received: lets the flaky gateway fail a set number of times."""

    idempotency_key = models.CharField(max_length=64, db_index=True)
    succeeded = models.BooleanField()
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.idempotency_key} {'ok' if self.succeeded else 'timeout'}"


class Shipment(models.Model):
    """A parcel booked with the (fake) carrier."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="shipment")
    tracking_number = models.CharField(max_length=32)
    country = models.CharField(max_length=2)
    cancelled = models.BooleanField(default=False)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.tracking_number


class Subscription(models.Model):
    """A monthly plan that renews by charging the customer."""

    customer_email = models.EmailField()
    active = models.BooleanField(default=True)
    monthly_price = models.DecimalField(max_digits=10, decimal_places=2)
    paid_until = models.DateField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.customer_email} until {self.paid_until}"


class Effect(models.Model):
    """An external side effect, recorded once per idempotency key (like a payment provider)."""

    key = models.CharField(max_length=64, unique=True)
    execution_id = models.UUIDField()
    step = models.CharField(max_length=64)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.step} {self.key[:8]}"


class BodyRun(models.Model):
    """Every time a step body started (to count at-least-once re-runs)."""

    execution_id = models.UUIDField(db_index=True)
    step = models.CharField(max_length=64)
    pid = models.PositiveIntegerField()
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.step} in {self.pid}"


class Account(models.Model):
    """A customer's balance, moved by the atomic steps of ``TransferFunds``."""

    name = models.CharField(max_length=64, unique=True)
    balance = models.DecimalField(max_digits=12, decimal_places=2, default=0)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}: {self.balance}"


class LedgerEntry(models.Model):
    """One movement of an account's balance, written in the same transaction as the move."""

    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="entries")
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    execution_id = models.UUIDField(null=True, blank=True)
    step = models.CharField(max_length=64, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.account_id} {self.amount:+}"
