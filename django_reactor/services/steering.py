"""Stopping a run (``cancel``) and rolling one back (``undo``)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from typing import TYPE_CHECKING

from .. import registry, store
from ..engine.constructs.map import MapRollbackPending
from ..engine.state import RunState
from ..exceptions import (
    DefinitionChanged,
    ExecutionBusy,
    ExecutionNotFound,
    InvalidTransition,
)
from ..handle import ExecutionHandle
from ..runtime import executors
from ..states import ExecutionStatus, sources_of
from . import audit, flow
from .audit import check_reason
from .databases import across_databases
from .guards import refuse_child, refuse_open_transaction
from .handles import find, handle_of

if TYPE_CHECKING:
    from ..engine.actors import Steering
    from ..models import Execution

# A running run qualifies only once its process is gone (lease expired); a live one is asked
# to stop after its current step.
CANCELLABLE = tuple(sorted(sources_of(ExecutionStatus.CANCELLED)))

logger = logging.getLogger("django_reactor.services")


@across_databases
def cancel(execution_id: uuid.UUID | str, *, reason: str = "") -> ExecutionHandle:
    """Stop a run without rolling anything back (use :func:`undo` to roll back).

    A run that a live process is executing is asked to stop after its current step.
    ``reason`` (shown in the trace, the admin and the API) must be text the database can store.
    Recorded with who asked (the current actor, ``django_reactor.engine.actors``) on the trace
    and in the steering history; so are the composed children and async units it stops.
    """
    check_reason(reason, "cancel")
    row = store.get_row(execution_id)
    refuse_child(row, "cancel")
    return _cancel(row, audit.steering("cancel", reason=reason).on(row.id, row.reactor))


def _cancel(row: Execution, steering: Steering) -> ExecutionHandle:
    reason = steering.reason or "cancelled"
    store.request_cancel(row.id, reason=reason, cancellable=CANCELLABLE, steering=steering)
    handle = find(row.id)
    if handle.status == ExecutionStatus.CANCELLED:
        store.maps.stop_all(row.id, "cancelled")  # its fanned-out elements not started never start
        store.pauses.forget_run_pause(row.id)  # it will not go on
        if row.status != ExecutionStatus.QUEUED:  # it held its key's slot: the next may start
            flow.released(row.reactor, row.concurrency_key)
    _cancel_descendants(row.id, reason, steering)
    return handle


def _cancel_descendants(execution_id: uuid.UUID, reason: str, steering: Steering) -> None:
    """Cancelling a run reaches what it started that has not finished: composed children and
    async units (and theirs) are cancelled the same way (at once, or after the step they are
    in), their fanned-out map elements not started never start. Nothing is rolled back: an
    async unit keeps what it completed (units own their rollback: undo it by its id)."""
    for child_id in store.unfinished_descendants(execution_id):
        try:
            store.request_cancel(
                child_id,
                reason=f"its parent run was cancelled ({reason})",
                cancellable=CANCELLABLE,
                steering=steering.on(child_id, store.get_row(child_id).reactor).noting(
                    cancelled_with=str(execution_id)
                ),
            )
        except (InvalidTransition, ExecutionBusy, ExecutionNotFound) as exc:
            logger.warning("cancelling %s's child %s: %s", execution_id, child_id, exc)
            continue
        if store.status_of(child_id) == ExecutionStatus.CANCELLED:
            store.maps.stop_all(child_id, "cancelled")


@across_databases
def wake(execution_id: uuid.UUID | str, *, reason: str = "") -> ExecutionHandle:
    """ "Wake now": end a run's sleep now, or start a scheduled run now (a worker takes it).

    Raises InvalidTransition for a run that waits for no time (it is not sleeping, scheduled or
    waiting for a retry's backoff). Recorded with who asked and ``reason`` (a ``steer`` entry
    on the trace, and the steering history).
    """
    check_reason(reason, "wake")
    row = store.get_row(execution_id)
    refuse_child(row, "wake")
    if row.status not in (ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED) or (
        row.wake_at is None
    ):
        raise InvalidTransition(
            f"cannot wake execution {row.id}: it is {row.status} and waits for no time (only a "
            "sleeping, scheduled or backing-off run can be woken)",
            status=row.status,
        )
    steering = audit.steering("wake", reason=reason).on(row.id, row.reactor)
    if not store.start_now(row.id, steering=steering):
        raise InvalidTransition(
            f"cannot wake execution {row.id}: a worker has just taken it",
            status=store.status_of(row.id),
        )
    return find(row.id)


# Running and rolling-back runs qualify only when their process is gone: claim() refuses a live
# lease with ExecutionBusy.
UNDOABLE = tuple(sorted(sources_of(ExecutionStatus.ROLLING_BACK)))


@across_databases
def undo(execution_id: uuid.UUID | str, *, reason: str = "") -> ExecutionHandle:
    """Roll back every completed step of a finished run, newest first; then it is cancelled.

    Works on completed, halted, aborted (a cut-off compensate runs first), cancelled and
    needs-attention runs (rollback steps that failed are tried again), and on running or
    rolling-back runs whose process died (their lease expired). Undoing a run with nothing left
    to undo changes nothing. A run that had a failing step ends ``failed``; others ``cancelled``.
    Recorded with who asked and ``reason`` (on the ``rollback`` entry, and the steering
    history); an undo that changes nothing records nothing.
    """
    check_reason(reason, "undo")
    row = store.get_row(execution_id)
    refuse_child(row, "undo")
    reactor = registry.of_run(row.reactor, row.version)
    if row.status not in UNDOABLE:
        raise InvalidTransition(
            f"cannot undo execution {row.id}: it is {row.status}; undo works on "
            f"{', '.join(UNDOABLE)} runs",
            status=row.status,
        )
    definition = reactor.definition
    state = RunState.restore(
        definition, store.run_records(row, for_rollback=True), for_rollback=True
    )
    steering = audit.steering("undo", reason=reason).on(row.id, row.reactor)
    if not state.rollback_due and not state.abandoned:
        if row.status == ExecutionStatus.PAUSED:
            return _cancel(
                row,
                dataclasses.replace(
                    steering, reason=reason or "undone while paused (nothing to roll back)"
                ),
            )
        return handle_of(row)
    problems = definition.incompatibilities(store.stored_shape(row), state.recorded)
    if problems:
        raise DefinitionChanged(
            f"cannot undo execution {row.id}: {reactor.__qualname__} changed since it ran "
            f"({'; '.join(problems)}); deploy the definition it ran with to undo it"
        )
    refuse_open_transaction(f"undo execution {row.id}")
    owned = store.claim(
        row.id,
        allowed=UNDOABLE,
        new_status=ExecutionStatus.ROLLING_BACK,
        owner=store.lease_owner_token(),
        action="undo",
        steering=steering,
    )
    # Read again under ownership; what the run stopped doing is what it did before the claim.
    state = RunState.restore(
        definition, store.run_records(row, for_rollback=True), for_rollback=True
    )
    executor = executors.for_operation(definition, owned, row, state)
    # While workers undo a map's elements the run parks; it finishes its rollback after.
    with store.LeaseKeeper(owned), contextlib.suppress(MapRollbackPending):
        executor.finish_rollback(reason or "undo requested", note=steering.actor.as_data())
    return find(row.id)
