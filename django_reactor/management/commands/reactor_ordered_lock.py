"""See, and unblock, the runs waiting on an ordered lock."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.coordination import CoordinationUnavailable
from django_reactor.exceptions import ExecutionNotFound, ReactorImproperlyConfigured
from django_reactor.management.commandtools import (
    ReactorCommand,
    add_reason,
    dumps,
    sentence,
    write_table,
)


class Command(ReactorCommand):
    help = (
        "Show the runs of an ordered lock (OrderedLock) in their order, whether its chain is "
        "halted after a failure, and the runs skipped as stuck; --skip takes one run out of "
        "the queue, --reset empties it and lifts a halt. KEY is the lock's key as the reactor "
        "computes it, for example account-7."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("key", help="The ordered lock's key, e.g. account-7.")
        action = parser.add_mutually_exclusive_group()
        action.add_argument(
            "--skip",
            metavar="EXECUTION_ID",
            help="Take this run out of the queue (a stuck head); the next run goes on.",
        )
        action.add_argument(
            "--reset",
            action="store_true",
            help="Empty the queue and lift a halt; the runs removed queue again when a "
            "worker next takes them.",
        )
        add_reason(parser, "you skip a run or reset the lock")
        parser.add_argument("--json", action="store_true", help="Print JSON instead of text.")

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["key"]
        try:
            if options["skip"]:
                if not services.skip_ordered_run(key, options["skip"], reason=options["reason"]):
                    raise CommandError(
                        f"execution {options['skip']} is not queued on ordered lock {key!r}; "
                        f"run reactor_ordered_lock {key} to see who is"
                    )
                self.stdout.write(f"execution {options['skip']} was taken out of {key!r}")
            elif options["reset"]:
                removed = services.reset_ordered_lock(key, reason=options["reason"])
                self.stdout.write(f"ordered lock {key!r} reset: {removed} run(s) removed")
            status = services.ordered_lock(key)
        except ExecutionNotFound as exc:
            raise CommandError(f"{sentence(exc)} Give an execution id.") from exc
        except CoordinationUnavailable as exc:
            raise CommandError(
                f"the coordination backend cannot be reached: {exc}. Check "
                "REACTOR['COORDINATION_BACKEND'] and that its server is up."
            ) from exc
        except ReactorImproperlyConfigured as exc:
            raise CommandError(
                f"coordination is not configured: {exc}. Fix the setting (see the "
                "Coordination section of the settings reference) and try again."
            ) from exc
        data = {
            "key": key,
            "head": status.head,
            "queue": list(status.queue),
            "halted_after": status.halted_after,
            "skipped": list(status.skipped),
        }
        if options["json"]:
            self.stdout.write(dumps(data))
            return
        if status.halted:
            self.stdout.write(
                f"halted: {status.reason}; reactor_ordered_lock {key} --reset lets the rest go on"
            )
        if not status.queue:
            self.stdout.write(f"ordered lock {key!r}: no run queued")
        if status.queue:
            write_table(
                self,
                ["POSITION", "EXECUTION"],
                (
                    ["head" if position == 0 and not status.halted else str(position), owner]
                    for position, owner in enumerate(status.queue)
                ),
                indent="  ",
            )
        if status.skipped:
            self.stdout.write("skipped as stuck: " + ", ".join(status.skipped))
