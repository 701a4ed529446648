"""Roll back finished runs from the command line."""

from __future__ import annotations

from typing import Any

from django_reactor import services
from django_reactor.management.commandtools import SteeringCommand, styled


class Command(SteeringCommand):
    help = (
        "Roll back every completed step of each run, newest first, in this process; the run "
        "then ends cancelled (failed when a step had failed). Works on completed, halted, "
        "aborted, cancelled, paused and needs-attention runs, and on running or rolling-back "
        "runs whose process died. Give one or more execution ids; each is reported, and the "
        "command fails at the end if any could not be undone."
    )
    action = "undo"
    done = "undone"

    def operate(
        self, execution_id: str, options: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        handle = services.undo(execution_id, reason=options["reason"])
        lines = [f"execution {handle.id}: " + styled(self, handle.status)]
        error = handle.error
        failures = error.rollback_failures if error is not None else ()
        for failure in failures:
            lines.append(f"  could not {failure.action} {failure.step}: {failure.message}")
        if failures:
            lines.append("  fix the cause, then run reactor_undo again to retry those steps")
        return {
            "execution_id": str(handle.id),
            "status": handle.status,
            "rollback_failures": [failure.to_dict() for failure in failures],
        }, lines
