"""The generic store: what runs on any database Django supports (SQLite, MariaDB and MySQL,
...), through the ORM, one query at a time where PostgreSQL sends one statement.

Every operation whose best form depends on the database is a method of :class:`Dialect`;
:class:`~.postgresql.PostgreSQL` overrides those it does in hand-written SQL, writing the
same rows (``tests/integration/test_checkpoint_paths.py`` compares them on one database).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import Case, F, Model, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from ...conf import reactor_settings
from ...engine.journal import JournalBatch
from ...models import Definition, Execution, ExecutionEvent, FlowKey, MapChunk, StepRecord
from ...states import MOVING_STATUSES, ExecutionStatus, StepStatus
from .. import attributes as run_attributes
from .. import map_orm
from ..db import using
from ..map_reads import ChunkClaim, Settled, SlotWrite
from ..outbox import mark_taken, queue_dispatch
from ..pauses import pause_for
from ..reads import get_row, last_seq, run_records
from ..rows import Owned, WorkerClaim, route_of_row

Chunk = MapChunk.Status

#: A statement that reads the database server's clock, in seconds since the epoch, by vendor.
_CLOCKS = {
    # 'now' is stable within one statement: whole seconds plus the fraction of %f (ms).
    "sqlite": (
        "SELECT CAST(strftime('%s', 'now') AS REAL)"
        " + strftime('%f', 'now') - CAST(strftime('%S', 'now') AS INTEGER)"
    ),
    "mysql": "SELECT UNIX_TIMESTAMP(SYSDATE(6))",
}


class Dialect:
    """The generic ORM store of one database alias (:func:`~.dialect_for` picks it once).

    The store's operations (runs, claims, checkpoints, sleeps, map chunks) are called on the
    store's own dialect (``store.dialect()``, alias ``db.using()``) and write there, as the rest
    of the store does; the capabilities, the clock and the row estimate answer for the
    dialect's alias, which coordination's database backend and the admin may choose.
    """

    #: Whether a routine checkpoint goes out as one statement (:meth:`checkpoint`); otherwise
    #: ``DatabaseJournal`` writes every batch through the ORM.
    one_statement_checkpoint = False
    #: Whether an atomic step's transaction can bound each statement it sends
    #: (:meth:`bound_statements`); otherwise only the body's end is checked against the bound.
    bounds_statements = False
    #: Whether coordination's database backend may take, extend and release a lock in one
    #: statement each (its PostgreSQL statements: ``INSERT ... ON CONFLICT ... RETURNING`` on
    #: the server's ``clock_timestamp()``).
    one_statement_locks = False
    #: Whether many schedules' ticks may be recorded in one transaction, each of its
    #: statements sent once for the batch (``store.schedules.record_ticks``: ``UPDATE ...
    #: FROM (VALUES ...) RETURNING``); otherwise tick by tick.
    batches_ticks = False

    def __init__(self, alias: str) -> None:
        self.alias = alias
        #: The database's vendor, as Django names it (``"sqlite"``, ``"mysql"``, ...).
        self.name: str = connections[alias].vendor

    def __repr__(self) -> str:
        return f"<{type(self).__name__} store of {self.alias!r} ({self.name})>"

    @property
    def prepares_statements(self) -> bool:
        """Whether the store's statements go out prepared when
        ``REACTOR["CHECKPOINT_PREPARED_STATEMENTS"]`` is on (``sql.execute``)."""
        return False

    # -- runs --------------------------------------------------------------------------------------

    def holds_key_on_insert(self) -> bool:
        """Whether a run's insert can take its concurrency key's room in its own statement
        (``insert_run(hold_limit=...)``); otherwise the start decides under the key's lock."""
        return False

    def insert_run(
        self,
        execution: Execution,
        events: list[ExecutionEvent],
        dispatch: str | None,
        definition: Definition | None,
        delay: float,
        attributes: Mapping[str, str],
        *,
        may_conflict: bool = True,
        hold_limit: int | None = None,
    ) -> None:
        """Insert a new run with its first events, its dispatch (published ``delay`` seconds
        on), its definition (unless kept already) and its ``attributes`` (stored text by key),
        all or nothing; an ``IntegrityError`` when a unique key is taken
        (``executions.create_execution``). ``hold_limit``: see :meth:`holds_key_on_insert`
        (never given here)."""
        assert hold_limit is None, "this database decides on keys under their locks"
        with transaction.atomic(using=using()):
            if definition is not None:
                Definition.objects.using(using()).bulk_create([definition], ignore_conflicts=True)
            execution.save(force_insert=True, using=using())
            ExecutionEvent.objects.using(using()).bulk_create(events)
            if attributes:
                run_attributes.write(execution.id, execution.created_at, attributes)
            if dispatch is not None:
                queue_dispatch(execution.id, dispatch, delay, route=route_of_row(execution))

    def claim_ahead(
        self, execution_ids: Sequence[uuid.UUID], owner: str
    ) -> dict[uuid.UUID, WorkerClaim]:
        """``claims.claim_ahead``: here none is claimed ahead (each run's turn claims it with
        ``claim_for_worker``, the same claim in more statements)."""
        return {}

    def claim_for_worker(self, execution_id: uuid.UUID, owner: str) -> WorkerClaim | None:
        """``claims.claim_for_worker``: one conditional update, the run's dispatches marked
        taken, and the row read back."""
        now = timezone.now()
        # The recovery count before: the update below is made on that row only, so that a
        # count it raised says this claim took the run over (``RunRecords.taken_over``).
        before = (
            Execution.objects.using(using())
            .filter(pk=execution_id)
            .values_list("recovery_attempts", flat=True)
            .first()
        )
        if before is None:
            return None
        claimed = (
            Execution.objects.using(using())
            .filter(pk=execution_id, status__in=MOVING_STATUSES)  # claims.RESUMABLE
            .filter(recovery_attempts=before)
            .filter(Q(parent__isnull=True) | Q(detached=True))
            .filter(
                Q(lease_owner__isnull=True) | Q(lease_expires_at__lt=now) | Q(lease_owner=owner)
            )
            .filter(Q(wake_at__isnull=True) | Q(wake_at__lte=now))
            .update(
                # In this order: MariaDB and MySQL assign left to right, each expression seeing
                # the columns assigned before it, so what reads the row's status and owner
                # comes before they are assigned.
                recovery_attempts=Case(
                    When(status=ExecutionStatus.PENDING, then=F("recovery_attempts")),
                    When(lease_owner__isnull=True, then=F("recovery_attempts")),
                    When(lease_owner=owner, then=F("recovery_attempts")),
                    default=F("recovery_attempts") + 1,
                ),
                status=Case(
                    When(
                        status=ExecutionStatus.ROLLING_BACK,
                        then=Value(ExecutionStatus.ROLLING_BACK),
                    ),
                    default=Value(ExecutionStatus.RUNNING),
                ),
                lease_owner=owner,
                lease_expires_at=now + dt.timedelta(seconds=reactor_settings.LEASE_SECONDS),
                fence=F("fence") + 1,
                started_at=Coalesce(F("started_at"), Value(now)),
                wake_at=None,
                updated_at=now,
            )
        )
        mark_taken(execution_id=execution_id)
        if not claimed:
            return None
        row = get_row(execution_id)
        if row.lease_owner != owner:  # pragma: no cover - taken again in the blink between
            return None
        return WorkerClaim(
            Owned(execution_id, row.fence, route_of_row(row)),
            row,
            run_records(row, taken_over=row.recovery_attempts > before),
            pause=pause_for(row.reactor, row.id, parent_id=row.parent_id),
        )

    def checkpoint(
        self, execution_id: uuid.UUID, fence: int, batch: JournalBatch, *, new_step: bool
    ) -> tuple[Any, str, Any] | None:
        """A routine checkpoint in one statement, where :attr:`one_statement_checkpoint`."""
        raise NotImplementedError(f"{self!r} writes checkpoints through the ORM")

    def end_sleeps(self, due: Sequence[tuple[int, Any]], now: dt.datetime) -> int:
        """Write completed the sleeping records ``due`` (``(record id, execution id)``, in
        order: ``sleeps.end_due_sleeps``) as the worker would at ``now``; how many."""
        ended = 0
        for record_id, execution_id in due:
            ended += (
                StepRecord.objects.using(using())
                .filter(pk=record_id, status=StepStatus.SLEEPING, traced=False)
                .update(
                    status=StepStatus.COMPLETED,
                    seq=last_seq(execution_id) + 1,
                    attempts=1,
                    started_at=now,
                    finished_at=now,
                    traced=True,
                    duration_ms=0.0,
                )
            )
        return ended

    def shift_sleeps(self, delta: dt.timedelta) -> None:
        """Bring the time every sleep waits until ``delta`` closer (test time:
        ``time_in_tests.shift_due_times``, in its transaction)."""
        for record in StepRecord.objects.using(using()).filter(status=StepStatus.SLEEPING):
            due = dt.datetime.fromisoformat(str(record.result))
            record.result = (due - delta).isoformat()
            record.save(using=using(), update_fields=["result"])

    # -- events (``store.events``) -----------------------------------------------------------------

    def lock_event_keys(self, keys: Sequence[str], *, shared: bool) -> None:
        """Hold ``keys`` until the transaction ends: an emit (``shared``) and a wait reaching
        its step (exclusive) of one event key take turns, so that each sees the other's row.

        Nothing to do here: SQLite lets one transaction write at a time, and both write
        before they read."""

    def key_has_queued(self, reactor: str, key: str) -> bool:
        """Whether runs are queued for a concurrency key (``flow.has_queued``)."""
        return (
            Execution.objects.using(using())
            .filter(reactor=reactor, concurrency_key=key, status=ExecutionStatus.QUEUED)
            .exists()
        )

    def prepare_flow_key(self, reactor: str, kind: str, key: str) -> None:
        """Make sure the key's ``FlowKey`` row exists, before the transaction that locks it.

        Its first decisions, racing to create it inside their transactions, would deadlock
        on InnoDB (each holds a gap lock the other's insert waits for); created here, in a
        statement of its own (outside a caller's transaction), they only queue on it."""
        rows = FlowKey.objects.using(using()).filter(reactor=reactor, kind=kind, key=key)
        if not rows.exists():
            FlowKey.objects.using(using()).bulk_create(
                [FlowKey(reactor=reactor, kind=kind, key=key)], ignore_conflicts=True
            )

    def lock_flow_key(self, reactor: str, kind: str, key: str) -> None:
        """Hold the key's ``FlowKey`` row locked until the transaction ends (the row is
        made by :meth:`prepare_flow_key`, or here by the key's first decision)."""
        rows = FlowKey.objects.using(using()).filter(reactor=reactor, kind=kind, key=key)
        if rows.select_for_update().values_list("pk", flat=True).first() is None:
            FlowKey.objects.using(using()).bulk_create(
                [FlowKey(reactor=reactor, kind=kind, key=key)], ignore_conflicts=True
            )
            rows.select_for_update().values_list("pk", flat=True).get()

    def commit_lazily(self) -> None:
        """Let the current transaction commit without waiting for its flush to disk: for
        writes a later step redoes if a crash loses them (an event given to its waits, the
        event marked handled: the sweeper hands an unhandled event out again).

        Nothing to do here: other databases commit as they are configured."""

    # -- map chunks (``store.maps``) ---------------------------------------------------------------

    def write_chunks(self, map_id: uuid.UUID, pieces: list[tuple[int, int, list[Any]]]) -> None:
        """Store a batch of a map's source items as pending chunks (``maps.write_items``)."""
        map_orm.write_chunks(map_id, pieces)

    def claim_chunk(self, map_id: uuid.UUID, *, forward: bool, token: str) -> ChunkClaim | None:
        """Take a chunk to run or to undo, in the caller's transaction (``maps.claim``)."""
        return map_orm.claim(map_id, forward=forward, token=token)

    def settle_forward(
        self,
        map_id: uuid.UUID,
        chunk: int,
        writes: Sequence[SlotWrite],
        token: str,
        counters: dict[str, int],
        first_failure: int | None,
        now: dt.datetime,
        claim_next: bool,
        retaken: bool,
    ) -> tuple[Settled | None, ChunkClaim | None]:
        """Settle a chunk ``token`` holds (``maps.settle``): the map's progress (None: the
        chunk was taken over, nothing written) and, with ``claim_next``, the next chunk
        (``retaken`` is not needed: the ORM's settle looks for slots either way)."""
        with transaction.atomic(using=using()):
            row = map_orm.settle_chunk(
                map_id, chunk, writes, token, Chunk.RUNNING, Chunk.SETTLED, counters,
                first_failure, now,
            )  # fmt: skip
            following = self.claim_chunk(map_id, forward=True, token=token) if claim_next else None
        return row, following

    def settle_undo(
        self,
        map_id: uuid.UUID,
        chunk: int,
        writes: Sequence[SlotWrite],
        token: str,
        counters: dict[str, int],
        now: dt.datetime,
    ) -> Settled | None:
        """Write what undoing a chunk did if ``token`` still holds it (``maps.settle_rollback``):
        the map's progress, or None (nothing written)."""
        with transaction.atomic(using=using()):
            return map_orm.settle_chunk(
                map_id, chunk, writes, token, Chunk.UNDOING, Chunk.UNDONE, counters, None, now
            )

    def never_start(self, map_id: uuid.UUID, now: dt.datetime) -> int:
        """Settle the chunks never claimed of a stopped map as ``not_started`` (the caller
        holds the map's row); how many elements."""
        return map_orm.never_start(map_id, now)

    # -- atomic steps' transactions ----------------------------------------------------------------

    def bound_statements(self, seconds: float, execution_id: uuid.UUID, fence: int) -> None:
        """Make the transaction just begun (an atomic step's, of ``execution_id`` under
        ``fence``) end within ``seconds`` on the server, where :attr:`bounds_statements`:
        every statement, and every wait between two; the session is marked as that owner's
        (see :meth:`end_stalled_owners`)."""

    def end_stalled_owners(self, execution_id: uuid.UUID, fence: int) -> int:
        """End the database sessions still inside an atomic step's transaction of
        ``execution_id`` under a fence older than ``fence`` (an owner that stalled, was taken
        over and holds row locks the new owner would wait on); return how many. Where the
        database cannot tell, none: their transactions end at their bound."""
        return 0

    def sent_nothing(self) -> bool:
        """Whether the transaction open on the connection has sent nothing to the server;
        False when the database cannot tell."""
        return False

    # -- pruning -----------------------------------------------------------------------------------

    def prune_batch(
        self,
        cutoff: dt.datetime,
        statuses: Sequence[str],
        limit: int,
        after: tuple[dt.datetime, uuid.UUID],
    ) -> tuple[int, tuple[dt.datetime, uuid.UUID]] | None:
        """Delete, in one statement, at most ``limit`` of the runs ``store.prune`` would delete
        that come after ``after`` (``finished_at`` and id), with everything that is theirs;
        how many top-level runs, and the last one's ``finished_at`` and id. None when the
        database has no such statement: ``store.prune`` deletes them through the ORM."""
        return None

    # -- for coordination and the admin ------------------------------------------------------------

    @property
    def clock_sql(self) -> str | None:
        """A statement that reads the database server's clock, in seconds since the epoch
        (coordination's database backend); None when the store knows none for the database."""
        return _CLOCKS.get(self.name)

    def estimated_rows(self, table: str) -> int | None:
        """The planner's estimate of ``table``'s rows (the admin's counts of big lists); None
        when the database keeps none."""
        return None

    def distinct_values(self, model: type[Model], field: str, limit: int) -> list[Any]:
        """The distinct values of ``model``'s ``field``, in order, at most ``limit`` (the
        reactors that have runs, for the admin's filter), read as a loose index scan: one
        index seek for each value, never every row. ``field`` must lead an index of the table
        (runs and interrupts: ``(reactor, created_at, id)``).

        Here one query a value, each the first row after the one before."""
        values: list[Any] = []
        rows = (
            model._default_manager.using(self.alias).order_by(field).values_list(field, flat=True)
        )
        while len(values) < limit:
            following = rows.filter(**{f"{field}__gt": values[-1]}) if values else rows
            value = following.first()
            if value is None:
                return values
            values.append(value)
        return values
