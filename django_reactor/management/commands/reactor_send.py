"""Send a message to a run's mailbox from the command line."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.engine.outcomes import InProgress, outcome_data
from django_reactor.exceptions import (
    ExecutionNotFound,
    IdempotencyKeyReused,
    InvalidMessage,
    InvalidTransition,
    ReactorError,
    ReactorNotRegistered,
    TransactionActive,
    UnknownTopic,
)
from django_reactor.management.commandtools import (
    ReactorCommand,
    dumps,
    expand_execution_id,
    outcome_lines,
    parse_pairs,
    sentence,
    status_style,
)

EXAMPLE = """'{"amount": 5}'"""


class Command(ReactorCommand):
    help = (
        "Send a message to a run on a topic: it is kept in the run's mailbox until a "
        "receive(topic) step of the run takes it (in send order per topic, each exactly once). "
        "A run paused at such a step goes on now. Give the payload as JSON (--payload) or as "
        "key=value pairs."
    )

    intermixed_arguments = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "execution_id",
            help="The id of the run (the execution_id of its outcome, or its first 8 or more "
            "characters).",
        )
        parser.add_argument("topic", help="The topic a receive() step of the run takes.")
        parser.add_argument(
            "fields",
            nargs="*",
            metavar="key=value",
            help="Build the payload (an object) from pairs: each value is read as JSON when it "
            "parses (amount=5 is a number, note=hello the string 'hello').",
        )
        parser.add_argument(
            "--payload",
            metavar="JSON",
            help=f"The payload as JSON (any value), for example {EXAMPLE}.",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--background",
            dest="background",
            action="store_const",
            const=True,
            default=None,
            help="A run paused at the receive goes on on a Celery worker. Default: the "
            "receive's resume= setting.",
        )
        mode.add_argument(
            "--inline",
            dest="background",
            action="store_const",
            const=False,
            help="A run paused at the receive goes on in this process. Default: the receive's "
            "resume= setting.",
        )
        parser.add_argument(
            "--idempotency-key",
            metavar="KEY",
            help="Make the send safe to repeat: the same key and message again keeps nothing "
            "new; the same key with another message is refused.",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print the outcome as one JSON object."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        execution_id = expand_execution_id(options["execution_id"])
        topic = options["topic"]
        payload = self._payload(options)
        target = f"execution {execution_id}"
        try:
            outcome = services.shown_outcome(
                services.send(
                    execution_id,
                    topic,
                    payload,
                    idempotency_key=options["idempotency_key"],
                    background=options["background"],
                )
            )
        except UnknownTopic as exc:
            raise CommandError(f"cannot send to {target}: {sentence(exc)}") from exc
        except ExecutionNotFound as exc:
            raise CommandError(
                f"cannot send: {sentence(exc)} Give the execution_id of a run's outcome; "
                "reactor_list lists the stored runs."
            ) from exc
        except InvalidMessage as exc:
            raise CommandError(
                f"cannot send to {target}: {sentence(exc)} Nothing was kept."
            ) from exc
        except IdempotencyKeyReused as exc:
            raise CommandError(
                f"cannot send to {target}: {sentence(exc)} Nothing changed: give this message "
                "a new --idempotency-key."
            ) from exc
        except InvalidTransition as exc:
            raise CommandError(
                f"cannot send to {target}: {sentence(exc)} Nothing was kept."
            ) from exc
        except ReactorNotRegistered as exc:
            raise CommandError(
                f"cannot send to {target}: {sentence(exc)} Run the command with the settings "
                "of the project that defines the reactor."
            ) from exc
        except TransactionActive as exc:
            raise CommandError(
                f"cannot send to {target}: {sentence(exc)} Or pass --background."
            ) from exc
        except ReactorError as exc:
            raise CommandError(f"cannot send to {target}: {sentence(exc)}") from exc

        if options["json"]:
            self.stdout.write(dumps(outcome_data(outcome)))
            return
        self.stdout.write(
            f"execution {outcome.execution_id}: "
            + status_style(self, outcome.status)(outcome.status)
        )
        if isinstance(outcome, InProgress):
            self.stdout.write(f"  kept: the run takes it at a receive({topic!r}) step")
        else:
            for line in outcome_lines(outcome):
                self.stdout.write(line)

    def _payload(self, options: dict[str, Any]) -> Any:
        fields = list(options["fields"] or [])
        raw = options["payload"]
        if raw is not None and fields:
            raise CommandError("give the payload one way, not both --payload and key=value pairs")
        if fields:
            return parse_pairs(fields, example="amount=5 note=hello")
        if raw is None:
            raise CommandError(
                f"no payload given: pass --payload {EXAMPLE} or key=value pairs such as amount=5"
            )
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CommandError(
                f"--payload is not valid JSON ({exc.msg} at line {exc.lineno} column "
                f"{exc.colno}); pass JSON such as {EXAMPLE}"
            ) from None
