"""The checkpoint: everything one state change of an owned run writes, in one transaction,
conditional on the run's fence (the executor's :class:`~django_reactor.engine.journal.Journal`).

On PostgreSQL a routine checkpoint (and a park that queues no task) is one statement (the
dialect's ``checkpoint``: ``checkpoint_sql``); checkpoints that also queue a task or reach an
interrupt, or complete a run by continuing it as new (its successor is written in the same
transaction: ``continuation``), and every checkpoint of the generic store, write the same rows
through the ORM here. ``tests/integration/test_checkpoint_paths.py`` proves that both paths
write the same rows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..engine.journal import UNSET, JournalBatch, RunRecords, StopRequest
from ..exceptions import CorrelationIdTaken, LeaseLost
from ..models import Execution, ExecutionEvent, Interrupt, StepRecord
from ..states import ExecutionStatus, RollbackStatus
from . import attributes as run_attributes
from . import audit, dialects, patches, trace
from . import events as event_rows
from .atomic_steps import DatabaseStepTransaction
from .continuation import create_successor
from .db import close_thread_connections, reconnecting, using
from .executions import new_event_rows, wake_parent
from .interrupts import close_waiting, waiting_for_correlation
from .lease import note_heartbeat
from .outbox import announce_finished, announce_progress, queue_dispatch
from .pauses import pause_for, pause_request
from .reads import get_row, run_records, subject_of
from .rows import Owned
from .secrets import Sealer

if TYPE_CHECKING:
    from ..engine.serialization import JSONObject, JSONValue


class DatabaseJournal:
    """Commits the executor's batches for one owned run (see :class:`engine.journal.Journal`)."""

    def __init__(
        self,
        owned: Owned,
        *,
        dialect: dialects.Dialect | None = None,
        wakes: uuid.UUID | None = None,
        recorded: set[str] | None = None,
        subject: str | None = None,
    ) -> None:
        self.execution_id = owned.execution_id
        # The run's subject, whose key seals its secrets (None: read when a secret is first
        # written; a run without secrets never reads it).
        self._subject = subject
        self.fence = owned.fence
        # Where the run's tasks go (None: read when they are published).
        self.route = owned.route
        # The steps with a record, when the caller knows them (a new run: none; a claimed run:
        # those the claim read), kept up to date here: a step without one is inserted without
        # first looking for a record to replace. None: unknown, always look.
        self.recorded = None if recorded is None else set(recorded)
        # An async unit: when it finishes, its parent (perhaps parked on it) is woken.
        self.wakes = wakes
        # The store's, unless a test compares the generic store's writes with it.
        self.dialect = dialects.dialect() if dialect is None else dialect

    @functools.cached_property
    def reactor(self) -> str:
        """The run's reactor name (read once, for the rare writes that need it)."""
        return str(
            Execution.objects.using(using())
            .filter(pk=self.execution_id)
            .values_list("reactor", flat=True)
            .get()
        )

    @functools.cached_property
    def created_at(self) -> dt.datetime:
        """The run's creation time (read once, for the attributes its steps set)."""
        return (
            Execution.objects.using(using())
            .filter(pk=self.execution_id)
            .values_list("created_at", flat=True)
            .get()
        )

    @functools.cached_property
    def sealer(self) -> Sealer:
        """Seals the run's secrets (made when the first is written)."""
        subject = self._subject
        return Sealer(subject_of(self.execution_id) if subject is None else subject)

    def sealed(self, batch: JournalBatch) -> JournalBatch:
        """``batch`` with its secrets sealed: those of the step's arguments and result, and of
        the run's value. Only a batch that holds secrets is copied; routine ones are left."""
        step = batch.step
        if step is not None and (step.secret_arguments or step.secret_result):
            sealer = self.sealer
            step = dataclasses.replace(
                step,
                arguments=cast("JSONObject", sealer.sealed(step.arguments, step.secret_arguments)),
                result=sealer.sealed(step.result, step.secret_result),
            )
            batch = dataclasses.replace(batch, step=step)
        if batch.result_secrets and batch.result is not UNSET:
            batch = dataclasses.replace(
                batch, result=self.sealer.sealed(batch.result, batch.result_secrets)
            )
        return batch

    def begin(self, step: str, action: str) -> DatabaseStepTransaction:
        """Open the transaction of an atomic step's ``action`` (see :mod:`.atomic_steps`)."""
        return DatabaseStepTransaction(
            step, action, Owned(self.execution_id, self.fence, self.route), dialect=self.dialect
        )

    def thread_finished(self) -> None:
        close_thread_connections()

    def read(self, *, for_rollback: bool = False) -> RunRecords:
        """What the run's records hold now (see ``reads.run_records``)."""
        return run_records(get_row(self.execution_id), for_rollback=for_rollback)

    def patch_decisions(self) -> dict[str, bool]:
        """The run's patch decisions (``patches.decisions``)."""
        return patches.decisions(self.execution_id)

    def decide_patch(self, name: str, taken: bool, step: str) -> bool:
        """Record the run's decision unless it has one; the one recorded (``patches.decide``).
        Committed at once (in an atomic step, with the step's transaction: both or neither)."""
        return patches.decide(self.execution_id, name, taken, step)

    def heartbeat(self, step: str, details: JSONValue) -> None:
        """Kept for the run's next lease extension (see ``lease.note_heartbeat``)."""
        note_heartbeat(self.execution_id, step, details)

    def ensure_owned(self) -> None:
        """The run's fence is still this journal's, or ``LeaseLost`` (one read, reconnecting
        when the connection is lost again)."""
        runs = Execution.objects.using(using()).filter(pk=self.execution_id, fence=self.fence)
        if not reconnecting(runs.exists, what=f"reading execution {self.execution_id}'s fence"):
            raise LeaseLost(
                f"execution {self.execution_id} was taken over by another process while this "
                f"process's database connection was lost (fence {self.fence} was superseded); "
                "stopping without running its step again"
            )

    def cancel_requester(self) -> dict[str, str]:
        """Who asked to cancel the run, from the steering history (``audit.cancel_requester``)."""
        return audit.cancel_requester(self.execution_id)

    def commit(self, batch: JournalBatch) -> StopRequest | None:
        if batch.result_secrets or (
            batch.step is not None and (batch.step.secret_arguments or batch.step.secret_result)
        ):
            batch = self.sealed(batch)
        if (
            self.dialect.one_statement_checkpoint
            and batch.parks_quietly
            and not (self.wakes and batch.finished)
        ):
            asked = self._commit_one_statement(batch)
        else:
            asked = self._commit_orm(batch)
        if batch.step is not None and self.recorded is not None:
            self.recorded.add(batch.step.step)
        return asked

    # -- one statement, where the dialect has it ---------------------------------------------------

    def _commit_one_statement(self, batch: JournalBatch) -> StopRequest | None:
        step = batch.step
        new_step = step is not None and self.recorded is not None and step.step not in self.recorded
        row = self.dialect.checkpoint(self.execution_id, self.fence, batch, new_step=new_step)
        if row is None:
            raise LeaseLost(
                f"execution {self.execution_id} is no longer owned by this process "
                f"(fence {self.fence} was superseded); stopping without writing"
            )
        cancel_requested_at, reason, pause = row
        if cancel_requested_at is not None:
            return _asked(cancel_requested_at, reason)
        return pause_request(pause) if pause else None

    # -- any database: the ORM ---------------------------------------------------------------------

    def _commit_orm(self, batch: JournalBatch) -> StopRequest | None:
        now = timezone.now()
        fields: dict[str, Any] = {"updated_at": now}
        if batch.finished:
            fields.update(lease_owner=None, lease_expires_at=None, finished_at=now)
        if batch.current_step is not None:
            fields["current_step"] = batch.current_step
        if batch.status is not None:
            fields["status"] = batch.status
        if batch.result is not UNSET:
            fields["result"] = batch.result
        if batch.failure is not UNSET:
            fields["failure"] = batch.failure
        if batch.release:
            fields.update(lease_owner=None, lease_expires_at=None)
        if batch.expire_lease:
            fields["lease_expires_at"] = now
        if batch.handed_off:
            fields["handed_off"] = True
        if batch.current_attempt is not None:
            fields["current_attempt"] = batch.current_attempt
        if batch.interrupt is not None and batch.interrupt.correlation_id is not None:
            fields["correlation_id"] = batch.interrupt.correlation_id  # the latest one reached
        if batch.wake_after is not None:
            fields["wake_at"] = now + dt.timedelta(seconds=batch.wake_after)
        elif batch.step is not None:
            fields.update(current_attempt=0, wake_at=None)
        try:
            return self._commit_orm_fields(batch, fields)
        except IntegrityError:
            if batch.interrupt is None or batch.interrupt.correlation_id is None:
                raise
            holder = waiting_for_correlation(self.reactor, batch.interrupt.correlation_id)
            if holder is None:
                raise
            raise CorrelationIdTaken(
                f"correlation id {batch.interrupt.correlation_id!r} is taken by execution {holder}",
                correlation_id=batch.interrupt.correlation_id,
                execution_id=holder,
            ) from None

    def _write_step(self, step: str, values: dict[str, Any]) -> None:
        """Insert the step's record, or replace it; a replaced record that stood for a trace
        entry leaves that entry as an event row first (the trace stays append-only)."""
        records = StepRecord.objects.using(using())
        record = records.filter(execution_id=self.execution_id, step=step).first()
        if record is None:
            records.create(execution_id=self.execution_id, step=step, **values)
            return
        if record.traced:
            trace.entry_of(record).save(using=using(), force_insert=True)
        for name, value in values.items():
            setattr(record, name, value)
        record.save(using=using(), update_fields=list(values))

    def _merge_published(self, published: Mapping[str, Any]) -> None:
        """Merge a step's published values into the run's (its row is locked by the update)."""
        row = Execution.objects.using(using()).filter(pk=self.execution_id)
        current = row.values_list("published", flat=True).get() or {}
        row.update(published={**current, **published})

    def _commit_orm_fields(self, batch: JournalBatch, fields: dict[str, Any]) -> StopRequest | None:
        with transaction.atomic(using=using()):
            owned = Execution.objects.using(using()).filter(pk=self.execution_id, fence=self.fence)
            if not owned.update(**fields):
                raise LeaseLost(
                    f"execution {self.execution_id} is no longer owned by this process "
                    f"(fence {self.fence} was superseded); stopping without writing"
                )
            step = batch.step
            entry, events = trace.folded(step, batch.events)
            if step is not None:
                self._write_step(
                    step.step,
                    {
                        "status": step.status,
                        "seq": step.seq,
                        "attempts": step.attempts,
                        "arguments": step.arguments,
                        "secret_arguments": [list(p) for p in step.secret_arguments],
                        "result": step.result,
                        "error": step.error,
                        "compensable": step.compensable,
                        "rollback": RollbackStatus.NONE,
                        "rollback_error": None,
                        "rolled_back_at": None,
                        "started_at": step.started_at,
                        "finished_at": step.finished_at,
                        "traced": entry is not None,
                        "duration_ms": entry.duration_ms if entry is not None else None,
                    },
                )
            if batch.published:
                self._merge_published(batch.published)
            if batch.attributes:
                run_attributes.write(self.execution_id, self.created_at, batch.attributes)
            if batch.published or batch.status == ExecutionStatus.PAUSED:
                announce_progress(self.execution_id)  # to whoever follows the run's stream
            if batch.close_interrupts:
                close_waiting(self.execution_id, stop_children=batch.finished)
            reached = batch.interrupt
            if reached is not None:
                if reached.event is not None:
                    event_rows.reach(self.execution_id, reached.step, reached.event)
                Interrupt.objects.using(using()).create(
                    execution_id=self.execution_id,
                    reactor=self.reactor,
                    step=reached.step,
                    correlation_id=reached.correlation_id,
                    expires_at=reached.expires_at,
                    max_attempts=reached.max_attempts,
                    resume_mode=reached.resume_mode,
                    token_hash=reached.token_hash,
                    event_name=reached.event.name if reached.event is not None else None,
                    event_key=reached.event.key if reached.event is not None else None,
                )
            rollback = batch.rollback
            if rollback is not None:
                StepRecord.objects.using(using()).filter(
                    execution_id=self.execution_id, step=rollback.step
                ).update(
                    rollback=rollback.status,
                    rollback_error=rollback.error,
                    rolled_back_at=rollback.at,
                )
            if events:
                ExecutionEvent.objects.using(using()).bulk_create(
                    new_event_rows(self.execution_id, events)
                )
            if batch.dispatch is not None:
                queue_dispatch(
                    self.execution_id, batch.dispatch, batch.dispatch_delay, route=self.route
                )
            if batch.successor is not None:
                # The run completes by continuing as new: its successor commits with it.
                create_successor(self.execution_id, batch.successor)
            if self.wakes is not None and batch.finished:
                wake_parent(self.wakes)
                announce_finished(self.execution_id, str(batch.status or ""))
            requested_at, reason, parent_id, reactor = (
                Execution.objects.using(using())
                .filter(pk=self.execution_id)
                .values_list("cancel_requested_at", "cancel_reason", "parent_id", "reactor")
                .get()
            )
            asked = _asked(requested_at, reason)
            if asked is None:
                asked = pause_for(reactor, self.execution_id, parent_id=parent_id)
        return asked


def _asked(requested_at: Any, reason: str) -> StopRequest | None:
    """An operator's cancel request, as the engine's request, or None."""
    if requested_at is None:
        return None
    return StopRequest("cancel", reason or "cancelled by an operator")
