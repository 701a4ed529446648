"""Let paused runs, or every run of a paused reactor, go on."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.management.commandtools import SteeringCommand, dumps, reactor_name, styled


class Command(SteeringCommand):
    help = (
        "Unpause runs: a suspended run goes on where it stopped (a worker takes it, at its "
        "wake-up time if it sleeps). Give execution ids, or --reactor NAME to unpause a "
        "reactor: its suspended runs are released oldest first, at most "
        "REACTOR['UNPAUSE_RATE'] a second (runs paused one by one stay paused)."
    )
    action = "unpause"
    done = "unpaused"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--reactor",
            metavar="NAME",
            help="Unpause this reactor (registered name, dotted path or class name) instead of "
            "runs by id.",
        )
        for action in parser._actions:
            if action.dest == "execution_ids":
                action.nargs = "*"

    def handle(self, *args: Any, **options: Any) -> None:
        if options["reactor"]:
            if options["execution_ids"]:
                raise CommandError("give execution ids or --reactor, not both")
            return self._unpause_reactor(options)
        if not options["execution_ids"]:
            raise CommandError(
                "give the ids of the runs to unpause, or --reactor NAME to unpause a reactor "
                "(reactor_pause --list shows what is paused)"
            )
        return super().handle(*args, **options)

    def operate(
        self, execution_id: str, options: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        handle = services.unpause(execution_id, reason=options["reason"])
        return {"execution_id": str(handle.id), "status": handle.status}, [
            f"execution {handle.id}: " + styled(self, handle.status)
        ]

    def _unpause_reactor(self, options: dict[str, Any]) -> None:
        name = reactor_name(options["reactor"])
        done = services.unpause_reactor(name, reason=options["reason"])
        if options["json"]:
            self.stdout.write(
                dumps({"reactor": name, "was_paused": done.was_paused, "released": done.released})
            )
            return
        if not done.was_paused and not done.released:
            raise CommandError(
                f"{name} is not paused (reactor_pause --list shows what is paused); nothing changed"
            )
        self.stdout.write(
            f"{name} unpaused: {done.released} suspended run(s) released, oldest first"
        )
