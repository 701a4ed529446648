"""A reactor whose second step hangs after doing part of its work, for crash tests.

Imported by a child process that the test SIGKILLs while the step hangs.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

from django.db.models import F

from django_reactor import Reactor, Step, Success, step
from testproject.example.models import Payment, Product


class TakeOne(Step):
    def run(self) -> Success:
        Product.objects.filter(sku="CRASH").update(stock=F("stock") - 1)
        return Success("took one")

    def undo(self, result: Any) -> None:
        Product.objects.filter(sku="CRASH").update(stock=F("stock") + 1)


class ChargeThenHang(Step):
    """Charges (the partial work), then never finishes: the test kills the process here."""

    def run(self) -> None:
        Payment.objects.create(
            idempotency_key=self.context.idempotency_key, reference="pay_crash", amount=Decimal(1)
        )
        threading.Event().wait()  # until the process is killed

    def compensate(self, error: Any) -> None:
        Payment.objects.filter(idempotency_key=self.context.run_idempotency_key).update(
            status=Payment.Status.REFUNDED
        )


class CrashSaga(Reactor):
    take = step(TakeOne)
    charge = step(ChargeThenHang, wait_for=["take"])
    after = step(TakeOne, wait_for=["charge"])
