"""Run the demo sagas shipped in ``django_reactor.demo`` and print what each did."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandParser
from django.db import connection
from django.test.utils import override_settings

from django_reactor import Completed, services
from django_reactor.display import short_json, trace_lines
from django_reactor.exceptions import ReactorError
from django_reactor.management.commandtools import ReactorCommand, status_style
from django_reactor.store import dialect_for

if TYPE_CHECKING:
    from django_reactor.demo.shop import Shop

# The demo's locks are kept in django_reactor's own tables, so that it needs no Redis.
DATABASE_BACKEND = "django_reactor.coordination.backends.database.DatabaseBackend"


class Command(ReactorCommand):
    help = (
        "Run the demo sagas (an order that completes, one that fails and rolls back, an order "
        "replayed by its idempotency key, a payment that retries, a renewal that halts, a "
        "refund that pauses for approval, a map) and print a summary of each. Works in any "
        "project that installs django_reactor; migrates the database first if needed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--no-migrate",
            action="store_true",
            help="Do not apply pending migrations first (default: %(default)r).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["no_migrate"]:
            call_command("migrate", interactive=False, verbosity=0)
        reactor = getattr(settings, "REACTOR", None) or {}
        with override_settings(REACTOR={**reactor, "COORDINATION_BACKEND": DATABASE_BACKEND}):
            self._run()

    def _run(self) -> None:
        # Imported here, not at module level: the demo's reactors register themselves only in
        # the process that runs the demo.
        from django_reactor.demo.sagas import DemoOrder, DemoRefund, DemoRenewal, DemoRenewAll
        from django_reactor.demo.shop import SHOP

        SHOP.reset()
        db = connection.settings_dict
        self.stdout.write(
            self.style.MIGRATE_HEADING(
                f"django_reactor demo (database: {dialect_for(connection.alias).name} {db['NAME']})"
            )
        )
        self.stdout.write("Stock before: " + SHOP.stock())

        order = {
            "customer_email": "ada@example.com",
            "items": [{"sku": "MUG", "quantity": 2}, {"sku": "TEE", "quantity": 1}],
            "card_token": "tok_visa_4242",
            "country": "DE",
        }
        # A key of this call's own: the database remembers the keys of earlier demos.
        key = f"demo-checkout-{uuid.uuid4().hex[:12]}"
        completed = DemoOrder.run(order, idempotency_key=key)
        self._scenario(1, "An order that completes", completed)
        self.stdout.write("Stock now: " + SHOP.stock())

        outcome = DemoOrder.run({**order, "country": "XX"})
        self._scenario(2, "An order the carrier refuses: it fails and rolls back", outcome)
        refused = list(SHOP.orders.values())[-1]
        self.stdout.write(
            f"Stock after the rollback: {SHOP.stock()} (unchanged by order {refused.id}, "
            f"which is now {refused.status})"
        )

        payments = len(SHOP.payments)
        again = DemoOrder.run(order, idempotency_key=key)
        self._heading(3, "The first order sent again with its idempotency key: nothing runs twice")
        replayed = " (the first run, replayed)" if again.idempotent_replay else ""
        self.stdout.write(f"   idempotency key {key!r}: execution {again.execution_id}{replayed}")
        self._ending(again)
        self.stdout.write(
            f"Stock still: {SHOP.stock()}; payments at the gateway: {payments} before, "
            f"{len(SHOP.payments)} after"
        )

        renewed = SHOP.subscribe("grace@example.com", Decimal("12.00"))
        self._scenario(
            4,
            "A renewal whose payment gateway times out twice: the charge is retried",
            DemoRenewal.run({"subscription_id": renewed.id, "card_token": "tok_mc"}),
        )
        lapsed = SHOP.subscribe("alan@example.com", Decimal("12.00"), active=False)
        self._scenario(
            5,
            "A renewal of a cancelled subscription: the first step halts, nothing to undo",
            DemoRenewal.run({"subscription_id": lapsed.id, "card_token": "tok_mc"}),
        )

        if isinstance(completed, Completed):
            order_id = completed.value["order_id"]
            self._refund(6, DemoRefund.run({"order_id": order_id, "amount_cents": 950}))

        self._renewals(7, DemoRenewAll, SHOP)
        self.stdout.write("")
        self.stdout.write(
            "Look at any run again from python manage.py shell: "
            "from django_reactor import services; services.find('<execution id>').trace"
        )

    def _refund(self, number: int, paused: Any) -> None:
        self._heading(number, "A refund that waits for a person's approval")
        if paused.status != "paused":
            self._scenario(number, "", paused, heading=False)
            return
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
        self._scenario(number, "", outcome, heading=False)

    def _renewals(self, number: int, reactor: Any, shop: Shop) -> None:
        for email in ("edsger@example.com", "barbara@example.com"):
            shop.subscribe(email, Decimal("7.00"))
        renewals = reactor.run({"due_by": dt.date.today().isoformat(), "card_token": "tok_mc"})
        self._scenario(
            number, "Renewing every due subscription: a map, one element per subscription", renewals
        )
        for summary in services.find(renewals.execution_id).maps:
            self.stdout.write(
                f"   map {summary['step']}: {summary['total']} elements, "
                f"{summary['succeeded']} succeeded, {summary['failed']} failed"
            )

    def _heading(self, number: int, title: str) -> None:
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(f"{number}. {title}"))

    def _scenario(self, number: int, title: str, outcome: Any, *, heading: bool = True) -> None:
        handle = services.find(outcome.execution_id)
        if heading:
            self._heading(number, title)
        self.stdout.write(f"   {handle.reactor.rsplit('.', 1)[-1]} execution {handle.id}")
        self.stdout.write(f"   inputs: {short_json(handle.inputs, 160)}")
        for line in trace_lines(handle):
            self.stdout.write(f"     {line}")
        self._ending(outcome)

    def _ending(self, outcome: Any) -> None:
        style = status_style(self, outcome.status)
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
