"""Run a stopped run again from a step, from the command line."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.engine.forks import ForkPlan
from django_reactor.engine.outcomes import outcome_data
from django_reactor.exceptions import ForkNeedsUndo, ReactorError
from django_reactor.management.commandtools import (
    EXIT_ZERO_HELP,
    FAILED_STATUSES,
    ReactorCommand,
    add_reason,
    dumps,
    expand_execution_id,
    outcome_lines,
    parse_object,
    sentence,
    styled,
)


class Command(ReactorCommand):
    help = (
        "Fork a run that ended: a new run that reuses the results of the steps it completed "
        "before --from (their bodies do not run again) and runs the rest with the code deployed "
        "now. Completed steps past --from whose effects stand (the abandoned branch) must be "
        "undone first, newest first: --dry-run shows the plan, --undo-abandoned carries it out. "
        "A run is re-run (retried or forked) at most once: fork the fork to go again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "execution_id",
            help="The run to fork (its id, or its first 8 or more characters).",
        )
        parser.add_argument(
            "--from",
            dest="from_step",
            metavar="STEP",
            required=True,
            help="The step the fork runs again from (the steps before it are carried).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Show what the fork would do (steps carried, undone, run again) and stop.",
        )
        parser.add_argument(
            "--undo-abandoned",
            action="store_true",
            help="Undo the abandoned branch (the plan's undo list, newest first) before the "
            "fork runs. Without it a fork that abandons completed steps is refused.",
        )
        parser.add_argument(
            "--inputs",
            metavar="JSON",
            help="The fork's inputs as a JSON object (validated by the reactor's Inputs); "
            "default: the run's own.",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print the plan or outcome as JSON."
        )
        parser.add_argument("--exit-zero", action="store_true", help=EXIT_ZERO_HELP)
        add_reason(parser, "the run is forked")

    def handle(self, *args: Any, **options: Any) -> None:
        execution_id = expand_execution_id(options["execution_id"])
        inputs = (
            parse_object(options["inputs"], "--inputs") if options["inputs"] is not None else None
        )
        try:
            if options["dry_run"]:
                self._plan(services.fork_plan(execution_id, options["from_step"]), options)
                return
            outcome = services.shown_outcome(
                services.fork(
                    execution_id,
                    options["from_step"],
                    inputs=inputs,
                    undo_abandoned=options["undo_abandoned"],
                    reason=options["reason"],
                )
            )
        except ForkNeedsUndo as exc:
            if options["json"]:
                self.stdout.write(dumps({"refused": str(exc), "plan": exc.plan.as_dict()}))
            else:
                self._plan(exc.plan, options)
            raise CommandError(
                f"{sentence(exc)} Nothing changed; run again with --undo-abandoned to undo them."
            ) from None
        except ReactorError as exc:
            raise CommandError(f"cannot fork execution {execution_id}: {sentence(exc)}") from exc
        if options["json"]:
            self.stdout.write(dumps(outcome_data(outcome)))
        else:
            self.stdout.write(
                f"execution {services.find(execution_id).id}: forked as {outcome.execution_id} "
                f"from {options['from_step']}: " + styled(self, outcome.status)
            )
            for line in outcome_lines(outcome):
                self.stdout.write(line)
        if outcome.status in FAILED_STATUSES and not options["exit_zero"]:
            raise CommandError("the fork failed (its outcome is above); --exit-zero exits 0")

    def _plan(self, plan: ForkPlan, options: dict[str, Any]) -> None:
        if options["json"]:
            self.stdout.write(dumps(plan.as_dict()))
            return
        write = self.stdout.write
        write(f"fork from {plan.from_step}:")
        write(f"  carried (not run again): {', '.join(plan.carried) or 'none'}")
        if plan.undo:
            write(f"  undone first, in this order: {', '.join(plan.undo)}")
        else:
            write("  undone first: nothing (no completed step past the fork step stands)")
        write(f"  run again: {', '.join(plan.again) or 'none'} (and every step not carried)")
        for warning in plan.warnings:
            write(f"  warning: {warning}")
