"""Run failed runs again from the command line."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from django_reactor import services
from django_reactor.engine.outcomes import outcome_data
from django_reactor.management.commandtools import (
    EXIT_ZERO_HELP,
    FAILED_STATUSES,
    SteeringCommand,
    outcome_lines,
    styled,
)


class Command(SteeringCommand):
    help = (
        "Run each failed run again as a new run with the same stored inputs, from the first "
        "step, and print the new run's outcome. A failed run is retried at most once (retry "
        "the retry to go again); runs whose inputs were invalid are refused. Give one or more "
        "execution ids; each is reported, and the command fails at the end if any could not "
        "be retried or if a retried run failed."
    )
    action = "retry"
    done = "retried"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--exit-zero", action="store_true", help=EXIT_ZERO_HELP)

    def run_failed(self, data: dict[str, Any]) -> bool:
        return data["retry"]["status"] in FAILED_STATUSES

    def operate(
        self, execution_id: str, options: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        outcome = services.shown_outcome(services.retry(execution_id, reason=options["reason"]))
        original = services.find(execution_id).id
        lines = [
            f"execution {original}: retried as {outcome.execution_id}: "
            + styled(self, outcome.status),
            *outcome_lines(outcome),
        ]
        return {"execution_id": str(original), "retry": outcome_data(outcome)}, lines
