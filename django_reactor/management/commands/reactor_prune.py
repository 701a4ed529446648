"""Delete old finished runs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.exceptions import ReactorError
from django_reactor.management.commandtools import (
    ReactorCommand,
    dumps,
    non_negative_int,
    parse_statuses,
    positive_int,
)
from django_reactor.states import TERMINAL_STATUSES

FINISHED = ", ".join(sorted(TERMINAL_STATUSES))


class Command(ReactorCommand):
    help = (
        "Delete finished runs (completed, failed, halted, cancelled) that finished more than "
        "--older-than days ago, with their steps, traces and interrupts, in batches of "
        "--batch-size (each batch its own transaction). Runs that could still move (pending, "
        "running, paused, rolling back, aborted, needs attention) are never deleted, and a run "
        "is kept while any of its child runs has not finished. Try --dry-run first."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            metavar="DAYS",
            type=non_negative_int,
            required=True,
            help="Delete runs that finished more than DAYS days ago (a whole number, 0 or "
            "more; 0 deletes every finished run).",
        )
        parser.add_argument(
            "--status",
            metavar="S[,S]",
            help=f"Delete only runs in these finished statuses, separated by commas (default: "
            f"all of them: {FINISHED}). Other statuses are refused.",
        )
        parser.add_argument(
            "--batch-size",
            metavar="N",
            type=positive_int,
            default=1000,
            help="Delete at most N runs per transaction (default 1000). Smaller batches hold "
            "locks for less time.",
        )
        parser.add_argument(
            "--pause",
            metavar="SECONDS",
            type=float,
            default=0.0,
            help="Wait SECONDS between batches (default 0), outside any transaction: a prune "
            "beside busy workers then leaves them the database.",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Only count the runs that would be deleted; delete nothing.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print one JSON object at the end (pruned or would_prune, older_than_days, "
            "statuses, batches) instead of progress lines.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than"]
        statuses: list[str] = sorted(TERMINAL_STATUSES)
        if options["status"] is not None:
            statuses = parse_statuses(options["status"])
            unfinished = [s for s in statuses if s not in TERMINAL_STATUSES]
            if unfinished:
                raise CommandError(
                    f"--status {','.join(unfinished)}: prune deletes only finished runs "
                    f"({FINISHED}); a run in {', '.join(unfinished)} may still move. Finish "
                    "it first (reactor_cancel or reactor_undo), then prune it."
                )
        batches: list[int] = []

        def progress(count: int) -> None:
            batches.append(count)
            if not options["json"]:
                self.stdout.write(f"pruned {count} (total {sum(batches)})")

        try:
            total = services.prune(
                days,
                statuses=statuses,
                batch_size=options["batch_size"],
                dry_run=options["dry_run"],
                on_batch=progress,
                pause=options["pause"],
            )
        except ReactorError as exc:  # --older-than further back than any date
            raise CommandError(f"cannot prune: {exc}") from exc

        if options["json"]:
            data: dict[str, Any] = {
                "older_than_days": days,
                "statuses": statuses,
                "dry_run": options["dry_run"],
            }
            if options["dry_run"]:
                data["would_prune"] = total
            else:
                data["pruned"] = total
                data["batches"] = batches
            self.stdout.write(dumps(data))
        elif options["dry_run"]:
            self.stdout.write(
                f"would prune {total} run(s) in {', '.join(statuses)} that finished more than "
                f"{days} day(s) ago (dry run: nothing deleted)"
            )
        else:
            self.stdout.write(
                f"pruned {total} run(s) in {', '.join(statuses)} that finished more than "
                f"{days} day(s) ago"
            )
