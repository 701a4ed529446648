"""Pause runs, or every run of a reactor, from the command line."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.management.commandtools import (
    SteeringCommand,
    dumps,
    local_time,
    reactor_name,
    styled,
)
from django_reactor.states import ExecutionStatus


class Command(SteeringCommand):
    help = (
        "Pause runs: each stops at its next step boundary (at once when nobody runs it) and "
        "waits, suspended and holding no worker, until reactor_unpause. Give execution ids, or "
        "--reactor NAME to pause every run of a reactor (running ones stop after their step, "
        "new ones are stored and not started). --list shows what is paused."
    )
    action = "pause"
    done = "paused"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--reactor",
            metavar="NAME",
            help="Pause every run of this reactor (registered name, dotted path or class name) "
            "instead of runs by id.",
        )
        parser.add_argument(
            "--list", action="store_true", help="List the paused reactors and stop there."
        )
        # Ids are optional here: --reactor and --list take none.
        for action in parser._actions:
            if action.dest == "execution_ids":
                action.nargs = "*"

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            return self._list(options)
        if options["reactor"]:
            if options["execution_ids"]:
                raise CommandError("give execution ids or --reactor, not both")
            return self._pause_reactor(options)
        if not options["execution_ids"]:
            raise CommandError(
                "give the ids of the runs to pause, or --reactor NAME to pause every run of a "
                "reactor (--list shows what is paused)"
            )
        return super().handle(*args, **options)

    def operate(
        self, execution_id: str, options: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        handle = services.pause(execution_id, reason=options["reason"])
        lines = [f"execution {handle.id}: " + styled(self, handle.status)]
        if handle.status != ExecutionStatus.SUSPENDED:
            lines.append(
                "  it stops at its next step boundary (a live process runs it, or it waits at "
                "an interrupt); reactor_show shows when it did"
            )
        return {"execution_id": str(handle.id), "status": handle.status}, lines

    def _pause_reactor(self, options: dict[str, Any]) -> None:
        name = reactor_name(options["reactor"])
        paused = services.pause_reactor(name, reason=options["reason"])
        if options["json"]:
            self.stdout.write(dumps(_pause_data(paused) | {"new": paused.new}))
            return
        if not paused.new:
            self.stdout.write(
                f"{name} was paused already, since {local_time(paused.paused_at)}"
                + (f": {paused.reason}" if paused.reason else "")
            )
            return
        self.stdout.write(
            f"{name} paused: its running runs stop at their next step boundary, new runs are "
            f"stored and not started. reactor_unpause --reactor {name} lets them go on."
        )

    def _list(self, options: dict[str, Any]) -> None:
        paused = services.paused_reactors()
        if options["json"]:
            self.stdout.write(dumps([_pause_data(p) for p in paused]))
            return
        if not paused:
            self.stdout.write("no reactor is paused")
            return
        for pause in paused:
            by = f" by {pause.paused_by}" if pause.paused_by else ""
            reason = f": {pause.reason}" if pause.reason else ""
            self.stdout.write(
                f"{pause.reactor} paused since {local_time(pause.paused_at)}{by}{reason}"
            )


def _pause_data(pause: services.ReactorPause) -> dict[str, Any]:
    return {
        "reactor": pause.reactor,
        "reason": pause.reason,
        "paused_by": pause.paused_by,
        "paused_at": pause.paused_at,
    }
