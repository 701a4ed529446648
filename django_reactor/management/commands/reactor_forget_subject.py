"""Forget a subject: delete its data key, so its runs' secrets can never be read again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services
from django_reactor.exceptions import ReactorError
from django_reactor.management.commandtools import ReactorCommand, add_reason, dumps, iso


class Command(ReactorCommand):
    help = (
        "Forget a subject (the value of a reactor's Meta.subject, e.g. a customer id): its "
        "data key is deleted, so the secrets of every run of that subject can never be read "
        "again (crypto-shredding). The runs stay and still show in the admin, the API and "
        "reactor_show, their secrets shown as [ERASED]; a run that needs one of them to go on "
        "fails saying the subject was erased. Running it again changes nothing. There is no "
        "undo."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("subject", help="The subject to forget, as its runs store it.")
        add_reason(parser, "the subject is forgotten (an erasure request's reference)")
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print one JSON object (subject, erased, erased_at, runs) instead of a sentence.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        subject = options["subject"]
        try:
            forgotten = services.forget_subject(subject, reason=options["reason"])
        except ReactorError as exc:
            raise CommandError(f"cannot forget {subject!r}: {exc}") from exc
        if options["json"]:
            self.stdout.write(
                dumps(
                    {
                        "subject": forgotten.subject,
                        "erased": forgotten.erased,
                        "erased_at": iso(forgotten.erased_at),
                        "runs": forgotten.runs,
                    }
                )
            )
        elif forgotten.erased:
            self.stdout.write(
                f"subject {subject!r} forgotten: its key is deleted, the secrets of its "
                f"{forgotten.runs} run(s) can never be read again (they show as [ERASED])"
            )
        elif forgotten.erased_at is not None:
            self.stdout.write(
                f"subject {subject!r} was forgotten already on "
                f"{forgotten.erased_at:%Y-%m-%d %H:%M:%S %Z}; nothing changed"
            )
        else:
            self.stdout.write(
                f"subject {subject!r} has no key (no run of it stored a secret, or the name is "
                f"misspelt: {forgotten.runs} run(s) have this subject); nothing changed"
            )
