"""Seal every stored secret again with the first of REACTOR["ENCRYPTION_KEYS"]."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services, store
from django_reactor.exceptions import ReactorError
from django_reactor.management.commandtools import ReactorCommand, dumps, positive_int


class Command(ReactorCommand):
    help = (
        "Seal every stored secret again with the first key of REACTOR['ENCRYPTION_KEYS'] (or "
        "the key derived from SECRET_KEY when that list is empty): secrets sealed with an older "
        "key, secrets stored in clear by runs written before secrets were sealed, and the "
        "subjects' data keys. It works in batches of --batch-size rows, each row updated only "
        "if no run changed it meanwhile, so it is safe while workers run, and running it again "
        "changes nothing. Put the new key first and keep the old ones after it; once this "
        "command has finished everywhere, the old keys can be removed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            metavar="N",
            type=positive_int,
            default=500,
            help="Read and write at most N rows of a table at a time (default 500).",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print one JSON object at the end (scanned, rotated, sealed, keys, "
            "changed_meanwhile, unreadable) instead of progress lines.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def progress(done: store.rotation.Progress) -> None:
            if not options["json"]:
                self.stdout.write(
                    f"{done.table}: {done.scanned} row(s) read, {done.rotated} secret(s) "
                    f"sealed again, {done.sealed} sealed from clear, {done.keys} subject key(s) "
                    "encrypted again"
                )

        try:
            done = services.rotate_keys(batch_size=options["batch_size"], progress=progress)
        except ReactorError as exc:
            raise CommandError(f"cannot rotate the keys: {exc}") from exc
        data = {
            "scanned": done.scanned,
            "rotated": done.rotated,
            "sealed": done.sealed,
            "keys": done.keys,
            "changed_meanwhile": done.changed_meanwhile,
            "unreadable": done.unreadable,
        }
        if options["json"]:
            self.stdout.write(dumps(data))
        else:
            self.stdout.write(
                f"done: {done.rotated} secret(s) sealed again with the first key, {done.sealed} "
                f"sealed from clear, {done.keys} subject key(s) encrypted again; "
                f"{done.changed_meanwhile} row(s) changed by a run meanwhile (written with the "
                "first key already)"
            )
        if done.unreadable:
            raise CommandError(
                f"{done.unreadable} secret(s) or subject key(s) could not be decrypted with any "
                "configured key and were left as they are: the key that sealed them was "
                "removed. Put it back after the first key and run reactor_rotate_keys again "
                "before removing it."
            )
