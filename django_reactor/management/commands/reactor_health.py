"""Say whether the fleet is healthy: workers and a sweeper alive, no late work."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from django_reactor import services
from django_reactor.management.commandtools import (
    ReactorCommand,
    dumps,
    short_reactor,
    write_table,
)
from django_reactor.services.health import Health, ProcessSeen, format_duration

#: The exit code when the fleet is unhealthy (also when the database cannot be read).
UNHEALTHY = 1


class Command(ReactorCommand):
    help = (
        "Say whether the fleet is healthy: workers alive (a heartbeat within three "
        "HEARTBEAT_INTERVAL), the sweeper's last sweep (within three SWEEP_INTERVAL), "
        "overdue wake-ups, dispatches no worker took, the workers and sweepers seen in the "
        "last day and each reactor's last hour. Exits 0 when healthy and 1 when not (for a "
        "liveness probe or a cron alert), saying what to do next. Reads only."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the report as one JSON object (healthy, problems, workers_alive, "
            "sweeper_ok, sweeper_last_seen_at, overdue_wake_ups, dispatches_not_taken, "
            "workers, sweepers, reactors, queues).",
        )
        parser.add_argument(
            "--no-reactors",
            action="store_true",
            help="Leave out the per-reactor table (a probe needs only the verdict).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = services.fleet_health(timezone.now(), reactors=not options["no_reactors"])
        if options["json"]:
            self.stdout.write(dumps(report.as_dict()))
        else:
            self._text(report)
        if not report.healthy:
            # The report is written already: the error's own line only repeats the verdict.
            raise CommandError(
                f"unhealthy: {len(report.problems)} problem(s), see above", returncode=UNHEALTHY
            )

    def _text(self, report: Health) -> None:
        write = self.stdout.write
        sweeper = report.sweeper
        write(("healthy" if report.healthy else "UNHEALTHY") + f" at {report.now.isoformat()}")
        write(f"workers alive: {report.workers_alive} (of {len(report.workers)} seen in a day)")
        write(
            "sweeper last seen: "
            + (
                f"{format_duration(sweeper.age)} ago on {sweeper.host}, pid {sweeper.pid}"
                + ("" if sweeper.alive else f" (gone: past {format_duration(sweeper.stale_after)})")
                if sweeper
                else "never (in the last day)"
            )
        )
        late = format_duration(report.late_after)
        write(f"overdue wake-ups (more than {late} late): {_count(report.overdue)}")
        write(f"dispatches not taken within {late}: {_count(report.not_taken)}")
        for problem in report.problems:
            write(self.style.ERROR(f"problem: {problem}"))
        processes = [*report.workers, *report.sweepers]
        if processes:
            write("")
            write_table(
                self,
                ["ROLE", "NAME", "PID", "QUEUES", "CONC", "TASKS", "SEEN", "ALIVE", "SWEPT"],
                ([*_process_row(p)] for p in processes),
            )
        if report.queues:
            write("")
            write("queues (runs waiting for a worker now):")
            write_table(
                self,
                ["QUEUE", "WAITING", "CONSUMERS"],
                (
                    [q.queue, str(q.waiting), ", ".join(q.consumers) or "no live worker"]
                    for q in report.queues
                ),
            )
            if not report.queues_complete:
                write("(the counts stopped at their cap: there are more)")
        if report.reactors:
            write("")
            write("the last hour, per reactor:")
            write_table(
                self,
                ["REACTOR", "STARTED", "COMPLETED", "FAILED", "P50", "P95", "IN FLIGHT"],
                (
                    [
                        short_reactor(w.reactor),
                        str(w.started),
                        str(w.completed),
                        str(w.failed),
                        format_duration(w.p50),
                        format_duration(w.p95),
                        str(w.in_flight),
                    ]
                    for w in report.reactors
                ),
            )
            if not report.reactors_complete:
                write("(some figures stopped at their cap: they count the newest runs only)")


def _count(count: Any) -> str:
    return str(count.value) if count.exact else f"more than {count.value}"


def _process_row(p: ProcessSeen) -> list[str]:
    sweep = "-"
    if p.last_sweep_at is not None:
        work = ", ".join(f"{k} {v}" for k, v in p.last_sweep.items() if v) or "nothing to do"
        sweep = f"{format_duration(p.last_sweep_seconds)}: {work}"
    return [
        p.role,
        p.name or p.host,
        str(p.pid),
        ",".join(p.queues) or "-",
        "-" if p.concurrency is None else str(p.concurrency),
        str(p.tasks_done) if p.role == "worker" else "-",
        f"{format_duration(p.age)} ago",
        "yes" if p.alive else "no",
        sweep,
    ]
