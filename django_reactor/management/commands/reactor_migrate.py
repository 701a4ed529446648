"""Move runs parked definition_changed onto the deployed definition of their reactor."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.exceptions import ReactorError
from django_reactor.management.commandtools import (
    ReactorCommand,
    add_reason,
    dumps,
    expand_execution_id,
    sentence,
)
from django_reactor.services.migrating import parse_renames


class Command(ReactorCommand):
    help = (
        "Move runs of REACTOR parked definition_changed onto the reactor's definition in this "
        "code, when the steps each recorded map onto it: every recorded step, under its name "
        "or the new name --map old=new gives it, exists with the implementation and "
        "dependencies it ran with. Their records keep their results and undo stack, and a "
        "worker takes them again from where they stopped. A run whose steps do not map is "
        "refused with the reason; nothing changes for it. Exits 1 when any was refused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("reactor", help="The reactor (its registered name or class name).")
        parser.add_argument(
            "--map",
            action="append",
            default=[],
            metavar="OLD=NEW",
            help="A step the deploy renamed: its old name and its new one (repeat for each).",
        )
        parser.add_argument(
            "--execution",
            action="append",
            default=[],
            metavar="ID",
            help="Migrate only this parked run (repeat for several; default: every run of the "
            "reactor parked definition_changed).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Say what would move and what would be refused, and change nothing.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print one JSON array with an object per run: execution_id, moved, reason, "
            "renames.",
        )
        add_reason(parser, "the runs are migrated")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            renames = parse_renames(options["map"])
            ids = [
                uuid.UUID(expand_execution_id(i, "--execution")) for i in options["execution"]
            ] or None
            results = services.migrate_parked(
                options["reactor"],
                renames=renames,
                execution_ids=ids,
                dry_run=options["dry_run"],
                reason=options["reason"],
            )
        except ReactorError as exc:
            raise CommandError(f"cannot migrate: {sentence(exc)}") from None
        if options["json"]:
            self.stdout.write(dumps([r.as_dict() for r in results]))
        else:
            if not results:
                self.stdout.write(
                    f"no run of {options['reactor']} is parked definition_changed: nothing to do"
                )
            for result in results:
                renamed = ", ".join(f"{old} -> {new}" for old, new in result.renames.items())
                line = f"execution {result.execution_id}: {result.reason}"
                if renamed:
                    line += f" (steps renamed: {renamed})"
                style = self.style.SUCCESS if result.moved else self.style.ERROR
                self.stdout.write(style(line))
        refused = [r for r in results if not r.moved]
        if refused:
            raise CommandError(
                f"{len(refused)} of {len(results)} parked run(s) could not be migrated; see "
                "above. Map renamed steps with --map old=new, or deploy the code they ran with "
                "to finish or undo them, or cancel them",
                returncode=1,
            )
        if results and not options["dry_run"]:
            self.stdout.write(
                f"{len(results)} run(s) migrated; `python manage.py reactor_deploy_check` says "
                "what else this code does to the runs in flight"
            )
