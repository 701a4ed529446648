"""List stored runs, newest first."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from django_reactor import services, store
from django_reactor.display import duration_seconds, format_duration, stuck_reason
from django_reactor.engine.attributes import parse_filter
from django_reactor.exceptions import InvalidAttribute
from django_reactor.management.commandtools import (
    ReactorCommand,
    days_ago,
    dumps,
    iso,
    non_negative_int,
    parse_moment,
    parse_statuses,
    positive_int,
    reactor_name,
    short_reactor,
    status_cell,
    write_table,
)
from django_reactor.models import Execution, Interrupt

COLUMNS = (
    "id",
    "reactor",
    "status",
    "current_step",
    "created_at",
    "started_at",
    "finished_at",
    "parent_id",
    "wake_at",
    "deadline_at",
)


class Command(ReactorCommand):
    help = (
        "List stored runs, newest first: id, reactor, status, current step, when it was "
        "created and how long it took. Narrow the list by reactor, status, age, correlation "
        "id or business attribute. Reads only; use reactor_show ID for one run's steps and "
        "trace."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--reactor",
            metavar="NAME",
            help="Only runs of this reactor: its registered name (such as "
            "myapp.reactors.PlaceOrder) or its class name when that is unique.",
        )
        parser.add_argument(
            "--status",
            metavar="S[,S]",
            help="Only runs in these statuses, separated by commas, for example "
            "failed,needs_attention. Statuses: pending, scheduled, running, paused, completed, "
            "failed, halted, cancelled, aborted, rolling_back, needs_attention.",
        )
        since = parser.add_mutually_exclusive_group()
        since.add_argument(
            "--since",
            metavar="ISO",
            help="Only runs created at or after this ISO 8601 date or date-time (2024-05-01, "
            "2024-05-01T12:30:00+00:00; without an offset, the current time zone).",
        )
        since.add_argument(
            "--days",
            metavar="N",
            type=non_negative_int,
            help="Only runs created in the last N days.",
        )
        parser.add_argument(
            "--correlation-id",
            metavar="ID",
            help="Only runs with this correlation id (declared by one of their interrupts), "
            "for example refund-42.",
        )
        parser.add_argument(
            "--attr",
            metavar="KEY=VALUE",
            action="append",
            default=[],
            help="Only runs whose business attribute KEY (Meta.attributes, "
            "context.set_attribute) is VALUE, for example customer_id=42. Repeat it for runs "
            "with several attributes.",
        )
        parser.add_argument(
            "--limit",
            metavar="N",
            type=positive_int,
            default=50,
            help="Show at most N runs (default 50).",
        )
        parser.add_argument(
            "--stuck",
            action="store_true",
            help="Only runs that should be moving and are not: their lease expired (their "
            "process is gone), or the step they run has been in flight longer than its "
            "timeout. Shows why, and ignores the other filters. Warns first when no worker or "
            "sweeper is alive, or wake-ups and dispatches are late (as reactor_health does): "
            "runs that wait for them do not move either.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the runs as one JSON array of objects (id, reactor, status, "
            "current_step, created_at, started_at, finished_at, duration_seconds, parent_id, "
            "wake_at, deadline_at; with --stuck: why).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["stuck"]:
            self._stuck(options)
            return
        runs = Execution.objects.all()
        if options["reactor"] is not None:
            runs = runs.filter(reactor=self._reactor(options["reactor"]))
        if options["status"] is not None:
            runs = runs.filter(status__in=parse_statuses(options["status"]))
        if options["since"] is not None:
            runs = runs.filter(created_at__gte=parse_moment(options["since"]))
        elif options["days"] is not None:
            runs = runs.filter(created_at__gte=days_ago(options["days"]))
        correlation_id = options["correlation_id"]
        if correlation_id is not None:
            runs = runs.filter(
                Q(correlation_id=correlation_id)
                | Exists(
                    Interrupt.objects.filter(
                        execution_id=OuterRef("pk"), correlation_id=correlation_id
                    )
                )
            )
        if options["attr"]:
            runs = store.with_attributes(runs, self._attributes(options["attr"]))
        limit = options["limit"]
        # One more than shown: tells whether the list was cut, in the same query.
        newest_first = store.attributes.newest_first(runs)
        rows = list(runs.order_by(*newest_first).values(*COLUMNS)[: limit + 1])
        more = len(rows) > limit
        rows = rows[:limit]

        if options["json"]:
            self.stdout.write(dumps([self._data(row) for row in rows]))
            return
        if not rows:
            self.stdout.write("no runs match")
            return
        write_table(
            self,
            ["ID", "REACTOR", "STATUS", "STEP", "CREATED", "DURATION"],
            (
                [
                    str(row["id"]),
                    short_reactor(row["reactor"]),
                    status_cell(self, row["status"]),
                    self._step(row),
                    timezone.localtime(row["created_at"]).strftime("%Y-%m-%d %H:%M:%S"),
                    format_duration(self._seconds(row)),
                ]
                for row in rows
            ),
        )
        if more:
            self.stdout.write(
                f"(the {len(rows)} newest shown; pass --limit to see more, or narrow the list)"
            )

    def _stuck(self, options: dict[str, Any]) -> None:
        stuck = services.stuck_runs(options["limit"])
        # Runs that wait for a worker or a wake-up are not stuck by a lease or a timeout, yet
        # do not move while no worker or sweeper is alive: the fleet's problems say so.
        problems = services.fleet_health(reactors=False).problems
        for problem in problems:
            # Beside a JSON array on standard output, the warnings go to standard error.
            (self.stderr if options["json"] else self.stdout).write(
                self.style.WARNING(f"warning: {problem}")
            )
        if options["json"]:
            self.stdout.write(
                dumps(
                    [
                        {
                            "id": str(run.execution_id),
                            "reactor": run.reactor,
                            "status": run.status,
                            "current_step": run.step,
                            "since": iso(run.since),
                            "why": stuck_reason(run),
                        }
                        for run in stuck
                    ]
                )
            )
            return
        if not stuck:
            self.stdout.write(
                "no run holds an expired lease or a step past its timeout, but runs that wait "
                "for a worker or a wake-up do not move until the problems above are fixed"
                if problems
                else "no stuck runs"
            )
            return
        write_table(
            self,
            ["ID", "REACTOR", "STATUS", "STEP", "WHY"],
            (
                [
                    str(run.execution_id),
                    short_reactor(run.reactor),
                    status_cell(self, run.status),
                    run.step or "-",
                    stuck_reason(run),
                ]
                for run in stuck
            ),
        )

    @staticmethod
    def _attributes(given: list[str]) -> dict[str, str]:
        wanted: dict[str, str] = {}
        for text in given:
            try:
                key, value = parse_filter(text, f"--attr {text}")
            except InvalidAttribute as exc:
                raise CommandError(str(exc)) from None
            if key in wanted:
                raise CommandError(
                    f"--attr {key}= is given twice; a run has one value per attribute"
                )
            wanted[key] = value
        return wanted

    def _reactor(self, name: str) -> str:
        try:
            return reactor_name(name)
        except CommandError:
            # Runs of a reactor this process no longer knows are still listed by exact name.
            if Execution.objects.filter(reactor=name).exists():
                return name
            raise

    @staticmethod
    def _step(row: dict[str, Any]) -> str:
        """The step, and until when the run waits (a sleep, a scheduled start, a wake-up)."""
        step = row["current_step"] or "-"
        if row["wake_at"] is not None and row["status"] in ("pending", "scheduled"):
            until = timezone.localtime(row["wake_at"]).strftime("%Y-%m-%d %H:%M:%S")
            step += f" (until {until})"
        return step

    @staticmethod
    def _seconds(row: dict[str, Any]) -> float | None:
        return duration_seconds(row["started_at"], row["finished_at"])

    def _data(self, row: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": str(row["id"]),
            "reactor": row["reactor"],
            "status": row["status"],
            "current_step": row["current_step"],
            "created_at": iso(row["created_at"]),
            "started_at": iso(row["started_at"]),
            "finished_at": iso(row["finished_at"]),
            "duration_seconds": self._seconds(row),
            "parent_id": str(row["parent_id"]) if row["parent_id"] else None,
            "wake_at": iso(row["wake_at"]),
            "deadline_at": iso(row["deadline_at"]),
        }
