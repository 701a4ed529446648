"""Stopping a run (``cancel``) and rolling one back (``undo``)."""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING, Any

from .. import registry, store
from ..engine.executor import Executor, RunState, UndoEntry
from ..engine.mapping import MapRollbackPending
from ..engine.outcomes import (
    ErrorKind,
)
from ..engine.serialization import decode, safe_repr, unstorable
from ..exceptions import (
    DefinitionChanged,
    ExecutionBusy,
    InvalidTransition,
    ReactorError,
)
from ..handle import ExecutionHandle
from ..runtime.children import DatabaseChildRunner, finish_rollback
from ..states import ExecutionStatus, sources_of

if TYPE_CHECKING:
    from ..engine.definition import ReactorDefinition


from .common import (
    coordinator_of,
    find,
    handle_of,
    logger,
    observer_of,
    refuse_child,
    refuse_open_transaction,
)

# A running run qualifies only once its process is gone (lease expired); a live one is asked
# to stop after its current step.
CANCELLABLE = tuple(sorted(sources_of(ExecutionStatus.CANCELLED)))


def cancel(execution_id: uuid.UUID | str, *, reason: str = "") -> ExecutionHandle:
    """Stop a run without rolling anything back (use :func:`undo` to roll back).

    A run that a live process is executing is asked to stop after its current step.
    ``reason`` (shown in the trace, the admin and the API) must be text the database can store.
    """
    if not isinstance(reason, str) or (why := unstorable(reason)) is not None:
        detail = "it is not a string" if not isinstance(reason, str) else why
        raise ReactorError(f"cannot cancel with the reason {safe_repr(reason)}: {detail}")
    row = store.get_row(execution_id)
    refuse_child(row, "cancel")
    store.request_cancel(row.id, reason=reason or "cancelled", cancellable=CANCELLABLE)
    handle = find(row.id)
    if handle.status == ExecutionStatus.CANCELLED:
        store.maps.stop_all(row.id, "cancelled")  # its fanned-out elements not started never start
    _cancel_descendants(row.id, reason or "cancelled")
    return handle


def _cancel_descendants(execution_id: uuid.UUID, reason: str) -> None:
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
            )
        except (InvalidTransition, ExecutionBusy) as exc:
            logger.warning("cancelling %s's child %s: %s", execution_id, child_id, exc)
            continue
        if store.status_of(child_id) == ExecutionStatus.CANCELLED:
            store.maps.stop_all(child_id, "cancelled")


def wake(execution_id: uuid.UUID | str) -> ExecutionHandle:
    """ "Wake now": end a run's sleep now, or start a scheduled run now (a worker takes it).

    Raises InvalidTransition for a run that waits for no time (it is not sleeping, scheduled or
    waiting for a retry's backoff).
    """
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
    if not store.start_now(row.id):
        raise InvalidTransition(
            f"cannot wake execution {row.id}: a worker has just taken it",
            status=store.status_of(row.id),
        )
    return find(row.id)


# Running and rolling-back runs qualify only when their process is gone: claim() refuses a live
# lease with ExecutionBusy.
UNDOABLE = tuple(sorted(sources_of(ExecutionStatus.ROLLING_BACK)))


def undo(execution_id: uuid.UUID | str) -> ExecutionHandle:
    """Roll back every completed step of a finished run, newest first; then it is cancelled.

    Works on completed, halted, aborted (a cut-off compensate runs first), cancelled and
    needs-attention runs (rollback steps that failed are tried again), and on running or
    rolling-back runs whose process died (their lease expired). Undoing a run with nothing left
    to undo changes nothing. A run that had a failing step ends ``failed``; others ``cancelled``.
    """
    row = store.get_row(execution_id)
    refuse_child(row, "undo")
    reactor = registry.get(row.reactor)
    if row.status not in UNDOABLE:
        raise InvalidTransition(
            f"cannot undo execution {row.id}: it is {row.status}; undo works on "
            f"{', '.join(UNDOABLE)} runs",
            status=row.status,
        )
    state = rollback_state(row, reactor.definition)
    abandoned = abandoned_while_running(row)
    if not state.undo_stack and not state.pending_compensation and not abandoned:
        if row.status == ExecutionStatus.PAUSED:
            return cancel(row.id, reason="undone while paused (nothing to roll back)")
        return handle_of(row)
    problems = reactor.definition.incompatibilities(store.stored_shape(row), state.recorded)
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
    )
    state = rollback_state(row, reactor.definition)  # read again under ownership
    inputs = decode(row.inputs)
    executor = Executor(
        reactor.definition,
        store.DatabaseJournal(owned),
        inputs=inputs,
        state=state,
        children=DatabaseChildRunner(row.id, row.id),
        observer=observer_of(reactor.definition, parent_id=row.parent_id),
        coordinator=coordinator_of(reactor.definition, row.id, row, inputs, in_worker=False),
    )
    in_flight = row.current_step
    in_flight_spec = reactor.definition.by_name.get(in_flight)
    if (
        abandoned
        and in_flight_spec is not None
        and in_flight_spec.map is None  # a map's elements say themselves what they did
        and in_flight not in state.recorded
    ):
        executor.adopt_in_flight(
            in_flight, "the process running this step stopped before recording its outcome"
        )
    if abandoned:
        adopt_side_by_side(executor, row.id, skip={in_flight})
    # While workers undo a map's elements the run parks; it finishes its rollback after.
    with store.LeaseKeeper(owned), contextlib.suppress(MapRollbackPending):
        finish_rollback(executor, row, "undo requested")
    return find(row.id)


def adopt_side_by_side(executor: Executor, execution_id: Any, *, skip: set[str]) -> None:
    """Steps started side by side (``Meta.max_concurrency``) that never recorded an outcome
    were in flight when the run's process stopped: each is compensated like the step the
    cursor names."""
    if executor.definition.max_concurrency < 2:
        return
    for name in store.launched_steps(execution_id):
        spec = executor.definition.by_name.get(name)
        if spec is not None and name not in skip and name not in executor.state.recorded:
            executor.adopt_in_flight(
                name, "the process running this step stopped before recording its outcome"
            )
            executor.state.recorded.add(name)


def rollback_state(row: Any, definition: ReactorDefinition) -> RunState:
    """What an undo must roll back: the run's state, plus a composed child or a map it stopped in.

    A parent that halted inside a child, or was parked (or stopped) while its child waited,
    has no record of the compose step; the child's own rollback undoes what it completed. The
    same holds for a map that halted, or that the run was waiting for: its completed elements
    are undone.
    """
    state = store.load_state(row.id)
    for name in store.halted_steps(row.id):
        spec = definition.by_name.get(name)
        if spec is not None and (spec.child is not None or spec.map is not None):
            state.undo_stack.append(UndoEntry(name, {}, None))
    current = row.current_step  # an undo's claim leaves the cursor where it was
    spec = definition.by_name.get(current)
    if (
        spec is not None
        and current not in state.recorded
        and (
            (spec.child is not None and store.find_child(row.id, current) is not None)
            or (spec.map is not None and store.maps.find(row.id, current) is not None)
        )
    ):
        state.undo_stack.append(UndoEntry(current, {}, None))
    return state


def abandoned_while_running(row: Any) -> bool:
    """Whether the step the run's cursor names may have started without recording an outcome.

    True for a run whose process died mid-step (still running or rolling back, cancelled while
    so, or parked after killing its workers too often), and for a step that made failed
    attempts and was waiting for its next one.
    """
    if row.status in (ExecutionStatus.RUNNING, ExecutionStatus.ROLLING_BACK):
        return True
    if row.current_attempt:
        return True
    if row.status == ExecutionStatus.NEEDS_ATTENTION:
        return bool(row.failure) and row.failure.get("kind") == ErrorKind.RECOVERY_LIMIT
    return row.status == ExecutionStatus.CANCELLED and store.cancelled_while_running(row.id)
