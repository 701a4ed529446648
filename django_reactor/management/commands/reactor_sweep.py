"""Queue again the work that crashes and lost messages left behind."""

from __future__ import annotations

import json
import logging
import math
import threading
from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.conf import reactor_settings
from django_reactor.engine import timevalues
from django_reactor.exceptions import InvalidTime
from django_reactor.management.commandtools import ReactorCommand
from django_reactor.services.health import sweeping_every

logger = logging.getLogger("django_reactor.sweeper")

#: Longest pause after a failed sweep before the loop tries again (shorter intervals win).
ERROR_PAUSE = 5.0


def positive_seconds(value: str) -> float:
    """``--interval``: a finite number of seconds above 0."""
    try:
        number = float(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(number) or number <= 0:
        raise ArgumentTypeError(
            f"the interval must be a number of seconds above 0 (such as 15 or 0.5), got {value}"
        )
    try:
        return timevalues.seconds(number, "the interval")
    except InvalidTime as exc:
        raise ArgumentTypeError(str(exc)) from None


class Command(ReactorCommand):
    help = (
        "Republish unsent dispatches, hand runs whose worker died to a new worker, and release "
        "retries whose wake-up time came. Safe to run on many hosts at once. Runs once, or "
        "every --interval seconds with --loop (instead of the Celery beat task): sooner when "
        "a wake-up or a schedule's tick comes first, at once after a sweep whose batches "
        "kept coming back full; the loop survives database and broker outages, logging each "
        "failed sweep and trying again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--loop", action="store_true", help="Keep sweeping until interrupted (Ctrl-C)."
        )
        parser.add_argument(
            "--interval",
            type=positive_seconds,
            default=None,
            help="Seconds between sweeps with --loop (default: REACTOR['SWEEP_INTERVAL']).",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print each sweep's report as one JSON line."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        interval = options["interval"] or reactor_settings.SWEEP_INTERVAL
        if not options["loop"]:
            try:
                self._report(services.sweep().as_dict(), as_json=options["json"])
            except Exception as exc:
                raise CommandError(
                    f"the sweep failed ({type(exc).__name__}: {exc}); nothing was lost, run it "
                    "again once the database and the broker are reachable"
                ) from exc
            return
        stop = threading.Event()
        try:
            while True:
                try:
                    with sweeping_every(interval):  # what its heartbeats promise
                        report = services.sweep()
                    self._report(report.as_dict(), as_json=options["json"])
                    # A sweep cut short by full batches goes on at once; one that ends before
                    # the next wake-up or tick waits for it, not for the whole interval.
                    pause = services.next_sweep_in(report, interval)
                except Exception as exc:
                    # The loop is the recovery of every other process: it must outlive outages.
                    pause = min(interval, ERROR_PAUSE)
                    logger.warning("sweep failed; trying again in %.1f s", pause, exc_info=True)
                    self.stderr.write(
                        f"sweep failed ({type(exc).__name__}: {exc}); trying again in {pause:g} s"
                    )
                if stop.wait(pause):
                    return
        except KeyboardInterrupt:
            self.stdout.write("sweeper stopped")

    def _report(self, report: dict[str, int], *, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps(report))
        else:
            self.stdout.write("sweep: " + ", ".join(f"{k} {v}" for k, v in report.items()))
