"""Queue again the work that crashes and lost messages left behind."""

from __future__ import annotations

import json
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_reactor import services
from django_reactor.conf import reactor_settings


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise CommandError(f"{value!r} is not a number of seconds") from None
    if number <= 0:
        raise CommandError(f"the interval must be more than 0 seconds, got {value}")
    return number


class Command(BaseCommand):
    help = (
        "Republish unsent dispatches, hand runs whose worker died to a new worker, and release "
        "retries whose wake-up time came. Safe to run on many hosts at once. Runs once, or "
        "every --interval seconds with --loop (instead of the Celery beat task)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--loop", action="store_true", help="Keep sweeping until interrupted (Ctrl-C)."
        )
        parser.add_argument(
            "--interval",
            type=positive_float,
            default=None,
            help="Seconds between sweeps with --loop (default: REACTOR['SWEEP_INTERVAL']).",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print each sweep's report as one JSON line."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        interval = options["interval"] or float(reactor_settings.SWEEP_INTERVAL)
        stop = threading.Event()
        try:
            while True:
                report = services.sweep().as_dict()
                if options["json"]:
                    self.stdout.write(json.dumps(report))
                else:
                    summary = ", ".join(f"{k} {v}" for k, v in report.items())
                    self.stdout.write(f"sweep: {summary}")
                if not options["loop"] or stop.wait(interval):
                    return
        except KeyboardInterrupt:
            self.stdout.write("sweeper stopped")
