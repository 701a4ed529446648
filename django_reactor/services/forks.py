"""Forking a run from a step: fixing forward after a bad deploy.

A fork is a new run, linked to the one it re-runs (``retry_of``, ``fork_step``), that reuses
the recorded results of the steps the original completed before ``from_step`` (their bodies
never run again) and runs the rest with the code deployed now. Completed steps of the original
past the cut whose effects stand (the abandoned branch) are undone first, newest first, by the
original's ordinary undo, once the caller confirms (``undo_abandoned=True``); :func:`fork_plan`
shows what a fork would do without writing anything. See ``engine.forks`` for which steps are
carried.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from .. import registry, store
from ..engine.constructs.map import MapRollbackPending
from ..engine.forks import ForkPlan, plan_fork
from ..engine.outcomes import Dispatched, Outcome
from ..engine.serialization import decode
from ..engine.state import RunState
from ..exceptions import InvalidFork, InvalidInputs, InvalidTransition, LeaseLost
from ..runtime import executors
from ..states import ExecutionStatus
from . import audit
from .databases import across_databases
from .guards import refuse_child, refuse_open_transaction
from .interrupts import after_pause
from .runs import validated_inputs

logger = logging.getLogger("django_reactor.services")

#: Runs that can be forked: those that ended (or need a person). A run still moving is
#: cancelled (or undone) first.
FORKABLE = (
    ExecutionStatus.COMPLETED,
    ExecutionStatus.FAILED,
    ExecutionStatus.HALTED,
    ExecutionStatus.CANCELLED,
    ExecutionStatus.NEEDS_ATTENTION,
)


@across_databases
def fork_plan(execution_id: uuid.UUID | str, from_step: str) -> ForkPlan:
    """What :func:`fork` would do, written nowhere: the steps carried, the completed steps it
    would undo first (newest first), those it runs again, and warnings. Raises as ``fork``
    does for a run that cannot be forked (but not ForkNeedsUndo)."""
    row = store.get_row(execution_id)
    refuse_child(row, "fork")
    _refuse_moving(row.id, row.status)
    definition = registry.of_run(row.reactor, row.version).definition
    return plan_fork(definition, store.run_records(row), _step_name(from_step))


@across_databases
def fork(
    execution_id: uuid.UUID | str,
    from_step: str,
    *,
    inputs: Mapping[str, Any] | None = None,
    undo_abandoned: bool = False,
    reason: str = "",
) -> Outcome:
    """Run a stopped run again from ``from_step`` as a new run (see the module).

    ``reason``: why (kept, with who asked, on both runs' traces and in the steering history).
    ``inputs``: the new run's inputs (validated by the reactor's ``Inputs``; InvalidInputs,
    nothing written, when they fail); the original's by default. A run is re-run (retried or
    forked) at most once (AlreadyRetried): fork the fork to go again. Raises ForkNeedsUndo,
    with the plan, when the original has effects past the cut and ``undo_abandoned`` is false;
    InvalidFork when ``from_step`` is not a step of the reactor; InvalidTransition for a run
    still moving.

    The fork runs in this process when its reactor has no ``Meta.background`` (as ``retry``),
    else on a worker. With an abandoned branch to undo, that undo runs here first (a map's
    elements on workers); the fork waits, suspended, until it has ended.
    """
    steering = audit.steering("fork", reason=reason)
    row = store.get_row(execution_id)
    refuse_child(row, "fork")
    _refuse_moving(row.id, row.status)
    definition = registry.of_run(row.reactor, row.version).definition
    step = _step_name(from_step)
    # Checked before anything is written (the store works the plan out again under the lock).
    plan = plan_fork(definition, store.run_records(row), step)
    if plan.needs_undo and row.status == ExecutionStatus.FAILED:  # pragma: no cover - defensive
        raise InvalidFork(f"execution {row.id} failed and cannot be undone")
    stored_inputs = _inputs(definition, row, inputs)
    decoded = decode(stored_inputs)
    subject = store.subject_keys.check_subject(
        definition.subject_of(decoded), f"the fork of {row.id}"
    )
    if subject != row.subject and plan.carried:
        raise InvalidFork(
            f"the fork's inputs belong to another subject ({subject!r}, not {row.subject!r}): "
            "the carried steps hold secrets sealed for the original's; fork with its inputs"
        )
    background = definition.background is not None
    if not background or plan.needs_undo:
        refuse_open_transaction(f"fork execution {row.id}")
    owner = store.lease_owner_token()
    forked = store.forks.create_fork(
        row.id,
        plan_of=lambda records: plan_fork(definition, records, step),
        forkable=FORKABLE,
        undo_abandoned=undo_abandoned,
        definition_hash=definition.definition_hash,
        version=definition.version,
        definition_shape=definition.shape,
        inputs=stored_inputs,
        secret_paths=definition.input_secret_paths,
        subject=subject,
        next_step=lambda done: _next(definition, done),
        background=background,
        owner=owner,
        steering=steering,
    )
    if forked.original is not None:
        _undo_abandoned(definition, forked)
        if not _release(forked.fork_id, background=background, owner=owner):
            return store.outcome_of(store.get_row(forked.fork_id))
        if background:
            return Dispatched(execution_id=forked.fork_id)
        return _run_here(definition, store.forks.take_waiting_fork(forked.fork_id, owner))
    if forked.fork is None:
        return Dispatched(execution_id=forked.fork_id)
    return _run_here(definition, forked.fork)


def release_waiting_forks(limit: int) -> int:
    """Release the forks whose original has ended the undo of its abandoned branch since (the
    process that forked them stopped before it could); the sweeper's part. How many."""
    released = 0
    for fork_id in store.forks.waiting_forks(limit):
        _, done = store.pauses.unpause_run(fork_id, steering=None)
        released += done
    return released


def _refuse_moving(execution_id: uuid.UUID, status: str) -> None:
    if status not in FORKABLE:
        raise InvalidTransition(
            f"cannot fork execution {execution_id}: it is {status}; fork works on runs that "
            f"ended ({', '.join(FORKABLE)}): cancel or undo it first",
            status=status,
        )


def _step_name(from_step: Any) -> str:
    if not isinstance(from_step, str) or not from_step:
        raise InvalidFork(f"the step to fork from must be a step's name, got {from_step!r}")
    return from_step


def _next(definition: Any, done: frozenset[str]) -> str:
    following = definition.next_ready(done)
    return following.name if following is not None else ""


def _inputs(definition: Any, row: Any, inputs: Mapping[str, Any] | None) -> Any:
    """The fork's inputs as stored: the original's (opened: the fork seals them again), or
    ``inputs`` validated by the reactor's ``Inputs``."""
    if inputs is None:
        return store.secrets.opened(row.inputs)
    if not isinstance(inputs, Mapping):
        raise InvalidFork(f"a fork's inputs are a dict, got {type(inputs).__name__}")
    stored, error = validated_inputs(definition, inputs)
    if error is not None:
        raise InvalidInputs(error.message, errors=error.field_errors)
    return stored


def _undo_abandoned(definition: Any, forked: store.forks.Forked) -> None:
    """Undo the original's abandoned branch (its carried steps are marked: they stay)."""
    assert forked.original is not None
    row = store.get_row(forked.original.execution_id)
    state = RunState.restore(
        definition, store.run_records(row, for_rollback=True), for_rollback=True
    )
    executor = executors.for_operation(definition, forked.original, row, state)
    reason = (
        f"forked as {forked.fork_id} from step {forked.plan.from_step}: the steps past it are "
        "undone"
    )
    # A map's elements are undone on workers: the run parks, and the sweeper releases the
    # fork once its undo has ended.
    with store.LeaseKeeper(forked.original), contextlib.suppress(MapRollbackPending):
        executor.finish_rollback(reason)


def _release(fork_id: uuid.UUID, *, background: bool, owner: str) -> bool:
    """Whether the fork may go on now (its original's undo ended cleanly): released to a
    worker when ``background``; left for this process to take otherwise."""
    original = store.get_row(fork_id).retry_of_id
    status = store.status_of(original) if original is not None else None
    if status is None or not store.forks.fork_release_due(status):
        logger.warning(
            "fork %s waits: its original %s is %s after undoing its abandoned branch",
            fork_id,
            original,
            status,
        )
        return False
    if background:
        store.pauses.unpause_run(fork_id, steering=None)
    return True


def _run_here(definition: Any, owned: store.Owned) -> Outcome:
    """Run a fork in this process from its carried records."""
    row = store.get_row(owned.execution_id)
    state = RunState.restore(definition, store.run_records(row))
    executor = executors.for_deliverer(definition, owned, row, state)
    try:
        with store.LeaseKeeper(owned):
            return after_pause(executor.run())
    except LeaseLost:
        logger.warning("fork %s was taken over by another process", owned.execution_id)
        return store.outcome_of(store.get_row(owned.execution_id))
