"""The PostgreSQL store: the generic store's operations, those on hot paths in hand-written
SQL (``store.sql``, ``store.checkpoint_sql``, ``store.map_sql``), one statement each where the
ORM would send several or cost more in Python than the statement on the server."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, models, transaction

try:
    import psycopg
except ImportError:  # psycopg2: statements go through Django's cursor
    psycopg = None  # type: ignore[assignment]

from ...conf import reactor_settings
from ...engine.journal import JournalBatch, RecordedStep
from ...models import STEP_RECORD_UNIQUE, Definition, Dispatch, Execution, ExecutionEvent
from ...states import MOVING_STATUSES, TERMINAL_STATUSES
from .. import checkpoint_sql, claim_sql, map_sql, sql
from ..checkpoint_sql import RecordWrite
from ..db import using
from ..map_reads import ChunkClaim, Settled, SlotWrite
from ..outbox import QueuedDispatch, publish_on_commit
from ..pauses import pause_request
from ..reads import run_records
from ..rows import Owned, WorkerClaim, route_of_row
from .generic import Dialect


class PostgreSQL(Dialect):
    """The store on PostgreSQL (see :class:`~.generic.Dialect` for each operation)."""

    one_statement_checkpoint = True
    bounds_statements = True
    one_statement_locks = True
    batches_ticks = True

    @property
    def prepares_statements(self) -> bool:
        """With psycopg 3 (``sql.execute``); psycopg2 sends every statement unprepared."""
        from django.db.backends.postgresql import psycopg_any

        return bool(psycopg_any.is_psycopg3)

    # -- runs --------------------------------------------------------------------------------------

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
        """In one statement (``sql.insert_all``): every ``run()`` pays this, and the ORM's
        per-object inserts cost several times the statement. A run that starts later is
        inserted through the ORM (its dispatch may wait for the sweeper). ``may_conflict``:
        a unique key may refuse it (an idempotency key, a retry, a composed child).
        ``hold_limit``: the statement takes the run's concurrency key's room (``sql.HOLD_KEY``),
        or raises ``sql.KeyFull`` and writes nothing."""
        if hold_limit is not None:
            assert not delay
            assert not connections[using()].in_atomic_block
            try:
                _insert_all(execution, events, dispatch, definition, attributes, hold_limit)
            except DatabaseError as exc:
                if sql.raised_key_full(exc):
                    raise sql.KeyFull(execution.concurrency_key) from None
                raise
            return
        if delay:
            super().insert_run(
                execution,
                events,
                dispatch,
                definition,
                delay,
                attributes,
                may_conflict=may_conflict,
            )
            return
        # One statement commits on its own, without BEGIN and COMMIT round trips around it;
        # inside the caller's transaction a savepoint keeps a refused insert from ending that
        # transaction.
        in_transaction = connections[using()].in_atomic_block and may_conflict
        with transaction.atomic(using=using()) if in_transaction else contextlib.nullcontext():
            _insert_all(execution, events, dispatch, definition, attributes)

    def holds_key_on_insert(self) -> bool:
        """Outside a caller's transaction (whose locks would last until it commits, and which
        a refusal would end): ``django_reactor_hold_key`` in the insert."""
        return not connections[using()].in_atomic_block

    def claim_for_worker(self, execution_id: uuid.UUID, owner: str) -> WorkerClaim | None:
        """In one statement (``claim_sql.CLAIM_FOR_WORKER``), which also returns the run's step
        records, last trace sequence number and definition shape (its ``claimed_*``
        columns): resuming costs one round trip."""
        params = _claim_parameters(owner, id=execution_id)
        # Prepared like the checkpoint: planning this statement costs more than running it.
        names, values = sql.execute_named(claim_sql.CLAIM_FOR_WORKER, params)
        if values is None:
            # Not claimable, or the row changed while the claim waited for its lock (see
            # ``claim_sql.CLAIM_FOR_WORKER``): once more, seeing that change.
            names, values = sql.execute_named(claim_sql.CLAIM_FOR_WORKER, params)
        if values is None:
            return None
        return _worker_claim(names, values)

    def claim_ahead(
        self, execution_ids: Sequence[uuid.UUID], owner: str
    ) -> dict[uuid.UUID, WorkerClaim]:
        """In one statement (``claim_sql.CLAIM_AHEAD``), each claim as ``claim_for_worker`` makes
        it."""
        if not execution_ids:
            return {}
        params = _claim_parameters(owner, ids=list(execution_ids))
        names, rows = sql.execute_named_rows(claim_sql.CLAIM_AHEAD, params)
        claims = (_worker_claim(names, values) for values in rows)
        return {claim.owned.execution_id: claim for claim in claims}

    def checkpoint(
        self, execution_id: uuid.UUID, fence: int, batch: JournalBatch, *, new_step: bool
    ) -> tuple[Any, str, Any] | None:
        """Send ``checkpoint_sql.statement``: the run's ``(cancel_requested_at,
        cancel_reason, pause)``, or None when the fence moved on.

        ``new_step``: the caller believes the step has no record yet, so the record is
        inserted without first looking for one to replace; when the belief was wrong (a unique
        violation in autocommit, nothing inserted in a transaction) the statement that
        replaces it follows.
        """
        # Inside a transaction (an atomic step's, a caller's) a unique violation would end it.
        connection = connections[using()]
        in_transaction = connection.in_atomic_block
        record = RecordWrite.REPLACE
        if batch.step is not None and new_step:
            record = RecordWrite.INSERT_IF_ABSENT if in_transaction else RecordWrite.INSERT
        statement, params = checkpoint_sql.statement(execution_id, fence, batch, record)
        try:
            row = sql.execute(statement, params, connection)
            replace = record is RecordWrite.INSERT_IF_ABSENT and row is not None and row[3] == 0
        except IntegrityError as exc:
            if not (record is RecordWrite.INSERT and _names_constraint(exc, STEP_RECORD_UNIQUE)):
                raise
            replace = True  # the statement did nothing (on its own, in autocommit)
        if replace:
            # The step had a record after all: the statement that replaces it.
            statement, params = checkpoint_sql.statement(execution_id, fence, batch)
            row = sql.execute(statement, params, connection)
        return None if row is None else (row[0], row[1], row[2])

    def end_sleeps(self, due: Sequence[tuple[int, Any]], now: dt.datetime) -> int:
        """In one update (``sql.END_SLEEPS``)."""
        row = sql.execute(sql.END_SLEEPS, {"ids": [record_id for record_id, _ in due], "now": now})
        return int(row[0]) if row else 0

    def shift_sleeps(self, delta: dt.timedelta) -> None:
        """In one update (``sql.SHIFT_SLEEPS``)."""
        with connections[using()].cursor() as cursor:
            cursor.execute(sql.SHIFT_SLEEPS, {"seconds": delta.total_seconds()})

    # -- events ------------------------------------------------------------------------------------

    def lock_event_keys(self, keys: Sequence[str], *, shared: bool) -> None:
        """Transaction-level advisory locks on the keys' 64-bit hashes (one statement)."""
        lock = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        with connections[using()].cursor() as cursor:
            cursor.execute(
                f"SELECT {lock}(hashtextextended(k, 0)) FROM unnest(%s::text[]) AS k",
                [sorted(set(keys))],
            )

    def key_has_queued(self, reactor: str, key: str) -> bool:
        """One prepared statement (``sql.KEY_HAS_QUEUED``): every run of a key pays it as it
        ends, and the ORM's query costs several times its execution."""
        row = sql.execute(sql.KEY_HAS_QUEUED, [reactor, key])
        return bool(row and row[0])

    def prepare_flow_key(self, reactor: str, kind: str, key: str) -> None:
        """Nothing to prepare: the lock is an advisory lock, no row."""

    def lock_flow_key(self, reactor: str, kind: str, key: str) -> None:
        """A transaction-level advisory lock on the key's 64-bit hash: one statement, no row
        written (a start of a keyed run pays it)."""
        with connections[using()].cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                [f"django_reactor.flow:{kind}:{len(reactor)}:{reactor}:{key}"],
            )

    def commit_lazily(self) -> None:
        """``synchronous_commit = off`` for this transaction only. The WAL is flushed in order,
        so a later durable commit (the run's next checkpoint, the event marked handled) makes
        this one durable first: a crash can lose it only together with what comes after it."""
        with connections[using()].cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")

    # -- map chunks: one statement each (``store.map_sql``) ----------------------------------------

    def write_chunks(self, map_id: uuid.UUID, pieces: list[tuple[int, int, list[Any]]]) -> None:
        map_sql.write_chunks(map_id, pieces)

    def claim_chunk(self, map_id: uuid.UUID, *, forward: bool, token: str) -> ChunkClaim | None:
        return map_sql.claim(map_id, forward=forward, token=token)

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
        """The settle's one round trip and its own commit (with the next claim)."""
        return map_sql.settle_forward(
            map_id, chunk, writes, token, counters, first_failure, now, claim_next, retaken
        )

    def settle_undo(
        self,
        map_id: uuid.UUID,
        chunk: int,
        writes: Sequence[SlotWrite],
        token: str,
        counters: dict[str, int],
        now: dt.datetime,
    ) -> Settled | None:
        return map_sql.settle_undo(map_id, chunk, writes, token, counters, now)

    def never_start(self, map_id: uuid.UUID, now: dt.datetime) -> int:
        return map_sql.never_start(map_id, now)

    # -- atomic steps' transactions ----------------------------------------------------------------

    def bound_statements(self, seconds: float, execution_id: uuid.UUID, fence: int) -> None:
        """One round trip: ``SET LOCAL statement_timeout`` (every statement, a lock wait
        included, ends within ``seconds``), ``SET LOCAL idle_in_transaction_session_timeout``
        (so does every wait between two: a process stopped inside the transaction loses its
        session, and its row locks, by then), ``SET LOCAL application_name`` to the owner's
        name (:func:`atomic_owner`, which :meth:`end_stalled_owners` looks for) and
        ``SET CONSTRAINTS ALL IMMEDIATE`` (a foreign key the body breaks fails the statement
        that breaks it, not the commit: Django declares them deferred)."""
        raw = connections[self.alias].connection
        bound = max(1, int(seconds * 1000))
        settings = (
            f"SET LOCAL statement_timeout = {bound}; "
            f"SET LOCAL idle_in_transaction_session_timeout = {bound}; "
            f"SET LOCAL application_name = '{atomic_owner(execution_id, fence)}'; "
            "SET CONSTRAINTS ALL IMMEDIATE"
        )
        if psycopg is not None and isinstance(raw, psycopg.Connection):
            # A client-side cursor sends every command in one message, whatever Django's
            # server_side_binding option says.
            with psycopg.ClientCursor(raw) as cursor:
                cursor.execute(settings)
        else:
            with raw.cursor() as cursor:
                for command in settings.split("; "):
                    cursor.execute(command)

    def end_stalled_owners(self, execution_id: uuid.UUID, fence: int) -> int:
        """``pg_terminate_backend`` each session whose ``application_name`` marks an atomic
        step's transaction of ``execution_id`` under an older fence (needs the same database
        role, or ``pg_signal_backend``; refused, it ends nothing and the transaction ends at
        its bound)."""
        prefix = atomic_owner(execution_id, 0).rsplit(" ", 1)[0] + " "
        with connections[self.alias].cursor() as cursor:
            cursor.execute(
                "SELECT pid, application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND starts_with(application_name, %s)",
                [prefix],
            )
            stalled = [
                pid
                for pid, name in cursor.fetchall()
                if name[len(prefix) :].isdigit() and int(name[len(prefix) :]) < fence
            ]
            ended = 0
            for pid in stalled:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                ended += bool(cursor.fetchone()[0])
        return ended

    def sent_nothing(self) -> bool:
        """The driver says so (psycopg 3), whatever path the body took."""
        raw = connections[self.alias].connection
        if raw is None:
            return True
        if psycopg is None or not isinstance(raw, psycopg.Connection):
            return False
        return bool(raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)

    # -- pruning -----------------------------------------------------------------------------------

    def prune_batch(
        self,
        cutoff: dt.datetime,
        statuses: Sequence[str],
        limit: int,
        after: tuple[dt.datetime, uuid.UUID],
    ) -> tuple[int, tuple[dt.datetime, uuid.UUID]] | None:
        """In one statement (``sql.PRUNE_BATCH``)."""
        row = sql.execute(
            sql.PRUNE_BATCH,
            {
                "statuses": list(statuses),
                "finished": sorted(TERMINAL_STATUSES),
                "cutoff": cutoff,
                "after_at": after[0],
                "after_id": after[1],
                "limit": limit,
            },
        )
        if row is None or not row[0]:
            return 0, after
        return int(row[0]), (row[1], row[2])

    # -- for coordination and the admin ------------------------------------------------------------

    @property
    def clock_sql(self) -> str:
        """``clock_timestamp()``: a wait for a row lock never makes the time stale."""
        return "SELECT EXTRACT(EPOCH FROM clock_timestamp())"

    def estimated_rows(self, table: str) -> int | None:
        """``pg_class.reltuples``, kept by ``ANALYZE`` and autovacuum; None for a table never
        analysed."""
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
                [connection.ops.quote_name(table)],
            )
            row = cursor.fetchone()
        if row is None or row[0] is None or row[0] < 0:
            return None
        return int(row[0])

    def distinct_values(self, model: type[models.Model], field: str, limit: int) -> list[Any]:
        """One statement: a recursive query that seeks the index for the first value after
        the one before (PostgreSQL has no skip scan of its own), ``limit`` seeks at most."""
        connection = connections[self.alias]
        quote = connection.ops.quote_name
        table = quote(model._meta.db_table)
        leading = model._meta.get_field(field)
        assert isinstance(leading, models.Field)  # a column, not a relation's other side
        column = quote(leading.column or field)
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH RECURSIVE found(value) AS ("
                f"(SELECT {column} FROM {table} ORDER BY {column} LIMIT 1) "
                f"UNION ALL "
                f"SELECT (SELECT {column} FROM {table} WHERE {column} > found.value "
                f"ORDER BY {column} LIMIT 1) FROM found WHERE found.value IS NOT NULL) "
                f"SELECT value FROM found WHERE value IS NOT NULL LIMIT %s",
                [limit],
            )
            return [row[0] for row in cursor.fetchall()]


def _insert_all(
    execution: Execution,
    events: list[ExecutionEvent],
    dispatch: str | None,
    definition: Definition | None,
    attributes: Mapping[str, str],
    hold_limit: int | None = None,
) -> None:
    """Insert an execution, its first events, its dispatch, its definition (unless kept
    already) and its attributes in one statement (``hold_limit``: taking its concurrency key's
    room, ``sql.HOLD_KEY``).

    Values are prepared by the model fields themselves, so the columns follow the models; the
    statement's text depends only on how many events and attributes there are, and it is sent
    prepared like the checkpoint.
    """
    connection = connections[using()]
    rows: list[models.Model] = [execution, *events]
    if definition is not None:
        rows.insert(0, definition)
    queued: Dispatch | None = None
    if dispatch is not None:
        queued = Dispatch(execution_id=execution.id, reason=dispatch)
        rows.append(queued)
    params = []
    literals: list[str | None] = []
    for obj in rows:
        for f in sql.insert_fields(type(obj)):
            if hold_limit is not None and obj is execution and f.name == "concurrency_key":
                params += [execution.reactor, execution.concurrency_key, hold_limit]
                literals.append(None)
                continue
            value = f.get_db_prep_save(f.pre_save(obj, True), connection)
            inline = sql.literal(value)
            literals.append(inline)
            if inline is None:
                params.append(value)
    for key, value in attributes.items():
        params += [key, value]
    statement = sql.insert_all(
        len(events),
        queued is not None,
        definition is not None,
        len(attributes),
        hold_key=hold_limit is not None,
        literals=tuple(literals),
    )
    returned = sql.execute(statement, params)
    if queued is not None:
        assert returned is not None
        queued.id = returned[0]
        publish_on_commit(
            [QueuedDispatch(queued.id, execution.id, 0.0, route=route_of_row(execution))]
        )


def _json(value: Any) -> Any:
    """A JSON column the claim returns: text from some drivers, decoded from others."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _execution_from_columns(columns: dict[str, Any]) -> Execution:
    """The ``Execution`` a ``RETURNING *`` row describes, its values converted as the ORM
    converts them."""
    connection = connections[using()]
    converters, attnames = _execution_fields()
    values = []
    for column, from_db in converters:
        value = columns[column]
        values.append(from_db(value, None, connection) if from_db is not None else value)
    return Execution.from_db(using(), attnames, values)


@functools.cache
def _execution_fields() -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """``(column, from_db_value or None)`` of each concrete field of ``Execution``, and their
    attribute names in the same order."""
    fields = Execution._meta.concrete_fields
    converters = tuple((str(f.column), getattr(f, "from_db_value", None)) for f in fields)
    return converters, tuple(f.attname for f in fields)


def _names_constraint(exc: IntegrityError, name: str) -> bool:
    """Whether the database said ``exc`` broke the constraint ``name``."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == name


def atomic_owner(execution_id: uuid.UUID, fence: int) -> str:
    """The ``application_name`` of a session inside an atomic step's transaction of
    ``execution_id`` under ``fence`` (at most 63 characters, as PostgreSQL keeps)."""
    # Safe inside a quoted SQL literal: a UUID's text and an int.
    return f"reactor-atomic {uuid.UUID(str(execution_id))} {int(fence)}"


def _claim_parameters(owner: str, **runs: Any) -> dict[str, Any]:
    """The parameters of a worker's claim (``claim_sql.CLAIM_FOR_WORKER``,
    ``claim_sql.CLAIM_AHEAD``)."""
    return {
        "owner": owner,
        "lease": reactor_settings.LEASE_SECONDS,
        "statuses": list(MOVING_STATUSES),  # claims.RESUMABLE
        **runs,
    }


def _worker_claim(names: list[str], values: Sequence[Any]) -> WorkerClaim:
    """The claim a row returned by a worker's claim statement stands for."""
    columns = dict(zip(names, values, strict=True))
    steps, seq, shape, pause, taken_over = (
        columns.pop("claimed_steps"),
        columns.pop("claimed_last_seq"),
        columns.pop("claimed_shape"),
        columns.pop("claimed_pause"),
        columns.pop("claimed_taken_over"),
    )
    row = _execution_from_columns(columns)
    records = run_records(
        row,
        steps=[RecordedStep(**item) for item in _json(steps)],
        seq=int(seq),
        taken_over=bool(taken_over),
    )
    return WorkerClaim(
        Owned(row.id, row.fence, route_of_row(row)),
        row,
        records,
        _json(shape),
        pause_request(_json(pause)),
    )
