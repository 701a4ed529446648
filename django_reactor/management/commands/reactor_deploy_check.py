"""Say what the reactors in this code do to the runs in flight, before deploying it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.management.commandtools import ReactorCommand, dumps, write_table
from django_reactor.services.deploys import SAMPLE, DeployCheck, ReactorRuns

#: The exit code when a run in flight would park after the deploy (a CI/CD gate stops on it).
WOULD_PARK = 1


class Command(ReactorCommand):
    help = (
        "Compare the reactors in this code with the definitions the runs in flight (pending, "
        "scheduled, running, paused, sleeping, queued, suspended, rolling back) started under, "
        "and say per reactor what the code changes (steps added, removed, renamed, re-wired, "
        "re-implemented), how many runs stand before, at and past each change, and which runs "
        "would park definition_changed (or reactor_missing) when a worker on this code takes "
        "them, or wait for a worker with a version (Meta.version) this code lacks. Exits 1 when "
        "any would, for a CI/CD gate. Reads only; run it with the code "
        "being deployed, against the production database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the report as one JSON object (ok, would_park, reactors: each with "
            "its definitions in flight, their changes and the runs that would park).",
        )
        parser.add_argument(
            "--sample",
            type=int,
            default=SAMPLE,
            help=f"Ids of runs that would park to name per definition (default {SAMPLE}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        sample = options["sample"]
        if sample < 0:
            raise CommandError(f"--sample must be 0 or more, got {sample}")
        check = services.deploy_check(sample=sample)
        if options["json"]:
            self.stdout.write(dumps(check.as_dict()))
        else:
            self._text(check)
        if check.would_park:
            raise CommandError(
                f"{check.would_park} run(s) in flight would park after this deploy, see above. "
                "Keep the steps they recorded (add steps, or change only steps no run has "
                "reached), or let those runs finish on the code they started on (or cancel "
                "them) before deploying",
                returncode=WOULD_PARK,
            )
        if check.would_wait:
            raise CommandError(
                f"{check.would_wait} run(s) in flight started on code this code lacks and would "
                "wait for a worker that has it, see above. Keep their version in code (a class "
                "with Meta.version_of and Meta.version) until they finish",
                returncode=WOULD_PARK,
            )

    def _text(self, check: DeployCheck) -> None:
        write = self.stdout.write
        if not check.reactors:
            write("no runs in flight: nothing a deploy could break")
            return
        for reactor in check.reactors:
            self._reactor(reactor)
        write("")
        if check.would_park:
            write(self.style.ERROR(f"{check.would_park} run(s) in flight would park"))
        if check.would_wait:
            write(self.style.ERROR(f"{check.would_wait} run(s) in flight would wait for code"))
        if check.ok:
            write(self.style.SUCCESS("ok: every run in flight can go on under this code"))

    def _reactor(self, reactor: ReactorRuns) -> None:
        write = self.stdout.write
        write("")
        if reactor.missing:
            write(
                self.style.ERROR(
                    f"{reactor.reactor}: not in this code; its {reactor.runs} run(s) in flight "
                    "would park reactor_missing"
                )
            )
            return
        version = f"version {reactor.version}, " if reactor.version else ""
        write(
            f"{reactor.reactor}: {reactor.runs} run(s) in flight, {reactor.on_current} on this "
            f"code's definition ({version}{reactor.current[:12]})"
        )
        for started_on, runs in reactor.waiting.items():
            write(
                self.style.ERROR(
                    f"  started on {started_on}, which this code lacks: {runs} run(s) would "
                    "wait for a worker with it (never run by this code)"
                )
            )
        for definition in reactor.definitions:
            write(
                f"  started under {definition.definition_hash[:12]}: {definition.runs} run(s)"
                + ("" if definition.shape_kept else " (its shape was not kept: only removed "
                   "steps are found)")
            )  # fmt: skip
            if definition.changes:
                write_table(
                    self,
                    ["CHANGE", "STEP", "BEFORE", "AT", "PAST", "RUNS PAST IT", "DETAIL"],
                    (
                        [
                            change.kind,
                            change.step,
                            str(change.before),
                            str(change.at),
                            str(change.after),
                            "park" if change.blocks else "go on",
                            change.detail,
                        ]
                        for change in definition.changes
                    ),
                )
            elif definition.shape_kept:
                write("    no step changed (only what the steps return or read)")
            if definition.would_park:
                ids = ", ".join(str(i) for i in definition.parked_ids)
                more = definition.would_park - len(definition.parked_ids)
                write(
                    self.style.ERROR(
                        f"    would park definition_changed: {definition.would_park} run(s)"
                        + (f": {ids}" if ids else "")
                        + (f" and {more} more" if more > 0 and ids else "")
                    )
                )
            else:
                write("    would park: none")
