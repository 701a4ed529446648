"""Cancel runs from the command line (no rollback)."""

from __future__ import annotations

from typing import Any

from django_reactor import services
from django_reactor.management.commandtools import SteeringCommand, styled
from django_reactor.states import ExecutionStatus


class Command(SteeringCommand):
    help = (
        "Cancel runs without rolling anything back (reactor_undo rolls back). A pending, "
        "paused, aborted or needs-attention run is cancelled at once; a run a live process is "
        "executing is asked to stop after its current step. Give one or more execution ids; "
        "each is reported, and the command fails at the end if any could not be cancelled."
    )
    action = "cancel"
    done = "cancelled"
    default_reason = " (default: 'cancelled')"

    def operate(
        self, execution_id: str, options: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        handle = services.cancel(execution_id, reason=options["reason"])
        lines = [f"execution {handle.id}: " + styled(self, handle.status)]
        requested = handle.status != ExecutionStatus.CANCELLED
        if requested:
            lines.append(
                "  a live process is running it: it stops after its current step (cancel "
                "requested); reactor_show shows when it did"
            )
        return {
            "execution_id": str(handle.id),
            "status": handle.status,
            "cancel_requested": requested,
        }, lines
