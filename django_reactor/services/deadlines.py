"""Runs past their deadline while they wait: the sweeper stops them.

A running run checks its deadline before every step (the executor). A run that waits is
stopped by the sweeper: a run parked (a retry's backoff, a sleep, an async unit, a map) or
scheduled is woken at its deadline (its wake-up time is never later, see the executor) and
stops when a worker resumes it; a run paused at an interrupt, or suspended by an operator's
pause, is taken here (its interrupts are closed) and rolls back or halts (``Meta.on_deadline``)
as if its next step had found the deadline passed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import registry, store
from ..conf import reactor_settings
from ..engine.state import RunState
from ..exceptions import ExecutionBusy, InvalidTransition, ReactorNotRegistered
from ..runtime import executors
from ..states import ExecutionStatus

if TYPE_CHECKING:
    from ..models import Execution

logger = logging.getLogger("django_reactor.services")


def expire_deadlines(limit: int | None = None) -> int:
    """Stop every paused or suspended run whose deadline passed; return how many. Run by the
    sweeper."""
    stopped = 0
    for row in store.paused_past_deadline(limit or reactor_settings.SWEEP_BATCH):
        try:
            _stop(row)
        except (InvalidTransition, ExecutionBusy, ReactorNotRegistered) as exc:
            logger.warning("could not stop execution %s at its deadline: %s", row.id, exc)
            continue
        stopped += 1
    return stopped


def _stop(row: Execution) -> None:
    definition = registry.of_run(row.reactor, row.version).definition
    owned = store.claim(
        row.id,
        allowed=[ExecutionStatus.PAUSED, ExecutionStatus.SUSPENDED],
        new_status=ExecutionStatus.RUNNING,
        owner=store.lease_owner_token(),
        action="stop at its deadline",
    )
    state = RunState.restore(definition, store.run_records(row))
    executor = executors.for_operation(definition, owned, row, state, deadline=row.deadline_at)
    waiting = [s.name for s in definition.steps if s.name in state.waiting]
    store.pauses.forget_run_pause(row.id)  # it ends here: its pause has nothing left to hold
    with store.LeaseKeeper(owned):
        executor.deadline_passed(waiting[0] if waiting else "")
