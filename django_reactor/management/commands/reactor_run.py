"""Start a run of a reactor from the command line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import registry, services
from django_reactor.engine.outcomes import Outcome, outcome_data
from django_reactor.exceptions import (
    IdempotencyKeyReused,
    ReactorError,
    ReactorNotRegistered,
    TransactionActive,
)
from django_reactor.management.commandtools import (
    EXIT_ZERO_HELP,
    FAILED_STATUSES,
    ReactorCommand,
    dumps,
    outcome_lines,
    parse_object,
    parse_pairs,
    reactor_name,
    read_object_file,
    sentence,
    styled,
)

EXAMPLE = """'{"order_id": 42}'"""


class Command(ReactorCommand):
    help = (
        "Start a run of a reactor and print its outcome. Name the reactor by its registered "
        "name (Meta.name or the dotted path of its class) or by its class name when that is "
        "unique. Give the inputs as a JSON object (--inputs or --inputs-file) or as key=value "
        "pairs; they are validated by the reactor's Inputs serializer first. The run goes in "
        "this process unless the reactor is a background one or you pass --background."
    )
    # call_command("reactor_run", ..., inputs_file="-", stdin=StringIO(...)) in tests.
    stealth_options = ("stdin",)

    intermixed_arguments = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "reactor",
            help="The reactor to run: its registered name (such as myapp.reactors.PlaceOrder) "
            "or its class name (PlaceOrder) when no other registered reactor has it.",
        )
        parser.add_argument(
            "fields",
            nargs="*",
            metavar="key=value",
            help="Build the inputs from pairs: each value is read as JSON when it parses "
            '(amount=5 is a number, items=\'[{"sku": "MUG"}]\' a list, note=hello the string '
            "'hello'). Not together with --inputs or --inputs-file. No inputs at all: {}.",
        )
        parser.add_argument(
            "--inputs",
            metavar="JSON",
            help=f"The inputs as a JSON object, for example {EXAMPLE}.",
        )
        parser.add_argument(
            "--inputs-file",
            metavar="PATH",
            help="Read the inputs (a JSON object) from this file; - reads standard input.",
        )
        parser.add_argument(
            "--background",
            action="store_true",
            help="Hand the whole run to a Celery worker and return at once (status pending), "
            "even when the reactor has no Meta.background. Without it, the reactor's "
            "Meta.background decides (inline by default).",
        )
        parser.add_argument(
            "--idempotency-key",
            metavar="KEY",
            help="Make the start safe to repeat: running the command again with the same key "
            "and inputs starts nothing and prints the first run's outcome; the same key with "
            "other inputs is refused.",
        )
        parser.add_argument(
            "--queue",
            metavar="NAME",
            help="The Celery queue the run's tasks go to, instead of the reactor's Meta.queue "
            "(a worker must consume it: celery worker -Q NAME).",
        )
        parser.add_argument(
            "--priority",
            type=int,
            metavar="0-9",
            help="The run's priority, 0 (lowest) to 9 (highest), instead of the reactor's "
            "Meta.priority (5 by default): waiting runs of higher priority go first.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the outcome as one JSON object (execution_id, status, and value, "
            "error, reason or interrupts when the run has them).",
        )
        parser.add_argument("--exit-zero", action="store_true", help=EXIT_ZERO_HELP)

    def handle(self, *args: Any, **options: Any) -> None:
        name = reactor_name(options["reactor"], option="reactor")
        try:
            reactor = registry.get(name)
        except ReactorNotRegistered as exc:  # pragma: no cover - reactor_name checked it
            raise CommandError(sentence(exc)) from exc
        if ":" in name:
            raise CommandError(
                f"{name} is an async step's unit, not a reactor; run the reactor that declares it"
            )
        inputs = self._inputs(options, list(options["fields"] or []))
        key = options["idempotency_key"]
        label = name.rsplit(".", 1)[-1]
        try:
            queue, priority = options["queue"], options["priority"]
            if options["background"]:
                outcome = services.run_in_background(
                    reactor, inputs, idempotency_key=key, queue=queue, priority=priority
                )
            else:
                outcome = services.run(
                    reactor, inputs, idempotency_key=key, queue=queue, priority=priority
                )
            outcome = services.shown_outcome(outcome)
        except IdempotencyKeyReused as exc:
            raise CommandError(
                f"cannot run {label}: {sentence(exc)} Nothing was started: give these inputs "
                "a new --idempotency-key, or run again with the first inputs."
            ) from exc
        except TransactionActive as exc:
            raise CommandError(
                f"cannot run {label} inline: {sentence(exc)} Or pass --background to let a "
                "worker run it."
            ) from exc
        except ReactorError as exc:
            raise CommandError(f"cannot run {label}: {sentence(exc)}") from exc

        if options["json"]:
            self.stdout.write(dumps(outcome_data(outcome)))
        else:
            self._summary(outcome)
        if outcome.status in FAILED_STATUSES and not options["exit_zero"]:
            raise CommandError(
                f"the run of {label} ended {outcome.status} (the outcome is above); pass "
                "--exit-zero to exit 0 whatever the outcome",
                returncode=1,
            )

    def _inputs(self, options: Mapping[str, Any], fields: list[str]) -> dict[str, Any]:
        given = [
            form
            for form, present in (
                ("--inputs", options["inputs"] is not None),
                ("--inputs-file", options["inputs_file"] is not None),
                ("key=value pairs", bool(fields)),
            )
            if present
        ]
        if len(given) > 1:
            raise CommandError(
                f"give the inputs one way, not several (got {' and '.join(given)}): "
                "--inputs, --inputs-file or key=value pairs"
            )
        if fields:
            return parse_pairs(fields, "the inputs")
        if options["inputs"] is not None:
            return parse_object(options["inputs"], "--inputs", EXAMPLE)
        if options["inputs_file"] is not None:
            return read_object_file(options["inputs_file"], "the inputs", options.get("stdin"))
        return {}

    def _summary(self, outcome: Outcome) -> None:
        if outcome.execution_id is None:
            self.stdout.write(
                self.style.NOTICE(
                    "an earlier run with this idempotency key is still starting; run the "
                    "command again shortly to see its outcome"
                )
            )
            return
        self.stdout.write(f"execution {outcome.execution_id}: " + styled(self, outcome.status))
        for line in outcome_lines(outcome):
            self.stdout.write(line)
