"""The one place that builds executors for runs kept in the database.

Each process that runs part of a stored run gets its executor here, assembled the same way:
the run's journal (``store.DatabaseJournal``), its child runner, its coordinator (a composed
child shares its root's locks), its observers, and the :class:`~..engine.context.RunPolicy`
of the process:

- :func:`for_caller`: the process that called ``run()`` runs a new run inline, until its
  background hand-off point;
- :func:`for_deliverer`: the process that delivered an interrupt's payload runs the rest
  inline;
- :func:`for_worker`: a worker goes on from the last checkpoint, parking instead of waiting;
- :func:`for_child`: a composed child, run by its parent's process;
- :func:`for_operation`: an operator's or the sweeper's operation on a stopped run (undo,
  failing a paused run, stopping it at its deadline).

A map's elements run in memory (``Executor.in_memory``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .. import store
from ..conf import reactor_settings
from ..coordination.coordinator import coordinator_for
from ..engine.context import RunPolicy
from ..engine.executor import Executor
from ..engine.serialization import JSONValue, decode
from ..engine.state import RunState
from ..observability import observer_for
from .children import DatabaseChildRunner
from .connections import reconnect

if TYPE_CHECKING:
    from ..engine.definition import ReactorDefinition
    from ..models import Execution


def for_caller(
    definition: ReactorDefinition,
    owned: store.Owned,
    inputs: Mapping[str, object],
    *,
    deadline: dt.datetime | None,
    subject: str = "",
) -> Executor:
    """The executor of a new run in the process that called ``run()`` (``subject``: the
    run's, whose key seals its secrets)."""
    run_id = owned.execution_id
    return _assemble(
        definition,
        # A new run: no step has a record.
        store.DatabaseJournal(owned, recorded=set(), subject=subject),
        inputs,
        RunState(next_seq=2),
        _inline_policy(deadline, hand_off=True),
        run_id=run_id,
        root_id=run_id,
        parent_id=None,
        coordination_owner=run_id,
        in_worker=False,
    )


def for_deliverer(
    definition: ReactorDefinition, owned: store.Owned, run: Execution, state: RunState
) -> Executor:
    """The executor of a run the deliverer of its interrupt's payload goes on with inline (it
    ran past its hand-off point already, or never had one)."""
    return _for_stored(
        definition,
        owned,
        run,
        state,
        _inline_policy(run.deadline_at, hand_off=False),
        in_worker=False,
    )


def for_worker(
    definition: ReactorDefinition, owned: store.Owned, run: Execution, state: RunState
) -> Executor:
    """The executor of a run a worker took (``run``: the row as the claim left it)."""
    policy = RunPolicy(
        retry_later=True,
        # The unit's completion wakes the parked run; this is only the net under a lost task.
        park_poll=reactor_settings.REDISPATCH_AFTER,
        issue_tokens=reactor_settings.RESUME_TOKENS,
        hand_back_on_interruption=True,
        step_timeout=reactor_settings.STEP_TIMEOUT,
        publish_max_bytes=reactor_settings.PUBLISH_MAX_BYTES,
        deadline=run.deadline_at,
    )
    return _for_stored(definition, owned, run, state, policy, in_worker=True)


def for_operation(
    definition: ReactorDefinition,
    owned: store.Owned,
    run: Execution,
    state: RunState,
    *,
    deadline: dt.datetime | None = None,
) -> Executor:
    """The executor of an operation on a stopped run this process took (an undo, failing a
    paused run; ``deadline``: stopping it at its deadline)."""
    return _for_stored(
        definition,
        owned,
        run,
        state,
        RunPolicy(deadline=deadline, publish_max_bytes=reactor_settings.PUBLISH_MAX_BYTES),
        in_worker=False,
    )


def for_child(
    definition: ReactorDefinition,
    owned: store.Owned,
    inputs: JSONValue,
    state: RunState,
    *,
    parent_id: uuid.UUID,
    root_id: uuid.UUID,
    in_worker: bool,
    deadline: dt.datetime | None,
) -> Executor:
    """The executor of a composed child, run by its parent's process (``in_worker``: a
    worker's); it shares its root's locks and slots (re-entrant), never its rate limits,
    periods or ordered-lock place."""
    policy = RunPolicy(
        attached=True,
        park_poll=reactor_settings.REDISPATCH_AFTER,
        issue_tokens=reactor_settings.RESUME_TOKENS,
        step_timeout=reactor_settings.STEP_TIMEOUT,
        publish_max_bytes=reactor_settings.PUBLISH_MAX_BYTES,
        deadline=deadline,
    )
    if in_worker:  # it parks with its parent, as the worker's run does
        policy = dataclasses.replace(policy, retry_later=True)
    else:  # it waits in the process, as its inline parent does
        policy = dataclasses.replace(
            policy,
            max_retry_delay=reactor_settings.MAX_INLINE_RETRY_DELAY,
            max_concurrency=store.side_by_side_limit(),
        )
    return _assemble(
        definition,
        store.DatabaseJournal(owned, recorded=state.recorded),
        decode(inputs),
        state,
        policy,
        run_id=owned.execution_id,
        root_id=root_id,
        parent_id=parent_id,
        coordination_owner=root_id,
        in_worker=in_worker,
    )


def _inline_policy(deadline: dt.datetime | None, *, hand_off: bool) -> RunPolicy:
    return RunPolicy(
        hand_off=hand_off,
        issue_tokens=reactor_settings.RESUME_TOKENS,
        max_retry_delay=reactor_settings.MAX_INLINE_RETRY_DELAY,
        max_concurrency=store.side_by_side_limit(),
        step_timeout=reactor_settings.STEP_TIMEOUT,
        publish_max_bytes=reactor_settings.PUBLISH_MAX_BYTES,
        deadline=deadline,
    )


def _for_stored(
    definition: ReactorDefinition,
    owned: store.Owned,
    run: Execution,
    state: RunState,
    policy: RunPolicy,
    *,
    in_worker: bool,
) -> Executor:
    """The executor of a stored run, restored to ``state``."""
    composed = run.parent_id is not None and not run.detached
    return _assemble(
        definition,
        store.DatabaseJournal(
            owned,
            # An async unit wakes its parent (perhaps parked on it) when it finishes.
            wakes=run.parent_id if run.detached else None,
            recorded=state.recorded,
            subject=run.subject,
        ),
        decode(run.inputs),
        state,
        policy,
        run_id=run.id,
        root_id=run.root_id or run.id,
        parent_id=run.parent_id,
        # A composed child shares its root's locks; a root run or an async unit owns its own.
        coordination_owner=(run.root_id or run.parent_id or run.id) if composed else run.id,
        in_worker=in_worker,
    )


def _assemble(
    definition: ReactorDefinition,
    journal: store.DatabaseJournal,
    inputs: Mapping[str, object],
    state: RunState,
    policy: RunPolicy,
    *,
    run_id: uuid.UUID,
    root_id: uuid.UUID,
    parent_id: uuid.UUID | None,
    coordination_owner: uuid.UUID,
    in_worker: bool,
) -> Executor:
    return Executor(
        definition,
        journal,
        inputs=inputs,
        state=state,
        policy=dataclasses.replace(policy, reconnect=reconnect(), continues=parent_id is None),
        children=DatabaseChildRunner(
            run_id, root_id, in_worker=in_worker, deadline=policy.deadline, build=for_child
        ),
        observer=observer_for(definition, parent_id=parent_id),
        coordinator=coordinator_for(
            definition,
            execution_id=run_id,
            owner_id=coordination_owner,
            inputs=inputs,
            in_worker=in_worker,
        ),
    )
