"""Running composed children durably: each child is an execution of its own, linked to its parent.

The parent's executor calls :class:`DatabaseChildRunner` for a ``compose()`` step. After a crash
the parent runs that step again; the runner then finds the child it already started and
continues it from its checkpoint instead of starting another.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Protocol

from django.utils import timezone

from .. import registry, store
from ..conf import reactor_settings
from ..coordination.coordinator import guard_dispatch
from ..engine.constructs.interrupt import reached_interrupts
from ..engine.constructs.map import MapRollbackPending
from ..engine.definition import ReactorDefinition
from ..engine.executor import Executor, utcnow
from ..engine.journal import Event
from ..engine.outcomes import Outcome, Paused, Rescheduled, RollbackFailure
from ..engine.serialization import JSONObject, JSONValue, decode, encode
from ..engine.state import RunState
from ..exceptions import ReactorError, UnitWaitTimeout
from ..states import EventKind, ExecutionStatus
from . import wakeups
from .maps import MapRunnerMixin

FINISHED = (
    ExecutionStatus.ABORTED,
    ExecutionStatus.COMPLETED,
    ExecutionStatus.HALTED,
    ExecutionStatus.FAILED,
    ExecutionStatus.NEEDS_ATTENTION,
    ExecutionStatus.CANCELLED,
)


def _reached(executor: Executor, outcome: Outcome) -> Outcome:
    """A child that paused tells its parent the interrupts it reached in this call (those it
    waited at before are in the parent's record already)."""
    if not isinstance(outcome, Paused):
        return outcome
    reached = reached_interrupts(executor)
    return dataclasses.replace(
        outcome, interrupts=tuple(i for i in outcome.interrupts if i.step in reached)
    )


class ChildExecutors(Protocol):
    """What builds a composed child's executor (``runtime.executors.for_child``)."""

    def __call__(
        self,
        definition: ReactorDefinition,
        owned: store.Owned,
        inputs: JSONValue,
        state: RunState,
        *,
        parent_id: uuid.UUID,
        root_id: uuid.UUID,
        in_worker: bool,
        deadline: dt.datetime | None,
    ) -> Executor: ...


class DatabaseChildRunner(MapRunnerMixin):
    """Runs and rolls back the composed children and the maps of one parent execution."""

    def __init__(
        self,
        parent_id: uuid.UUID,
        root_id: uuid.UUID,
        *,
        in_worker: bool = False,
        deadline: dt.datetime | None = None,
        build: ChildExecutors,
    ) -> None:
        # How a composed child's executor is built (``runtime.executors.for_child``).
        self.build = build
        self.parent_id = parent_id
        self.root_id = root_id
        # The parent's deadline: its children (composed, async units) inherit what is left.
        self.deadline = deadline
        # On a worker, a composed child parks (with its parent) instead of sleeping or waiting.
        self.in_worker = in_worker

    def _create(
        self, step: str, definition: ReactorDefinition, stored: JSONObject, *, detached: bool
    ) -> store.Owned:
        """Write the child execution (a detached one pending, with its dispatch). Its secrets
        are its subject's (``Meta.subject``), else its parent's: forgetting a subject erases
        them in the runs it started too."""
        first = definition.next_ready(frozenset())
        subject = ""
        if definition.has_secrets:
            subject = definition.subject_of(decode(stored)) or store.subject_of(self.parent_id)
        return store.create_execution(
            reactor=definition.name,
            definition_hash=definition.definition_hash,
            version=definition.version,
            definition_shape=definition.shape,
            inputs=stored,
            secret_paths=definition.input_secret_paths,
            subject=store.subject_keys.check_subject(subject, f"a run of {definition.name}"),
            has_secrets=definition.has_secrets,
            status=ExecutionStatus.PENDING if detached else ExecutionStatus.RUNNING,
            owner=None,
            parent=(self.parent_id, self.root_id, step),
            detached=detached,
            dispatch="start" if detached else None,
            current_step=first.name if first is not None else "",
            events=[Event(1, EventKind.START, utcnow(), data={"parent_step": step})],
            deadline_at=self.deadline,
            attributes=definition.attributes_of(decode(stored)),
            # A child goes where its parent goes unless its reactor says otherwise.
            route=definition.route()
            if definition.queue is not None and definition.priority is not None
            else definition.route(inherited=store.route_of(self.parent_id)),
        )

    def run(
        self, step: str, definition: ReactorDefinition, inputs: Mapping[str, object]
    ) -> Outcome:
        row = store.find_child(self.parent_id, step)
        if row is None:
            stored = encode(dict(inputs))
            try:
                owned = self._create(step, definition, stored, detached=False)
            except store.ChildExists:
                row = store.find_child(self.parent_id, step)
            else:
                executor = self._executor(definition, owned, stored, RunState(next_seq=2))
                return _reached(executor, executor.run())
        assert row is not None
        if row.status in FINISHED:
            return store.outcome_of(row, opened=True)
        owned = store.adopt_child(row.id, continuing=row.status != ExecutionStatus.ROLLING_BACK)
        # Still moving: the process that ran it with its parent stopped inside it.
        taken_over = row.status in (ExecutionStatus.RUNNING, ExecutionStatus.ROLLING_BACK)
        state = RunState.restore(definition, store.run_records(row, taken_over=taken_over))
        executor = self._executor(definition, owned, row.inputs, state)
        if state.rolling_back:
            try:
                executor.finish_rollback("rollback resumed with its parent")
            except MapRollbackPending as pending:
                return Rescheduled(
                    execution_id=row.id,
                    step=pending.step,
                    delay=reactor_settings.REDISPATCH_AFTER,
                    reason="map_rollback",
                )
            return store.outcome_of(store.get_row(row.id), opened=True)
        return _reached(executor, executor.run())

    def accepted(self, step: str) -> tuple[str, ...] | None:
        row = store.find_child(self.parent_id, step)
        if row is None or row.status != ExecutionStatus.PAUSED:
            return ()  # it moved on (its process died while it ran): continue it
        return tuple(store.interrupts.accepted_below(row.id)) or None

    def rollback(self, step: str) -> list[RollbackFailure]:
        row = store.find_child(self.parent_id, step)
        if row is None:
            return []  # the child never started
        definition = registry.of_run(row.reactor, row.version).definition
        state = RunState.restore(definition, store.run_records(row))
        if not state.undo_stack and not state.pending_compensation:
            if row.status == ExecutionStatus.PAUSED:  # paused before it completed anything
                store.request_cancel(
                    row.id, reason="its parent rolled back", cancellable=[ExecutionStatus.PAUSED]
                )
            return []
        owned = store.adopt_child(row.id)
        executor = self._executor(definition, owned, row.inputs, state)
        return executor.finish_rollback("its parent rolled back")

    def dispatch(
        self, step: str, definition: ReactorDefinition, inputs: Mapping[str, object]
    ) -> uuid.UUID:
        existing = store.find_child(self.parent_id, step)
        if existing is not None:
            return existing.id  # dispatched before a crash: never twice
        guard_dispatch(definition, inputs, holder_id=self.root_id)
        try:
            owned = self._create(step, definition, encode(dict(inputs)), detached=True)
        except store.ChildExists:
            row = store.find_child(self.parent_id, step)
            assert row is not None
            return row.id
        return owned.execution_id

    def settle(self, step: str, *, wait: bool) -> Outcome | None:
        row = store.find_child(self.parent_id, step)
        if row is None:
            raise ReactorError(f"async unit {step!r} of execution {self.parent_id} is missing")
        if row.status in FINISHED:
            return store.outcome_of(row, opened=True)
        waited = (timezone.now() - row.created_at).total_seconds()
        if not wait:
            limit = reactor_settings.ASYNC_PARK_TIMEOUT
            if waited > limit:
                raise UnitWaitTimeout(
                    f"async unit {step!r} (execution {row.id}) has not finished after "
                    f"{waited:.0f} s (REACTOR['ASYNC_PARK_TIMEOUT'] is {limit:.0f} s)"
                )
            return None
        timeout = reactor_settings.ASYNC_WAIT_TIMEOUT
        done = wakeups.wait(
            row.id,
            lambda: store.get_row(row.id).status in FINISHED,
            timeout=timeout,
            poll=reactor_settings.ASYNC_POLL_INTERVAL,
        )
        if not done:
            raise UnitWaitTimeout(
                f"async unit {step!r} (execution {row.id}) did not finish within {timeout:g} s "
                "(REACTOR['ASYNC_WAIT_TIMEOUT']); is a Celery worker running?"
            )
        return store.outcome_of(store.get_row(row.id), opened=True)

    def _executor(
        self, definition: ReactorDefinition, owned: store.Owned, inputs: JSONValue, state: RunState
    ) -> Executor:
        return self.build(
            definition,
            owned,
            inputs,
            state,
            parent_id=self.parent_id,
            root_id=self.root_id,
            in_worker=self.in_worker,
            deadline=self.deadline,
        )
