"""Emit an event from the command line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.exceptions import (
    InvalidEvent,
    ReactorError,
    ReactorNotRegistered,
    TransactionActive,
    UnknownEvent,
)
from django_reactor.management.commandtools import (
    ReactorCommand,
    dumps,
    parse_json,
    parse_pairs,
    read_input,
    sentence,
)

EXAMPLE = """'{"amount": 5}'"""

#: The ``Event.source`` of the events this command emits.
SOURCE = "command"


class Command(ReactorCommand):
    help = (
        "Emit an event: it is kept once per event id, given to the runs waiting for it "
        "(wait_for_event, matched on --key), and starts and cancels the runs whose reactors' "
        "Meta.triggers and Meta.cancel_on name it. Give the payload as JSON (--payload or "
        "--payload-file) or as key=value pairs; without one, the payload is null."
    )
    # call_command("reactor_emit", ..., payload_file="-", stdin=StringIO(...)) in tests.
    stealth_options = ("stdin",)

    intermixed_arguments = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "name",
            help="The event's name, as a reactor's wait_for_event() or on_event() declares it "
            "(such as charge.refunded).",
        )
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
        parser.add_argument(
            "--payload-file",
            metavar="PATH",
            help="Read the payload (any JSON) from this file; - reads standard input.",
        )
        parser.add_argument(
            "--key",
            metavar="KEY",
            help="What wait_for_event(match=...) and Meta.cancel_on compare, such as an order "
            "id. Without it, only the waits without match take the event.",
        )
        parser.add_argument(
            "--event-id",
            metavar="ID",
            help="Make the emit safe to repeat: the same id again (with the same key and "
            "payload) does nothing new; with another key or payload it is refused. Default: "
            "a new id.",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print what the event did as one JSON object."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        payload = self._payload(options, list(options["fields"] or []))
        try:
            emitted = services.emit(
                name, payload, key=options["key"], event_id=options["event_id"], source=SOURCE
            )
        except UnknownEvent as exc:
            raise CommandError(
                f"cannot emit {name!r}: {sentence(exc)} Nothing was kept. Run the command with "
                "the settings of the project that defines the reactors."
            ) from exc
        except InvalidEvent as exc:
            raise CommandError(f"cannot emit {name!r}: {sentence(exc)} Nothing was kept.") from exc
        except ReactorNotRegistered as exc:
            raise CommandError(
                f"cannot emit {name!r}: {sentence(exc)} Run the command with the settings of "
                "the project that defines the reactor."
            ) from exc
        except TransactionActive as exc:
            raise CommandError(
                f"cannot emit {name!r}: {sentence(exc)} A wait_for_event(resume='inline') run "
                "goes on in this process: run the command outside a transaction."
            ) from exc
        except ReactorError as exc:
            raise CommandError(f"cannot emit {name!r}: {sentence(exc)}") from exc

        if options["json"]:
            self.stdout.write(
                dumps(
                    {
                        "name": emitted.name,
                        "event_id": emitted.event_id,
                        "replay": emitted.replay,
                        "started": [str(run) for run in emitted.started],
                        "given": [str(run) for run in emitted.given],
                        "resumed": [str(run) for run in emitted.resumed],
                        "cancelled": [str(run) for run in emitted.cancelled],
                        "errors": list(emitted.errors),
                    }
                )
            )
        else:
            self._summary(emitted)
        if emitted.errors:
            raise CommandError(
                f"event {emitted.event_id} of {name!r} was kept, but not all it matches could "
                "be done (see above). Emitting it again with the same --event-id does nothing "
                "new: fix the cause, then emit a new event.",
                returncode=1,
            )

    # ------------------------------------------------------------------ arguments

    def _payload(self, options: Mapping[str, Any], fields: list[str]) -> Any:
        given = [
            form
            for form, present in (
                ("--payload", options["payload"] is not None),
                ("--payload-file", options["payload_file"] is not None),
                ("key=value pairs", bool(fields)),
            )
            if present
        ]
        if len(given) > 1:
            raise CommandError(
                f"give the payload one way, not several (got {' and '.join(given)}): "
                "--payload, --payload-file or key=value pairs"
            )
        if fields:
            return parse_pairs(fields, example="amount=5 note=hello")
        if options["payload"] is not None:
            return parse_json(options["payload"], "--payload", EXAMPLE)
        path = options["payload_file"]
        if path is None:
            return None  # an event may be its name and key alone
        text, source = read_input(
            path, options.get("stdin"), what="the payload", option="--payload-file"
        )
        return parse_json(text, source, EXAMPLE)

    # ------------------------------------------------------------------ output

    def _summary(self, emitted: services.Emitted) -> None:
        if emitted.replay:
            self.stdout.write(
                f"event {emitted.event_id} of {emitted.name!r}: emitted before with this id; "
                "nothing new was done"
            )
        else:
            self.stdout.write(f"event {emitted.event_id} of {emitted.name!r}: emitted")
        parts = (
            ("started", emitted.started),
            ("given to", emitted.given),
            ("resumed", emitted.resumed),
            ("cancelled", emitted.cancelled),
        )
        for label, runs in parts:
            if runs:
                self.stdout.write(f"  {label}: {', '.join(str(run) for run in runs)}")
        for error in emitted.errors:
            self.stdout.write(f"  not done: {error}")
        if not emitted.replay and not any(runs for _label, runs in parts) and not emitted.errors:
            self.stdout.write(
                "  no run waited for it, started on it or was cancelled by it; it is kept for "
                "the waits that look back"
            )
