"""List, add, pause, resume, run now and remove schedules."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.exceptions import InvalidSchedule, ScheduleNotFound
from django_reactor.management.commandtools import (
    ReactorCommand,
    add_reason,
    dumps,
    iso,
    parse_object,
    positive_int,
    reactor_name,
    sentence,
    short_reactor,
    write_table,
)
from django_reactor.services.cadence import check_zone, format_every
from django_reactor.services.schedules import FireRow, ScheduleRow
from django_reactor.states import CatchUp, Overlap

#: Exit status when the command refuses what it was given (nothing was written).
REFUSED = 2
#: The command's option for each field ``services.schedules`` names in its errors.
OPTIONS = {
    "reactor": "REACTOR",
    "cron": "--cron",
    "every": "--every",
    "timezone": "--tz",
    "inputs": "--inputs",
    "catch_up": "--catch-up",
    "overlap": "--overlap",
    "name": "--name",
}
HEADERS = ["ID", "NAME", "REACTOR", "WHEN", "TZ", "STATE", "NEXT FIRE", "LAST FIRE"]
HEADERS += ["CATCH-UP", "OVERLAP"]
SCHEDULE_HELP = "The schedule's id or name (reactor_schedule list shows them)."


def refused(message: str) -> CommandError:
    return CommandError(message, returncode=REFUSED)


def when(row: ScheduleRow) -> str:
    """``cron 30 2 * * *`` or ``every 15m``."""
    return f"every {format_every(row.every)}" if row.every is not None else f"cron {row.cron}"


def local(moment: dt.datetime | None, zone: str) -> str:
    """A fire time in the schedule's zone, ``2025-05-02 02:00 CEST``; ``-`` for none."""
    if moment is None:
        return "-"
    try:
        shown = moment.astimezone(check_zone(zone))
    except ValueError:  # a zone this system no longer knows: UTC
        shown = moment.astimezone(dt.UTC)
    return shown.strftime("%Y-%m-%d %H:%M:%S %Z").replace(":00 ", " ", 1)


def schedule_data(row: ScheduleRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "reactor": row.reactor,
        "cron": row.cron or None,
        "every_seconds": row.every.total_seconds() if row.every is not None else None,
        "timezone": row.timezone,
        "inputs": services.schedules.shown_inputs(row),
        "enabled": row.enabled,
        "catch_up": row.catch_up,
        "overlap": row.overlap,
        "next_fire_at": iso(row.next_fire_at),
        "last_fire_at": iso(row.last_fire_at),
        "last_execution_id": str(row.last_execution_id) if row.last_execution_id else None,
    }


def fire_data(fire: FireRow) -> dict[str, Any]:
    return {
        "fire_at": iso(fire.fire_at),
        "until": iso(fire.until),
        "outcome": fire.outcome,
        "manual": fire.manual,
        "execution_id": str(fire.execution_id) if fire.execution_id else None,
        "note": fire.note,
    }


class Command(ReactorCommand):
    help = (
        "Run reactors on a schedule: list the schedules, add one (a cron expression read in a "
        "time zone, or an interval), pause, resume, run one now, show its latest fires, "
        "remove it. The sweeper (Celery beat or reactor_sweep --loop) fires their ticks. A "
        "refused argument (an unknown reactor or schedule, a cron expression that does not "
        "parse, an unknown time zone, inputs the reactor refuses) exits with status 2 and "
        "writes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        listing = actions.add_parser("list", help="List the schedules by name.")
        listing.add_argument(
            "--reactor", metavar="NAME", help="Only the schedules of this reactor."
        )
        listing.add_argument("--json", action="store_true", help="Print a JSON array.")

        add = actions.add_parser(
            "add",
            help="Add a schedule.",
            description="Add a schedule: REACTOR runs with --inputs at every tick of --cron "
            "(read in --tz) or --every.",
        )
        add.add_argument(
            "reactor",
            metavar="REACTOR",
            help="The reactor to run: its registered name, or its class name when unique.",
        )
        cadence = add.add_mutually_exclusive_group(required=True)
        cadence.add_argument(
            "--cron",
            metavar="EXPR",
            help="A cron expression: minute hour day-of-month month day-of-week, such as "
            "'30 2 * * *', or @hourly, @daily, @weekly, @monthly, @yearly.",
        )
        cadence.add_argument(
            "--every",
            metavar="DURATION",
            help="An interval instead: 90s, 15m, 1h30m, 2d, 1w (or seconds). Ticks at the "
            "multiples of it since the epoch, in UTC.",
        )
        add.add_argument(
            "--tz",
            metavar="ZONE",
            help="The IANA time zone the cron expression is read in, such as Europe/Berlin "
            "(default: settings.TIME_ZONE).",
        )
        add.add_argument(
            "--inputs",
            metavar="JSON",
            default="{}",
            help="The inputs of every run, a JSON object checked by the reactor's Inputs "
            "serializer (default: {}).",
        )
        add.add_argument(
            "--catch-up",
            choices=CatchUp.values,
            default=CatchUp.ONCE,
            help="Ticks missed while nothing swept: skip them, run once for them, or run "
            "them all (default: once).",
        )
        add.add_argument(
            "--overlap",
            choices=Overlap.values,
            default=Overlap.SKIP,
            help="A tick while the previous run has not finished: allow another run, skip "
            "the tick, or queue it (default: skip).",
        )
        add.add_argument(
            "--name", help="A unique name (default: the reactor's class name and a suffix)."
        )
        add.add_argument("--paused", action="store_true", help="Add it paused.")
        add.add_argument("--json", action="store_true", help="Print the schedule as JSON.")

        for action, text in (
            ("pause", "Pause a schedule: no tick fires until it is resumed."),
            ("resume", "Resume a paused schedule from its next tick after now."),
            ("remove", "Remove a schedule and its fires (its runs stay)."),
        ):
            sub = actions.add_parser(action, help=text, description=text)
            sub.add_argument("schedule", metavar="SCHEDULE", help=SCHEDULE_HELP)
            if action != "remove":
                add_reason(sub, f"you {action} it")

        run_now = actions.add_parser(
            "run-now",
            help="Start a run of a schedule now.",
            description="Start a run of a schedule now, paused or not, whatever its overlap "
            "policy. Exits 1 when the reactor refuses the stored inputs.",
        )
        run_now.add_argument("schedule", metavar="SCHEDULE", help=SCHEDULE_HELP)
        run_now.add_argument("--json", action="store_true", help="Print the fire as JSON.")
        add_reason(run_now, "you start a run now")

        show = actions.add_parser("show", help="Show a schedule and its latest fires.")
        show.add_argument("schedule", metavar="SCHEDULE", help=SCHEDULE_HELP)
        show.add_argument(
            "--limit",
            type=positive_int,
            default=20,
            metavar="N",
            help="Show at most N fires (default 20).",
        )
        show.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            getattr(self, f"do_{action.replace('-', '_')}")(options)
        except ScheduleNotFound as exc:
            raise refused(f"{sentence(exc)} reactor_schedule list shows the schedules.") from None

    # ---------------------------------------------------------------- actions

    def do_list(self, options: dict[str, Any]) -> None:
        reactor = options["reactor"]
        if reactor is not None:
            known = {r.reactor for r in services.schedules.list()}
            # Schedules of a reactor this process no longer knows are listed by exact name.
            reactor = reactor if reactor in known else self._reactor(reactor, "--reactor")
        rows = services.schedules.list(reactor=reactor)
        if options["json"]:
            self.stdout.write(dumps([schedule_data(r) for r in rows]))
            return
        if not rows:
            self.stdout.write("no schedules")
            return
        write_table(
            self,
            HEADERS,
            (
                [
                    str(r.id),
                    r.name,
                    short_reactor(r.reactor),
                    when(r),
                    r.timezone,
                    "enabled" if r.enabled else "paused",
                    local(r.next_fire_at, r.timezone),
                    local(r.last_fire_at, r.timezone),
                    r.catch_up,
                    r.overlap,
                ]
                for r in rows
            ),
        )

    def do_add(self, options: dict[str, Any]) -> None:
        reactor = self._reactor(options["reactor"], "REACTOR")
        try:
            inputs = parse_object(options["inputs"], "--inputs")
        except CommandError as exc:
            raise refused(str(exc)) from None
        try:
            row = services.schedules.create(
                reactor,
                cron=options["cron"],
                every=options["every"],
                timezone=options["tz"],
                inputs=inputs,
                catch_up=options["catch_up"],
                overlap=options["overlap"],
                name=options["name"],
                enabled=not options["paused"],
            )
        except InvalidSchedule as exc:
            lines = [
                f"  {OPTIONS.get(field, field)}: {sentence(' '.join(messages))}"
                for field, messages in exc.errors.items()
            ]
            raise refused("the schedule was not added:\n" + "\n".join(lines)) from None
        if options["json"]:
            self.stdout.write(dumps(schedule_data(row)))
            return
        state = f"next fire {local(row.next_fire_at, row.timezone)}" if row.enabled else "paused"
        zone = f" ({row.timezone})" if row.cron else ""
        self.stdout.write(f"schedule {row.id} {row.name} added: {when(row)}{zone}; {state}")

    def do_pause(self, options: dict[str, Any]) -> None:
        row = services.schedules.pause(options["schedule"], reason=options["reason"])
        self.stdout.write(f"schedule {row.id} {row.name} paused")

    def do_resume(self, options: dict[str, Any]) -> None:
        row = services.schedules.resume(options["schedule"], reason=options["reason"])
        self.stdout.write(
            f"schedule {row.id} {row.name} resumed: next fire "
            f"{local(row.next_fire_at, row.timezone)}"
        )

    def do_remove(self, options: dict[str, Any]) -> None:
        row = services.schedules.get(options["schedule"])
        services.schedules.remove(row)
        self.stdout.write(f"schedule {row.id} {row.name} removed")

    def do_run_now(self, options: dict[str, Any]) -> None:
        row = services.schedules.get(options["schedule"])
        fire = services.schedules.run_now(row, reason=options["reason"])
        if options["json"]:
            self.stdout.write(dumps(fire_data(fire)))
        elif fire.execution_id is not None:
            self.stdout.write(f"schedule {row.id} {row.name}: run {fire.execution_id} started")
        if fire.execution_id is None:
            raise CommandError(
                f"schedule {row.name!r} started no run: {sentence(fire.note)} Fix the schedule "
                "(the admin, or remove and add it again) and try again."
            )

    def do_show(self, options: dict[str, Any]) -> None:
        row = services.schedules.get(options["schedule"])
        fires = services.schedules.fires(row, limit=options["limit"])
        if options["json"]:
            data = schedule_data(row)
            data["fires"] = [fire_data(f) for f in fires]
            self.stdout.write(dumps(data))
            return
        zone = f" ({row.timezone})" if row.cron else ""
        self.stdout.write(f"schedule {row.id} {row.name}: {row.reactor}, {when(row)}{zone}")
        self.stdout.write(
            f"  {'enabled' if row.enabled else 'paused'}; next fire "
            f"{local(row.next_fire_at, row.timezone)}; catch-up {row.catch_up}; overlap "
            f"{row.overlap}"
        )
        self.stdout.write(f"  inputs: {dumps(services.schedules.shown_inputs(row))}")
        if not fires:
            self.stdout.write("no fires yet")
            return
        write_table(
            self,
            ["FIRE", "OUTCOME", "RUN", "NOTE"],
            (
                [
                    local(f.fire_at, row.timezone)
                    + (f" .. {local(f.until, row.timezone)}" if f.until else ""),
                    f.outcome + (" (run now)" if f.manual else ""),
                    str(f.execution_id) if f.execution_id else "-",
                    f.note,
                ]
                for f in fires
            ),
        )

    def _reactor(self, name: str, option: str) -> str:
        try:
            return reactor_name(name, option)
        except CommandError as exc:
            raise refused(str(exc)) from None
