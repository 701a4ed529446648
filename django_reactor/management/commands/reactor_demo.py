"""Run the example sagas of the test project and print what each did."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.apps import apps
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from django_reactor import services
from django_reactor.display import short_json, trace_lines
from django_reactor.exceptions import ReactorError


class Command(BaseCommand):
    help = (
        "Run the example sagas (an order that completes, one that fails and rolls back, a "
        "payment that retries, a renewal that halts, a refund that pauses for approval) and "
        "print a summary of each. Migrates the database first if needed. Needs the example "
        "app testproject.example installed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--no-migrate",
            action="store_true",
            help="Do not apply pending migrations first (default: %(default)r).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not apps.is_installed("testproject.example"):
            raise CommandError(
                "reactor_demo needs the example app: add 'testproject.example' to "
                "INSTALLED_APPS, or run it from the django_reactor repository with "
                "DJANGO_SETTINGS_MODULE=testproject.settings."
            )
        if not options["no_migrate"]:
            call_command("migrate", interactive=False, verbosity=0)

        from testproject.example.models import Order, Product, Subscription
        from testproject.example.reactors import (
            ApproveRefund,
            PlaceOrder,
            RenewDueSubscriptions,
            RenewSubscription,
        )

        Product.objects.update_or_create(
            sku="MUG", defaults={"name": "Mug", "price": Decimal("9.50"), "stock": 10}
        )
        Product.objects.update_or_create(
            sku="TEE", defaults={"name": "T-shirt", "price": Decimal("19.00"), "stock": 5}
        )
        db = connection.settings_dict
        self.stdout.write(
            self.style.MIGRATE_HEADING(
                f"django_reactor demo (database: {connection.vendor} {db['NAME']})"
            )
        )
        self.stdout.write("Stock before: " + self._stock(Product))

        order = {
            "customer_email": "ada@example.com",
            "items": [{"sku": "MUG", "quantity": 2}, {"sku": "TEE", "quantity": 1}],
            "card_token": "tok_visa_4242",
            "country": "DE",
        }
        completed = PlaceOrder.run(order)
        self._scenario(1, "An order that completes", completed)
        self.stdout.write("Stock now: " + self._stock(Product))
        placed = Order.objects.order_by("-pk").first()

        outcome = PlaceOrder.run({**order, "country": "XX"})
        self._scenario(2, "An order the carrier refuses: it fails and rolls back", outcome)
        refused = Order.objects.order_by("-pk").first()
        self.stdout.write(
            f"Stock after the rollback: {self._stock(Product)} (unchanged by order "
            f"{refused.pk if refused else '?'}, which is now "
            f"{refused.status if refused else '?'})"
        )

        subscription = Subscription.objects.create(
            customer_email="grace@example.com",
            monthly_price=Decimal("12.00"),
            paid_until=dt.date.today(),
        )
        self._scenario(
            3,
            "A renewal whose payment gateway times out twice: the charge is retried",
            RenewSubscription.run({"subscription_id": subscription.pk, "card_token": "tok_mc"}),
        )

        lapsed = Subscription.objects.create(
            customer_email="alan@example.com",
            monthly_price=Decimal("12.00"),
            paid_until=dt.date.today(),
            active=False,
        )
        self._scenario(
            4,
            "A renewal of a cancelled subscription: the first step halts, nothing to undo",
            RenewSubscription.run({"subscription_id": lapsed.pk, "card_token": "tok_mc"}),
        )
        if placed is not None:
            self._refund(ApproveRefund, placed.pk)
        for email in ("edsger@example.com", "barbara@example.com"):
            Subscription.objects.create(
                customer_email=email, monthly_price=Decimal("7.00"), paid_until=dt.date.today()
            )
        renewals = RenewDueSubscriptions.run(
            {"due_by": dt.date.today().isoformat(), "card_token": "tok_mc"}
        )
        self._scenario(
            6, "Renewing every due subscription: a map, one element per subscription", renewals
        )
        for summary in services.find(str(renewals.execution_id)).maps:
            self.stdout.write(
                f"   map {summary['step']}: {summary['total']} elements, "
                f"{summary['succeeded']} succeeded, {summary['failed']} failed"
            )
        self.stdout.write("")
        self.stdout.write(
            "Look at any run again from python manage.py shell: "
            "from django_reactor import services; services.find('<execution id>').trace"
        )

    def _refund(self, reactor: Any, order_id: int) -> None:
        paused = reactor.run({"order_id": order_id, "amount_cents": 950})
        self.stdout.write("")
        self.stdout.write(
            self.style.MIGRATE_HEADING("5. A refund that waits for a person's approval")
        )
        self.stdout.write(
            f"   {paused.status} at {paused.step!r}, correlation id {paused.correlation_id!r}, "
            f"expires {paused.expires_at:%Y-%m-%d %H:%M} UTC"
        )
        try:
            services.resume_interrupt(
                correlation_id=paused.correlation_id, payload={"approved": "perhaps"}
            )
        except ReactorError as refused:
            self.stdout.write(f"   a bad payload is refused, the run stays paused: {refused}")
        # background=False: no Celery worker needed here; the rest runs in this process.
        outcome = services.resume_interrupt(
            correlation_id=paused.correlation_id,
            payload={"approved": True, "approver": "ada@example.com"},
            background=False,
        )
        self.stdout.write("   approved: the run goes on from where it paused")
        self._scenario(5, "", outcome, heading=False)

    def _stock(self, product_model: Any) -> str:
        return ", ".join(f"{p.sku}={p.stock}" for p in product_model.objects.order_by("sku"))

    def _scenario(self, number: int, title: str, outcome: Any, *, heading: bool = True) -> None:
        handle = services.find(outcome.execution_id)
        if heading:
            self.stdout.write("")
            self.stdout.write(self.style.MIGRATE_HEADING(f"{number}. {title}"))
        self.stdout.write(f"   {handle.reactor.rsplit('.', 1)[-1]} execution {handle.id}")
        self.stdout.write(f"   inputs: {short_json(handle.inputs, 160)}")
        for line in trace_lines(handle):
            self.stdout.write(f"     {line}")
        style = {
            "completed": self.style.SUCCESS,
            "failed": self.style.ERROR,
            "halted": self.style.WARNING,
        }.get(outcome.status, self.style.NOTICE)
        if outcome.status == "completed":
            ending = f"completed; value: {short_json(outcome.value, 120)}"
        elif outcome.status == "halted":
            ending = f"halted at {outcome.step}: {outcome.reason}"
        elif getattr(outcome, "error", None) is not None:
            ending = f"{outcome.status}: {outcome.error}"
            if not outcome.error.rollback_failures:
                ending += " (every completed step was undone)"
        else:
            ending = outcome.status
        self.stdout.write("   " + style(ending))
