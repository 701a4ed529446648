"""Apply one action to every run a filter matches, previewed and durable."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.exceptions import ReactorError
from django_reactor.management.commandtools import (
    ReactorCommand,
    add_reason,
    dumps,
    parse_object,
    sentence,
    write_table,
)
from django_reactor.services.bulk import ACTIONS, BulkPreview, BulkProgress


class Command(ReactorCommand):
    help = (
        "Apply one action (retry, fork, cancel, undo, wake, pause, unpause, resume) to every run "
        "a filter matches: --filter key=value, repeatable (reactor, status, step, error, "
        "created_after, created_before, id, attr.<name>). --dry-run shows how many runs, by "
        "status, a sample and what each would undo, and writes nothing. The runs are chosen "
        "once; the operation is durable: killed, it goes on with --continue ID (or a worker, "
        "with --background), and no run gets the action twice."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", nargs="?", choices=sorted(ACTIONS), help="What to do.")
        parser.add_argument(
            "--filter",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="Which runs (repeatable; all must match): reactor=PlaceOrder status=failed "
            "step=charge error=GatewayTimeout created_after=2026-12-01 attr.customer_id=42; a "
            "status or an id may list several, separated by commas.",
        )
        parser.add_argument("--dry-run", action="store_true", help="Preview only.")
        add_reason(parser, "the operation acts on the runs")
        parser.add_argument("--from", dest="from_step", help="fork: the step to fork from.")
        parser.add_argument(
            "--undo-abandoned",
            action="store_true",
            help="fork: undo each run's abandoned branch first (newest first).",
        )
        parser.add_argument("--step", help="resume: the interrupt (its path) to resume.")
        parser.add_argument("--payload", help="resume: the payload, a JSON object.")
        parser.add_argument(
            "--background",
            action="store_true",
            help="Hand the operation to a worker and return (default: work through it here).",
        )
        parser.add_argument(
            "--continue",
            dest="continue_id",
            metavar="ID",
            help="Work through the rest of an operation a stopped process left.",
        )
        parser.add_argument("--show", metavar="ID", help="Show where an operation stands.")
        parser.add_argument("--stop", metavar="ID", help="Stop an operation.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["show"]:
                return self._progress(services.bulk_progress(options["show"]), options)
            if options["stop"]:
                return self._progress(services.stop_bulk(options["stop"]), options)
            if options["continue_id"]:
                return self._run(options["continue_id"], options)
            if not options["action"]:
                raise CommandError(
                    "give an action (retry, fork, cancel, undo, wake, pause, unpause, resume) "
                    "and --filter key=value, or --show/--stop/--continue ID"
                )
            run_filter = services.RunFilter.parse(_pairs(options["filter"]))
            parameters = _parameters(options)
            if options["dry_run"]:
                return self._preview(
                    services.preview_bulk(options["action"], run_filter, parameters), options
                )
            started = services.start_bulk(
                options["action"],
                run_filter,
                parameters,
                reason=options["reason"],
                background=options["background"],
            )
        except ReactorError as exc:
            raise CommandError(sentence(exc)) from exc
        if options["background"] or not started.total:
            return self._progress(started, options)
        if not options["json"]:
            self.stdout.write(
                f"bulk operation {started.id}: {started.action} of {started.total} run(s); "
                f"if this process stops, reactor_bulk --continue {started.id} goes on"
            )
        return self._run(str(started.id), options)

    def _run(self, operation_id: str, options: dict[str, Any]) -> None:
        def said(progress: BulkProgress) -> None:
            if not options["json"]:
                self.stdout.write(
                    f"  {progress.done + progress.skipped + progress.failed} of "
                    f"{progress.total}: {progress.done} done, {progress.skipped} skipped, "
                    f"{progress.failed} failed"
                )

        try:
            progress = services.run_bulk(operation_id, on_progress=said)
        except ReactorError as exc:
            raise CommandError(sentence(exc)) from exc
        if progress is None:
            current = services.bulk_progress(operation_id)
            if current.status in ("done", "stopped"):
                return self._progress(current, options)
            raise CommandError(
                f"bulk operation {operation_id} is held by another process (a worker, or a "
                "process that stopped: its lease runs out after REACTOR['LEASE_SECONDS']); "
                "try again then"
            )
        self._progress(progress, options)
        if progress.failed:
            raise CommandError(
                f"{progress.failed} run(s) failed with an error (reactor_bulk --show "
                f"{progress.id} and the admin's bulk operations list the notes)"
            )

    def _progress(self, progress: BulkProgress, options: dict[str, Any]) -> None:
        if options["json"]:
            self.stdout.write(dumps(progress.as_dict()))
            return
        self.stdout.write(
            f"bulk operation {progress.id}: {progress.action}, {progress.status}: "
            f"{progress.total} run(s), {progress.done} done, {progress.skipped} skipped, "
            f"{progress.failed} failed, {progress.left} left"
        )

    def _preview(self, preview: BulkPreview, options: dict[str, Any]) -> None:
        if options["json"]:
            self.stdout.write(dumps(preview.as_dict()))
            return
        statuses = ", ".join(f"{n} {s}" for s, n in preview.by_status.items()) or "none"
        self.stdout.write(
            f"{preview.action} {preview.count} run(s) ({statuses}): {preview.does}. "
            "Nothing was written (dry run)."
        )
        rows = [
            [str(s.execution_id), s.reactor.rsplit(".", 1)[-1], s.status, ", ".join(s.undo), s.note]
            for s in preview.sample
        ]
        if rows:
            write_table(self, ["execution", "reactor", "status", "undoes", "note"], rows)


def _pairs(fields: list[str]) -> dict[str, Any]:
    pairs: dict[str, Any] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or not key:
            raise CommandError(f"--filter {field!r} is not a key=value pair (status=failed)")
        if key in pairs:
            raise CommandError(f"--filter {key} is given twice; list several values with commas")
        pairs[key] = value
    return pairs


def _parameters(options: dict[str, Any]) -> dict[str, Any]:
    parameters: dict[str, Any] = {}
    if options["from_step"]:
        parameters["from_step"] = options["from_step"]
    if options["undo_abandoned"]:
        parameters["undo_abandoned"] = True
    if options["step"]:
        parameters["step"] = options["step"]
    if options["payload"] is not None:
        parameters["payload"] = parse_object(options["payload"], "--payload")
    return parameters
