"""Wake runs that wait for a time, now: end a sleep, start a scheduled run."""

from __future__ import annotations

from typing import Any

from django_reactor import services
from django_reactor.management.commandtools import SteeringCommand, styled


class Command(SteeringCommand):
    help = (
        "Wake runs that wait for a time, now: a sleeping run's sleep ends, a scheduled run "
        "starts, a run waiting for a retry's backoff is due; a worker takes each at once. Give "
        "one or more execution ids; each is reported, and the command fails at the end if any "
        "could not be woken (it waits for no time, or a worker has just taken it)."
    )
    action = "wake"
    done = "woken"

    def operate(
        self, execution_id: str, options: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        handle = services.wake(execution_id, reason=options["reason"])
        lines = [
            f"execution {handle.id}: " + styled(self, handle.status) + " (woken: a worker "
            "takes it now)"
        ]
        return {"execution_id": str(handle.id), "status": handle.status, "woken": True}, lines
