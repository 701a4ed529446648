"""Deliver a payload to a paused run's interrupt from the command line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.display import short_json
from django_reactor.engine.outcomes import (
    Aborted,
    Cancelled,
    Completed,
    Dispatched,
    Failed,
    Halted,
    InProgress,
    Outcome,
    Paused,
    Rescheduled,
    outcome_data,
)
from django_reactor.engine.validation import error_messages
from django_reactor.exceptions import (
    AlreadyResumed,
    ExecutionNotFound,
    IdempotencyKeyReused,
    InterruptClosed,
    InterruptNotFound,
    InvalidPayload,
    NotWaiting,
    ReactorError,
    ReactorNotRegistered,
    TransactionActive,
)
from django_reactor.management.commandtools import (
    ReactorCommand,
    add_reason,
    describe_interrupt,
    dumps,
    expand_execution_id,
    parse_object,
    parse_pairs,
    reactor_name,
    read_input,
    sentence,
    status_style,
)

EXAMPLE = """'{"approved": true}'"""


class Command(ReactorCommand):
    help = (
        "Deliver a payload to the interrupt a paused run waits at, and print how the run went "
        "on. Name the run by its execution id, or by --correlation-id (with --reactor when "
        "several reactors use the same correlation ids). Give the payload as a JSON object "
        "(--payload or --payload-file) or as key=value pairs. The payload is validated by the "
        "interrupt's serializer first: an invalid one changes nothing but the attempt count."
    )
    # call_command("reactor_resume", ..., payload_file="-", stdin=StringIO(...)) in tests.
    stealth_options = ("stdin",)

    intermixed_arguments = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "execution_id",
            nargs="?",
            help="The id of the paused run (the execution_id of its outcome, or its first 8 "
            "or more characters). Leave it out when you give --correlation-id.",
        )
        parser.add_argument(
            "fields",
            nargs="*",
            metavar="key=value",
            help="Build the payload from pairs: each value is read as JSON when it parses "
            "(approved=true is a boolean, amount=5 a number, note=hello the string 'hello'). "
            "Not together with --payload or --payload-file.",
        )
        parser.add_argument(
            "--correlation-id",
            metavar="ID",
            help="Name the run by the correlation id its interrupt declared (for example "
            "refund-42) instead of by its execution id.",
        )
        parser.add_argument(
            "--reactor",
            metavar="NAME",
            help="With --correlation-id: only look at runs of this reactor (its registered "
            "name, such as myapp.reactors.Refund, or its class name when that is unique).",
        )
        parser.add_argument(
            "--step",
            help="The interrupt to deliver to. Needed only when the run waits at several "
            "interrupts at once. An interrupt of a composed child is named by its path from "
            "the run, dotted (checkout.approval).",
        )
        parser.add_argument(
            "--payload",
            metavar="JSON",
            help=f"The payload as a JSON object, for example {EXAMPLE}.",
        )
        parser.add_argument(
            "--payload-file",
            metavar="PATH",
            help="Read the payload (a JSON object) from this file; - reads standard input.",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--background",
            dest="background",
            action="store_const",
            const=True,
            default=None,
            help="Hand the rest of the run to a Celery worker and return at once (status "
            "pending). Default: the interrupt's resume= setting.",
        )
        mode.add_argument(
            "--inline",
            dest="background",
            action="store_const",
            const=False,
            help="Run the rest of the run in this process and print how it ended. Default: "
            "the interrupt's resume= setting.",
        )
        add_reason(parser, "you deliver this payload")
        parser.add_argument(
            "--idempotency-key",
            metavar="KEY",
            help="Make the delivery safe to repeat: running the command again with the same "
            "key and payload changes nothing and prints the run's outcome; the same key with "
            "another payload is refused.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the outcome as one JSON object (execution_id, status, "
            "idempotent_replay, and value, error, step, reason or interrupts when the run has "
            "them).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        execution_id = options["execution_id"]
        fields = list(options["fields"] or [])
        if execution_id is not None and "=" in execution_id:
            # No execution id (--correlation-id): the first pair landed in its place.
            fields.insert(0, execution_id)
            execution_id = None
        correlation_id = options["correlation_id"]
        reactor = options["reactor"]
        if execution_id is None and correlation_id is None:
            raise CommandError(
                "name the run to resume: give its execution id, or --correlation-id ID"
            )
        if execution_id is not None and correlation_id is not None:
            raise CommandError(
                f"give the execution id ({execution_id}) or --correlation-id "
                f"({correlation_id}), not both"
            )
        if reactor is not None and correlation_id is None:
            raise CommandError(
                "--reactor only narrows a --correlation-id lookup; drop it when you give an "
                "execution id"
            )
        if reactor is not None:
            reactor = reactor_name(reactor)
        if execution_id is not None:
            execution_id = expand_execution_id(execution_id)
        payload = self._payload(options, fields)

        target = (
            f"execution {execution_id}" if execution_id else f"correlation id {correlation_id!r}"
        )
        try:
            outcome = services.resume_interrupt(
                execution_id,
                step=options["step"],
                payload=payload,
                correlation_id=correlation_id,
                reactor=reactor,
                background=options["background"],
                idempotency_key=options["idempotency_key"],
                reason=options["reason"],
            )
            outcome = services.shown_outcome(outcome)
        except InvalidPayload as exc:
            raise CommandError(self._invalid_payload(exc)) from exc
        except InterruptNotFound as exc:
            hint = ""
            if "name the step" in str(exc):
                hint = " Pass --step with one of them."
            elif correlation_id is not None:
                hint = " Check the correlation id (and --reactor), or give the execution id."
            raise CommandError(f"cannot resume {target}: {sentence(exc)}{hint}") from exc
        except ExecutionNotFound as exc:
            raise CommandError(
                f"cannot resume: {sentence(exc)} Give the execution_id of the paused run's "
                "outcome, or name the run with --correlation-id."
            ) from exc
        except NotWaiting as exc:
            raise CommandError(f"cannot resume {target}: {sentence(exc)} Nothing changed.") from exc
        except AlreadyResumed as exc:
            where = f"'{execution_id}'" if execution_id else "'<execution id>'"
            raise CommandError(
                f"cannot resume {target}: {sentence(exc)} An interrupt takes exactly one "
                f"payload; services.find({where}) shows how the run went on."
            ) from exc
        except InterruptClosed as exc:
            raise CommandError(
                f"cannot resume {target}: {exc} (reason: {exc.reason}). The payload was not "
                "delivered; start a new run if the work is still needed."
            ) from exc
        except IdempotencyKeyReused as exc:
            raise CommandError(
                f"cannot resume {target}: {sentence(exc)} Nothing changed: give this payload "
                "a new --idempotency-key."
            ) from exc
        except ReactorNotRegistered as exc:
            raise CommandError(
                f"cannot resume {target}: {sentence(exc)} Run the command with the settings "
                "of the project that defines the reactor."
            ) from exc
        except TransactionActive as exc:
            raise CommandError(
                f"cannot resume {target} inline: {sentence(exc)} Or pass --background to let "
                "a worker run the rest."
            ) from exc
        except ReactorError as exc:  # DefinitionChanged, ExecutionBusy, a malformed key...
            raise CommandError(f"cannot resume {target}: {sentence(exc)}") from exc

        if options["json"]:
            self.stdout.write(dumps(outcome_data(outcome)))
        else:
            self._summary(outcome)

    # ------------------------------------------------------------------ arguments

    def _payload(self, options: Mapping[str, Any], fields: list[str]) -> dict[str, Any]:
        given = [
            form
            for form, present in (
                ("--payload", options["payload"] is not None),
                ("--payload-file", options["payload_file"] is not None),
                ("key=value pairs", bool(fields)),
            )
            if present
        ]
        if not given:
            raise CommandError(
                f"no payload given: pass --payload {EXAMPLE}, --payload-file PATH (- for "
                "standard input), or key=value pairs such as approved=true"
            )
        if len(given) > 1:
            raise CommandError(
                f"give the payload one way, not several (got {' and '.join(given)}): "
                "--payload, --payload-file or key=value pairs"
            )
        if fields:
            return parse_pairs(fields, example="approved=true note=hello")
        if options["payload"] is not None:
            return parse_object(options["payload"], "--payload", EXAMPLE)
        text, source = read_input(
            options["payload_file"],
            options.get("stdin"),
            what="the payload",
            option="--payload-file",
        )
        return parse_object(text, source, EXAMPLE)

    # ------------------------------------------------------------------ output

    def _invalid_payload(self, exc: InvalidPayload) -> str:
        lines = ["the payload is invalid; nothing was delivered:"]
        lines.extend(
            f"  {path or 'payload'}: {message}" for path, message in error_messages(exc.errors)
        )
        if exc.max_attempts is None:
            lines.append(f"Invalid attempts so far: {exc.attempts} (no limit).")
        else:
            lines.append(f"Invalid attempts: {exc.attempts} of {exc.max_attempts} allowed.")
        if exc.run_failed:
            lines.append(
                "That was the last attempt allowed: the run was undone and failed. Start a new "
                "run if the work is still needed."
            )
        else:
            lines.append("The run is still paused: fix the payload and run the command again.")
        return "\n".join(lines)

    def _summary(self, outcome: Outcome) -> None:
        style = status_style(self, outcome.status)
        if outcome.execution_id is None:
            # A repeated --idempotency-key whose first delivery has not finished yet.
            self.stdout.write(
                self.style.NOTICE(
                    "an earlier delivery with this idempotency key is still being processed; "
                    "run the command again shortly to see the outcome"
                )
            )
            return
        self.stdout.write(f"execution {outcome.execution_id}: " + style(outcome.status))
        if outcome.idempotent_replay:
            self.stdout.write(
                "  (this idempotency key was used before: nothing changed, this is the run as "
                "it stands)"
            )
        if isinstance(outcome, Completed):
            self.stdout.write(f"  value: {short_json(outcome.value, 200)}")
        elif isinstance(outcome, Failed):
            self.stdout.write(f"  error: {outcome.error}")
            for failure in outcome.error.rollback_failures:
                self.stdout.write(f"  could not {failure.action} {failure.step}: {failure.message}")
            if outcome.status == "failed" and not outcome.error.rollback_failures:
                self.stdout.write("  every completed step was undone")
        elif isinstance(outcome, Halted):
            self.stdout.write(f"  halted at {outcome.step}: {outcome.reason}")
        elif isinstance(outcome, Paused):
            self.stdout.write("  the payload was accepted; the run now waits at:")
            for pending in outcome.interrupts:
                self.stdout.write(f"    {describe_interrupt(pending)}")
            self.stdout.write(
                f"  resume it with: python manage.py reactor_resume {outcome.execution_id} "
                "--step STEP ..."
            )
        elif isinstance(outcome, Dispatched | Rescheduled):
            self.stdout.write("  the payload was accepted; a worker runs the rest")
        elif isinstance(outcome, InProgress):
            self.stdout.write(
                "  the payload was accepted; the run is already moving in another process, "
                "which runs the rest"
            )
        elif isinstance(outcome, Cancelled):
            self.stdout.write(f"  cancelled: {outcome.reason}")
        elif isinstance(outcome, Aborted) and outcome.error is not None:
            self.stdout.write(f"  aborted: {outcome.error}; undo() rolls back what completed")
