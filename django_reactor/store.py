"""The only boundary between the engine and the ORM.

Everything the engine persists goes through here: creating an execution, the per-step checkpoint
(one transaction per state change, conditional on the run's fence), loading a run back, and
claiming a run for an operation. On PostgreSQL the checkpoint is a single SQL statement (one
round trip: the execution update, the step record and the trace events as data-modifying CTEs);
on other databases it is the same writes through the ORM in one ``transaction.atomic()``.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ParamSpec, Self, TypeVar

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
    models,
    transaction,
)

try:
    import psycopg
except ImportError:  # psycopg2 or another driver: the checkpoint uses Django's cursor
    psycopg = None  # type: ignore[assignment]
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from . import completion
from .celery import router
from .conf import reactor_settings
from .engine.executor import PendingCompensation, RunState, UndoEntry
from .engine.journal import UNSET, Event, JournalBatch
from .engine.outcomes import ErrorInfo, ErrorKind
from .engine.serialization import decode
from .exceptions import (
    AlreadyRetried,
    CorrelationIdTaken,
    ExecutionBusy,
    ExecutionNotFound,
    InvalidTransition,
    LeaseLost,
    StoredValueUnreadable,
)
from .models import Dispatch, Execution, ExecutionEvent, Interrupt, StepRecord
from .states import EventKind, ExecutionStatus, RollbackStatus, StepStatus

USING = DEFAULT_DB_ALIAS

logger = logging.getLogger("django_reactor.store")


def lease_owner_token() -> str:
    """A name for this process and call, stored as the lease owner."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


T = TypeVar("T")
P = ParamSpec("P")

#: Errors that mean the database connection broke (the server went away, a pooler dropped it,
#: an operator terminated the backend): reconnecting may help, unlike a refused statement.
CONNECTION_ERRORS = (OperationalError, InterfaceError)

# Pauses before the attempts after the first when the connection broke (a PostgreSQL restart
# or failover takes a moment to accept connections again).
RECONNECT_PAUSES = (0.0, 0.2, 1.0)


def refresh_connections() -> None:
    """Drop this thread's database connections that broke; arm ``CONN_HEALTH_CHECKS`` again.

    What Django does around every request, for a worker around every task: a connection that
    raised a database error is tested (one ``SELECT 1``) and closed when it is unusable, and
    the health check runs again before the next query. Connection reuse is left to Celery's
    ``CELERY_DB_REUSE_MAX`` and a positive ``CONN_MAX_AGE`` (Django's default of 0 would
    reconnect for every task). Costs no query for a connection without errors.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or connection.in_atomic_block:
            continue  # not connected, or a task run eagerly inside the caller's transaction
        try:
            connection.health_check_done = False  # type: ignore[attr-defined]
            if connection.get_autocommit() != connection.settings_dict["AUTOCOMMIT"]:
                connection.close()  # left mid-transaction: never reuse it
            elif connection.errors_occurred:
                if connection.is_usable():
                    connection.errors_occurred = False
                    connection.health_check_done = True  # type: ignore[attr-defined]
                else:
                    connection.close()
            elif (
                connection.settings_dict.get("CONN_MAX_AGE")
                and connection.close_at is not None
                and time.monotonic() >= connection.close_at
            ):
                connection.close()
        except Exception:  # closing a broken connection can fail too; it is dropped anyway
            logger.debug("closing connection %s failed", connection.alias, exc_info=True)
            connection.connection = None


def reconnecting(operation: Callable[[], T], *, what: str) -> T:
    """Run ``operation``; when the database connection broke, reconnect and run it again.

    Only for operations that are safe to repeat (a claim by the same owner, a read, a sweep)
    and outside any transaction. After the last attempt the error is raised.
    """
    connection = connections[USING]
    for attempt, pause in enumerate(RECONNECT_PAUSES, start=1):
        if pause:
            time.sleep(pause)
        try:
            return operation()
        except CONNECTION_ERRORS:
            if attempt == len(RECONNECT_PAUSES) or connection.in_atomic_block:
                raise
            logger.warning(
                "database connection lost while %s; reconnecting (attempt %d of %d)",
                what,
                attempt + 1,
                len(RECONNECT_PAUSES),
                exc_info=True,
            )
            connection.close()
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def inside_user_transaction(using: str = USING) -> bool:
    """True inside an ``atomic()`` block the caller opened (test-case wrappers do not count)."""
    connection = connections[using]
    if not connection.in_atomic_block:
        return False
    return not all(getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


# ---------------------------------------------------------------------------- creating runs


class ChildExists(Exception):
    """The parent step already has its composed child (started by an earlier attempt)."""


class IdempotencyConflict(Exception):
    """Another execution of the reactor already holds the idempotency key."""

    def __init__(self, execution_id: uuid.UUID) -> None:
        super().__init__(str(execution_id))
        self.execution_id = execution_id


@dataclass(frozen=True, slots=True)
class Owned:
    """A run this process owns: its id and the fence its writes must carry."""

    execution_id: uuid.UUID
    fence: int


def _again_unprepared(function: Callable[P, T]) -> Callable[P, T]:
    """Run ``function`` once more when its transaction failed only because the database just
    refused a prepared checkpoint (preparation is off now, so the second try goes through)."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        refused = _preparation_refused.is_set()
        try:
            return function(*args, **kwargs)
        except DatabaseError:
            if refused or not _preparation_refused.is_set() or connections[USING].in_atomic_block:
                raise
            return function(*args, **kwargs)

    return wrapper


@_again_unprepared
def create_execution(
    *,
    reactor: str,
    definition_hash: str,
    inputs: Any,
    secret_paths: Iterable[Iterable[str]],
    status: str,
    owner: str | None,
    events: list[Event],
    idempotency_key: str | None = None,
    failure: dict[str, Any] | None = None,
    retry_of: uuid.UUID | None = None,
    current_step: str = "",
    definition_shape: dict[str, Any] | None = None,
    dispatch: str | None = None,
    parent: tuple[uuid.UUID, uuid.UUID, str] | None = None,
    detached: bool = False,
) -> Owned:
    """Insert a new execution with its first trace events (and a dispatch to a worker).

    Raises IdempotencyConflict (and writes nothing) when the key is taken.
    """
    now = timezone.now()
    finished = status not in (ExecutionStatus.RUNNING, ExecutionStatus.PENDING)
    execution = Execution(
        reactor=reactor,
        definition_hash=definition_hash,
        status=status,
        inputs=inputs,
        inputs_digest=inputs_digest(inputs),
        secret_paths=[list(p) for p in secret_paths],
        current_step=current_step,
        definition_shape=definition_shape or {},
        handed_off=dispatch is not None,
        idempotency_key=idempotency_key,
        failure=failure,
        retry_of_id=retry_of,
        parent_id=parent[0] if parent else None,
        root_id=parent[1] if parent else None,
        parent_step=parent[2] if parent else "",
        detached=detached,
        lease_owner=owner,
        lease_expires_at=(now + dt.timedelta(seconds=reactor_settings.LEASE_SECONDS))
        if owner
        else None,
        fence=1 if owner else 0,
        started_at=now if status == ExecutionStatus.RUNNING else None,
        finished_at=now if finished else None,
    )
    try:
        with transaction.atomic(using=USING):
            if connections[USING].vendor == "postgresql":
                _insert_all(execution, _event_rows(execution.id, events), dispatch)
            else:
                execution.save(force_insert=True, using=USING)
                ExecutionEvent.objects.using(USING).bulk_create(_event_rows(execution.id, events))
                if dispatch is not None:
                    queue_dispatch(execution.id, dispatch)
    except IntegrityError:
        if parent is not None and find_child(parent[0], parent[2]) is not None:
            raise ChildExists(parent[2]) from None
        if retry_of is not None and (retried_as := find_retry(retry_of)) is not None:
            raise AlreadyRetried(
                f"execution {retry_of} was already retried as {retried_as}; retry that one instead",
                retry_id=retried_as,
            ) from None
        if idempotency_key is None:
            raise
        holder = (
            Execution.objects.using(USING)
            .filter(reactor=reactor, idempotency_key=idempotency_key)
            .values_list("id", flat=True)
            .first()
        )
        if holder is None:
            raise
        raise IdempotencyConflict(holder) from None
    return Owned(execution.id, execution.fence)


def _insert_all(execution: Execution, events: list[ExecutionEvent], dispatch: str | None) -> None:
    """Insert an execution, its first events and its dispatch in one statement (PostgreSQL).

    Every ``run()`` pays this; the ORM's per-object inserts cost several times the statement.
    Values are prepared by the model fields themselves, so the columns follow the models; the
    statement's text depends only on how many events there are, and it is sent prepared like
    the checkpoint.
    """
    connection = connections[USING]
    rows: list[models.Model] = [execution, *events]
    queued: Dispatch | None = None
    if dispatch is not None:
        queued = Dispatch(execution_id=execution.id, reason=dispatch)
        rows.append(queued)
    sql = _insert_sql(len(events), queued is not None)
    params = [
        f.get_db_prep_save(f.pre_save(obj, True), connection)
        for obj in rows
        for f in _insert_fields(type(obj))
    ]
    returned = _execute_checkpoint(sql, params)
    if queued is not None:
        assert returned is not None
        queued.id = returned[0]
        router.publish_on_commit([router.QueuedDispatch(queued.id, execution.id, 0.0)], USING)


@functools.cache
def _insert_fields(model: type[models.Model]) -> tuple[models.Field[Any, Any], ...]:
    """The columns a new row of ``model`` is inserted with (serial ids left to the database)."""
    return tuple(
        f
        for f in model._meta.concrete_fields
        if not (f.primary_key and isinstance(f, models.AutoField | models.BigAutoField))
    )


@functools.cache
def _insert_sql(events: int, with_dispatch: bool) -> str:
    connection = connections[USING]
    models_named: list[tuple[type[models.Model], str]] = [(Execution, "ex")]
    models_named += [(ExecutionEvent, f"ev{i}") for i in range(events)]
    if with_dispatch:
        models_named.append((Dispatch, "dp"))
    parts = []
    for model, name in models_named:
        fields = _insert_fields(model)
        columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in fields)
        marks = ", ".join(["%s"] * len(fields))
        returning = " RETURNING id" if name == "dp" else ""
        table = model._meta.db_table
        parts.append(f"{name} AS (INSERT INTO {table} ({columns}) VALUES ({marks}){returning})")
    return "WITH " + ", ".join(parts) + (" SELECT id FROM dp" if with_dispatch else " SELECT 1")


def queue_dispatch(execution_id: uuid.UUID, reason: str, delay: float = 0.0) -> None:
    """Write an outbox row for a task resuming the run; it is published after the commit.

    Call inside the transaction that makes the task necessary. Delays longer than
    ``RETRY_COUNTDOWN_LIMIT`` are not published with a countdown: the run's wake-up time is
    stored instead and the sweeper dispatches it when due.
    """
    if delay > float(reactor_settings.RETRY_COUNTDOWN_LIMIT):
        return
    not_before = timezone.now() + dt.timedelta(seconds=delay) if delay > 0 else None
    row = Dispatch.objects.using(USING).create(
        execution_id=execution_id, reason=reason, not_before=not_before
    )
    router.publish_on_commit([router.QueuedDispatch(row.id, execution_id, delay)], USING)


def _wake_parent(parent_id: uuid.UUID) -> None:
    """A unit finished: a parent parked waiting for it becomes due and gets a task.

    A composed child parks together with its parent, so the wake-up climbs to the execution a
    worker resumes (the root, or a detached unit).
    """
    row = (
        Execution.objects.using(USING)
        .filter(pk=parent_id)
        .values("status", "parent_id", "detached")
        .first()
    )
    if row is None or row["status"] != ExecutionStatus.PENDING:
        return
    Execution.objects.using(USING).filter(pk=parent_id).update(wake_at=None)
    if row["parent_id"] is not None and not row["detached"]:
        _wake_parent(row["parent_id"])
    else:
        queue_dispatch(parent_id, Dispatch.Reason.WAKE)


def inputs_digest(inputs: Any) -> str:
    """A fingerprint of stored inputs (canonical JSON), to compare reuses of a key."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _event_rows(execution_id: uuid.UUID, events: Iterable[Event]) -> list[ExecutionEvent]:
    return [
        ExecutionEvent(
            execution_id=execution_id,
            seq=e.seq,
            kind=e.kind,
            step=e.step,
            attempt=e.attempt,
            at=e.at,
            duration_ms=e.duration_ms,
            data=e.data,
        )
        for e in events
    ]


# ---------------------------------------------------------------------------- the checkpoint


class DatabaseJournal:
    """Commits the executor's batches for one owned run (see :class:`engine.journal.Journal`)."""

    def __init__(
        self, owned: Owned, *, fast_path: bool | None = None, wakes: uuid.UUID | None = None
    ) -> None:
        self.execution_id = owned.execution_id
        self.fence = owned.fence
        # An async unit: when it finishes, its parent (perhaps parked on it) is woken.
        self.wakes = wakes
        vendor = connections[USING].vendor
        self.fast_path = (vendor == "postgresql") if fast_path is None else fast_path
        self._lease_seconds = float(reactor_settings.LEASE_SECONDS)

    @functools.cached_property
    def reactor(self) -> str:
        """The run's reactor name (read once, for the rare writes that need it)."""
        return str(
            Execution.objects.using(USING)
            .filter(pk=self.execution_id)
            .values_list("reactor", flat=True)
            .get()
        )

    def commit(self, batch: JournalBatch) -> str | None:
        if self.fast_path and batch.routine and not (self.wakes and batch.finished):
            return self._commit_sql(batch)
        return self._commit_orm(batch)

    # -- PostgreSQL: one statement -------------------------------------------------------------

    def _commit_sql(self, batch: JournalBatch) -> str | None:
        params: list[Any] = []
        now = timezone.now()
        release = batch.finished
        sets = ["updated_at = %s"]
        params.append(now)
        if release:
            sets.append("lease_owner = NULL, lease_expires_at = NULL, finished_at = %s")
            params.append(now)
        else:
            sets.append("lease_expires_at = now() + make_interval(secs => %s)")
            params.append(self._lease_seconds)
        if batch.current_step is not None:
            sets.append("current_step = %s")
            params.append(batch.current_step)
        if batch.step is not None:  # as in _commit_orm: a step's outcome ends any waiting
            sets.append("current_attempt = 0, wake_at = NULL")
        if batch.status is not None:
            sets.append("status = %s")
            params.append(str(batch.status))
        if batch.result is not UNSET:
            sets.append("result = %s::jsonb")
            params.append(json.dumps(batch.result))
        if batch.failure is not UNSET:
            sets.append("failure = %s::jsonb")
            params.append(None if batch.failure is None else json.dumps(batch.failure))
        params.extend([self.execution_id, self.fence])
        parts = [
            "WITH ex AS (UPDATE django_reactor_execution SET "
            + ", ".join(sets)
            + " WHERE id = %s AND fence = %s RETURNING id, cancel_requested_at, cancel_reason)"
        ]
        step = batch.step
        if step is not None:
            parts.append(
                "st AS (INSERT INTO django_reactor_steprecord (execution_id, step, status, seq, "
                "attempts, arguments, secret_arguments, result, error, compensable, rollback, "
                "started_at, finished_at) SELECT ex.id, %s, %s, %s, %s, %s::jsonb, %s::jsonb, "
                "%s::jsonb, %s::jsonb, %s, '', %s, %s FROM ex "
                "ON CONFLICT (execution_id, step) DO UPDATE SET status = EXCLUDED.status, "
                "seq = EXCLUDED.seq, attempts = EXCLUDED.attempts, arguments = EXCLUDED.arguments, "
                "secret_arguments = EXCLUDED.secret_arguments, result = EXCLUDED.result, "
                "error = EXCLUDED.error, compensable = EXCLUDED.compensable, rollback = '', "
                "rollback_error = NULL, rolled_back_at = NULL, started_at = EXCLUDED.started_at, "
                "finished_at = EXCLUDED.finished_at)"
            )
            params.extend(
                [
                    step.step,
                    str(step.status),
                    step.seq,
                    step.attempts,
                    json.dumps(step.arguments),
                    json.dumps([list(p) for p in step.secret_arguments]),
                    json.dumps(step.result),
                    None if step.error is None else json.dumps(step.error),
                    step.compensable,
                    step.started_at,
                    step.finished_at,
                ]
            )
        rollback = batch.rollback
        if rollback is not None:
            parts.append(
                "rb AS (UPDATE django_reactor_steprecord SET rollback = %s, "
                "rollback_error = %s::jsonb, rolled_back_at = %s "
                "WHERE execution_id = (SELECT id FROM ex) AND step = %s)"
            )
            params.extend(
                [
                    str(rollback.status),
                    None if rollback.error is None else json.dumps(rollback.error),
                    rollback.at,
                    rollback.step,
                ]
            )
        if batch.events:
            rows = ", ".join(
                ["(%s::integer, %s, %s, %s::integer, %s::timestamptz, %s::float8, %s::jsonb)"]
                * len(batch.events)
            )
            parts.append(
                "ev AS (INSERT INTO django_reactor_executionevent (execution_id, seq, kind, step, "
                "attempt, at, duration_ms, data) SELECT ex.id, v.seq, v.kind, v.step, v.attempt, "
                f"v.at, v.duration_ms, v.data FROM ex CROSS JOIN (VALUES {rows}) "
                "AS v(seq, kind, step, attempt, at, duration_ms, data))"
            )
            for e in batch.events:
                params.extend(
                    [e.seq, str(e.kind), e.step, e.attempt, e.at, e.duration_ms, json.dumps(e.data)]
                )
        sql = ", ".join(parts) + " SELECT cancel_requested_at, cancel_reason FROM ex"
        row = _execute_checkpoint(sql, params)
        if row is None:
            raise LeaseLost(
                f"execution {self.execution_id} is no longer owned by this process "
                f"(fence {self.fence} was superseded); stopping without writing"
            )
        return _cancel_reason(row[0], row[1])

    # -- any database: the ORM ------------------------------------------------------------------

    def _commit_orm(self, batch: JournalBatch) -> str | None:
        now = timezone.now()
        fields: dict[str, Any] = {"updated_at": now}
        if batch.finished:
            fields.update(lease_owner=None, lease_expires_at=None, finished_at=now)
        else:
            fields["lease_expires_at"] = now + dt.timedelta(seconds=self._lease_seconds)
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
            from .interrupt_store import waiting_for_correlation

            holder = waiting_for_correlation(self.reactor, batch.interrupt.correlation_id)
            if holder is None:
                raise
            raise CorrelationIdTaken(
                f"correlation id {batch.interrupt.correlation_id!r} is taken by execution {holder}",
                correlation_id=batch.interrupt.correlation_id,
                execution_id=holder,
            ) from None

    def _commit_orm_fields(self, batch: JournalBatch, fields: dict[str, Any]) -> str | None:
        with transaction.atomic(using=USING):
            owned = Execution.objects.using(USING).filter(pk=self.execution_id, fence=self.fence)
            if not owned.update(**fields):
                raise LeaseLost(
                    f"execution {self.execution_id} is no longer owned by this process "
                    f"(fence {self.fence} was superseded); stopping without writing"
                )
            step = batch.step
            if step is not None:
                StepRecord.objects.using(USING).update_or_create(
                    execution_id=self.execution_id,
                    step=step.step,
                    defaults={
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
                    },
                )
            if batch.close_interrupts:
                _close_interrupts(self.execution_id)
            reached = batch.interrupt
            if reached is not None:
                Interrupt.objects.using(USING).create(
                    execution_id=self.execution_id,
                    reactor=self.reactor,
                    step=reached.step,
                    correlation_id=reached.correlation_id,
                    expires_at=reached.expires_at,
                    max_attempts=reached.max_attempts,
                    resume_mode=reached.resume_mode,
                    token_hash=reached.token_hash,
                )
            rollback = batch.rollback
            if rollback is not None:
                StepRecord.objects.using(USING).filter(
                    execution_id=self.execution_id, step=rollback.step
                ).update(
                    rollback=rollback.status,
                    rollback_error=rollback.error,
                    rolled_back_at=rollback.at,
                )
            if batch.events:
                ExecutionEvent.objects.using(USING).bulk_create(
                    _event_rows(self.execution_id, batch.events)
                )
            if batch.dispatch is not None:
                queue_dispatch(self.execution_id, batch.dispatch, batch.dispatch_delay)
            if self.wakes is not None and batch.finished:
                _wake_parent(self.wakes)
                completion.publish_on_commit(self.execution_id, str(batch.status or ""), USING)
            requested_at, reason = (
                Execution.objects.using(USING)
                .filter(pk=self.execution_id)
                .values_list("cancel_requested_at", "cancel_reason")
                .get()
            )
        return _cancel_reason(requested_at, reason)


def _cancel_reason(requested_at: Any, reason: str) -> str | None:
    if requested_at is None:
        return None
    return reason or "cancelled by an operator"


# The server refused a prepared checkpoint (a transaction pooler that cannot route prepared
# statements): preparation stays off for the rest of the process.
_preparation_refused = threading.Event()


def _prepared_statement_refused(exc: Exception) -> bool:
    """Whether ``exc`` says a prepared statement is not where psycopg prepared it."""
    sqlstate = getattr(getattr(exc, "diag", None), "sqlstate", None)
    # 26000 invalid_sql_statement_name ("prepared statement ... does not exist"),
    # 42P05 duplicate_prepared_statement ("... already exists").
    return sqlstate in ("26000", "42P05")


def _turn_preparation_off(exc: Exception) -> None:
    if not _preparation_refused.is_set():
        _preparation_refused.set()
        logger.error(
            "the database refused a prepared checkpoint (%s): the connection goes through a "
            "pooler that cannot route prepared statements (a transaction-pooling PgBouncer "
            "before 1.21, or without max_prepared_statements). Checkpoints are no longer "
            "prepared in this process; set REACTOR['CHECKPOINT_PREPARED_STATEMENTS'] = False "
            "(python manage.py check --deploy --database default reports it as "
            "django_reactor.W003)",
            str(exc).strip().splitlines()[0] if str(exc) else type(exc).__name__,
        )


def _execute_checkpoint(sql: str, params: list[Any]) -> tuple[Any, ...] | None:
    """Run the checkpoint statement on Django's connection; return its row.

    With psycopg 3 the statement goes through a server-binding cursor of the same connection
    (same transaction state), prepared once per connection when
    ``REACTOR["CHECKPOINT_PREPARED_STATEMENTS"]`` is on: planning the statement costs about as
    much as running it. Django disables prepared statements connection-wide (for transaction
    poolers), so preparation is enabled around this one statement only. Django's query logging
    and execute wrappers do not see this statement.
    """
    connection = connections[USING]
    connection.ensure_connection()
    raw = connection.connection
    if psycopg is None or not isinstance(raw, psycopg.Connection):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    connection.validate_no_broken_transaction()
    prepare = (
        bool(reactor_settings.CHECKPOINT_PREPARED_STATEMENTS) and not _preparation_refused.is_set()
    )
    with connection.wrap_database_errors:
        threshold = raw.prepare_threshold
        if prepare:
            raw.prepare_threshold = 0
        try:
            with psycopg.Cursor(raw) as cursor:
                try:
                    cursor.execute(sql, params, prepare=prepare)
                except psycopg.Error as exc:
                    if not (prepare and _prepared_statement_refused(exc)):
                        raise
                    _turn_preparation_off(exc)
                    if connection.in_atomic_block:
                        raise  # the transaction is aborted; the caller's next try is unprepared
                    # On its own (autocommit) the refused statement did nothing: send it again.
                    raw.prepare_threshold = threshold
                    cursor.execute(sql, params, prepare=False)
                return cursor.fetchone()
        finally:
            raw.prepare_threshold = threshold


class Kept:
    """Something the heartbeat extends while a ``with`` block runs: subclasses say what
    (``extend()``, which returns False once it is no longer theirs) and name it (``label``)."""

    def __init__(self, interval: float | None = None) -> None:
        lease = float(reactor_settings.LEASE_SECONDS)
        self.interval = interval if interval is not None else max(lease / 3, 0.05)
        self.lost = False  # set when an extension found it taken: the holder must stop
        self.due = 0.0  # monotonic time of the next extension, set by the heartbeat

    @property
    def label(self) -> str:
        """What is kept, for the log."""
        raise NotImplementedError

    def extend(self) -> bool:
        """Extend it once; False when it is no longer this holder's."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        Heartbeat.current().add(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        Heartbeat.current().discard(self)


class Heartbeat:
    """The process's one thread that extends the leases of the keepers it holds when due."""

    _instance: Heartbeat | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.keepers: set[Kept] = set()
        self.changed = threading.Condition()
        self.thread = threading.Thread(
            target=self._loop, name="reactor-lease-heartbeat", daemon=True
        )
        self.thread.start()

    @classmethod
    def current(cls) -> Heartbeat:
        """This process's heartbeat (a new one in a forked child: threads do not survive)."""
        instance = cls._instance
        if instance is None or instance.pid != os.getpid():  # threads do not survive a fork
            with cls._instance_lock:
                instance = cls._instance
                if instance is None or instance.pid != os.getpid():
                    instance = cls._instance = cls()
        return instance

    def add(self, keeper: Kept) -> None:
        with self.changed:
            keeper.due = time.monotonic() + keeper.interval
            self.keepers.add(keeper)
            self.changed.notify()

    def discard(self, keeper: Kept) -> None:
        with self.changed:
            self.keepers.discard(keeper)
            self.changed.notify()  # the last one gone: the thread lets its connection go

    def _loop(self) -> None:
        connected = False
        while True:
            with self.changed:
                while True:
                    now = time.monotonic()
                    due = [k for k in self.keepers if k.due <= now]
                    if due or (connected and not self.keepers):
                        break
                    wait = min((k.due for k in self.keepers), default=None)
                    self.changed.wait(None if wait is None else wait - now)
            for keeper in due:
                self._beat(keeper)
                connected = True
            with self.changed:
                idle = not self.keepers
            if idle and connected:
                connections.close_all()  # this thread's connections only: none held while idle
                connected = False

    def _beat(self, keeper: Kept) -> None:
        try:
            extended = keeper.extend()
        except Exception:
            # A dropped connection must not end the heartbeat: reconnect next time.
            logger.warning(
                "could not extend the lease of %s; trying again in %.1f s",
                keeper.label,
                keeper.interval,
                exc_info=True,
            )
            connections[USING].close()
            extended = True
        with self.changed:
            if not extended:
                keeper.lost = True
                self.keepers.discard(keeper)
            else:
                keeper.due = time.monotonic() + keeper.interval


class LeaseKeeper(Kept):
    """Keeps extending an owned run's lease from the heartbeat thread while the run executes.

    Checkpoints extend the lease too; the keeper covers steps that run longer than the lease,
    so nobody takes over a run whose process is alive. It stops when the fence has moved on
    (the run was taken over): the next checkpoint then raises LeaseLost.
    """

    def __init__(self, owned: Owned, *, interval: float | None = None) -> None:
        self.owned = owned
        self.lease_seconds = float(reactor_settings.LEASE_SECONDS)
        super().__init__(interval)

    @property
    def label(self) -> str:
        return f"execution {self.owned.execution_id}"

    def extend(self) -> bool:
        """Push the lease out once; False when the fence moved on (another owner)."""
        return bool(
            Execution.objects.using(USING)
            .filter(pk=self.owned.execution_id, fence=self.owned.fence)
            .update(lease_expires_at=timezone.now() + dt.timedelta(seconds=self.lease_seconds))
        )


# ---------------------------------------------------------------------------- reading runs


def parse_id(execution_id: uuid.UUID | str) -> uuid.UUID:
    """An execution id as a UUID; raises ExecutionNotFound for anything else."""
    try:
        return execution_id if isinstance(execution_id, uuid.UUID) else uuid.UUID(str(execution_id))
    except ValueError:
        raise ExecutionNotFound(
            f"{execution_id!r} is not an execution id (expected a UUID such as "
            f"'{uuid.UUID(int=0)}')"
        ) from None


def get_row(execution_id: uuid.UUID | str) -> Execution:
    """The execution row; raises ExecutionNotFound with the id in the message."""
    key = parse_id(execution_id)
    try:
        return Execution.objects.using(USING).get(pk=key)
    except Execution.DoesNotExist:
        raise ExecutionNotFound(f"no execution with id {key}") from None


def _db_id(execution_id: uuid.UUID) -> Any:
    """An execution id as the database stores it (raw SQL skips the field's conversion)."""
    return Execution._meta.pk.get_db_prep_value(execution_id, connections[USING])


def step_rows(execution_id: uuid.UUID) -> list[StepRecord]:
    """A run's step records in completion order (raw SQL: this runs on every resume)."""
    table = StepRecord._meta.db_table
    return list(
        StepRecord.objects.using(USING).raw(
            f"SELECT * FROM {table} WHERE execution_id = %s ORDER BY seq", [_db_id(execution_id)]
        )
    )


def event_rows(execution_id: uuid.UUID) -> list[ExecutionEvent]:
    return list(
        ExecutionEvent.objects.using(USING).filter(execution_id=execution_id).order_by("seq")
    )


def load_state(execution_id: uuid.UUID) -> RunState:
    """Rebuild what a run has done from its step records, for undo (and later resume)."""
    state = RunState()
    for row in step_rows(execution_id):
        _fold_step(
            state,
            StepView(
                row.step,
                row.status,
                row.arguments,
                row.result,
                row.error,
                row.compensable,
                row.rollback,
            ),
        )
    state.next_seq = _last_seq(execution_id) + 1
    return state


@dataclass(frozen=True, slots=True)
class StepView:
    """The parts of a step record that say what a run has done."""

    step: str
    status: str
    arguments: Any
    result: Any
    error: dict[str, Any] | None
    compensable: bool
    rollback: str


def _fold_step(state: RunState, row: StepView) -> None:
    state.recorded.add(row.step)
    arguments = decode(row.arguments)
    if row.status in (StepStatus.COMPLETED, StepStatus.SKIPPED):
        value = decode(row.result)
        state.results[row.step] = value
        state.done.add(row.step)
        if row.status == StepStatus.COMPLETED and row.rollback in (
            RollbackStatus.NONE,
            RollbackStatus.FAILED,
        ):
            state.undo_stack.append(UndoEntry(row.step, arguments, value))
    elif row.status == StepStatus.DISPATCHED:
        state.done.add(row.step)
        state.units.add(row.step)
    elif row.status == StepStatus.WAITING:
        state.waiting.add(row.step)
    elif row.status == StepStatus.RESUMED:
        state.waiting.add(row.step)
        state.claimed[row.step] = decode(row.result)
    elif (
        row.status == StepStatus.FAILED
        and row.compensable
        and row.rollback in (RollbackStatus.NONE, RollbackStatus.FAILED)
    ):
        error = ErrorInfo.from_dict(row.error or {"kind": "step", "message": ""})
        state.pending_compensation.append(PendingCompensation(row.step, arguments, error))


def resume_state(row: Execution) -> RunState:
    """What a run has done, plus the attempts its current step already made (a retry waiting).

    A row from the worker's claim on PostgreSQL carries its step records and last trace
    sequence number already (read by the claim statement); any other row is read here.
    """
    claimed = getattr(row, "claimed_steps", None)
    if claimed is None:
        state = load_state(row.id)
    else:
        state = RunState()
        for item in json.loads(claimed) if isinstance(claimed, (str, bytes)) else claimed:
            _fold_step(state, StepView(**item))
        state.next_seq = int(row.claimed_last_seq) + 1  # type: ignore[attr-defined]
    if row.current_attempt and row.current_step:
        state.attempts_done[row.current_step] = row.current_attempt
    return state


def stored_shape(row: Execution) -> dict[str, dict[str, Any]]:
    """The definition shape a run started under (see ``ReactorDefinition.shape``).

    Raises StoredValueUnreadable when the stored value is not a shape: an object mapping each
    step name to an object (``{"impl": "<dotted path>", "depends_on": [...]}``).
    """
    shape = row.definition_shape
    if not isinstance(shape, dict):
        raise StoredValueUnreadable(
            f"the stored definition shape is a {type(shape).__name__}, not an object of steps"
        )
    for name, entry in shape.items():
        if not isinstance(entry, dict):
            raise StoredValueUnreadable(
                f"the stored definition shape of step {name!r} is {ascii(entry)[:80]}, not an "
                'object such as {"impl": "<dotted path>", "depends_on": [<step names>]}'
            )
    return shape


def coordination_state(execution_id: uuid.UUID) -> dict[str, Any]:
    """The run's coordination bookkeeping (see ``Execution.coordination``)."""
    found = (
        Execution.objects.using(USING)
        .filter(pk=execution_id)
        .values_list("coordination", flat=True)
        .first()
    )
    return dict(found or {})


def save_coordination_state(execution_id: uuid.UUID, state: dict[str, Any]) -> None:
    Execution.objects.using(USING).filter(pk=execution_id).update(coordination=state)


def wake_waiter(key: str) -> uuid.UUID | None:
    """Wake the longest-waiting run rescheduled for coordination ``key`` (released just now).

    The run goes on at once instead of at its wake-up time; if it loses the race again it is
    rescheduled again. One run: a released lock (or slot) lets one more through.
    """
    with transaction.atomic(using=USING):
        waiting = (
            Execution.objects.using(USING)
            .filter(
                status=ExecutionStatus.PENDING,
                lease_owner__isnull=True,
                wake_at__isnull=False,
                coordination__waiting=key,
            )
            .order_by("updated_at")
        )
        if connections[USING].features.has_select_for_update_skip_locked:
            waiting = waiting.select_for_update(skip_locked=True)
        found = waiting.values_list("id", flat=True).first()
        if found is None:
            return None
        Execution.objects.using(USING).filter(pk=found).update(wake_at=None)
        queue_dispatch(found, Dispatch.Reason.WAKE)
    return found


def halted_steps(execution_id: uuid.UUID) -> list[str]:
    return list(
        StepRecord.objects.using(USING)
        .filter(execution_id=execution_id, status=StepStatus.HALTED)
        .values_list("step", flat=True)
    )


@dataclass(frozen=True, slots=True)
class WorkerClaim:
    """A run a worker took over: its fence, and the row as the claim left it."""

    owned: Owned
    row: Execution

    @property
    def recovery_attempts(self) -> int:
        return self.row.recovery_attempts


RESUMABLE = (ExecutionStatus.PENDING, ExecutionStatus.RUNNING, ExecutionStatus.ROLLING_BACK)


# The worker's claim on PostgreSQL: one statement that returns the claimed row with the run's
# step records and last trace sequence number, so resuming costs one round trip (the ORM's
# query building costs more than the statement itself on this path, once per delivery).
_CLAIM_SQL = """
UPDATE django_reactor_execution SET
    lease_owner = %s,
    lease_expires_at = now() + make_interval(secs => %s),
    fence = fence + 1,
    recovery_attempts = recovery_attempts
        + CASE WHEN status = 'pending' OR lease_owner IS NULL OR lease_owner = %s
            THEN 0 ELSE 1 END,
    status = CASE WHEN status = 'rolling_back' THEN 'rolling_back' ELSE 'running' END,
    started_at = COALESCE(started_at, now()),
    wake_at = NULL,
    updated_at = now()
WHERE id = %s
    AND status = ANY(%s)
    AND (parent_id IS NULL OR detached)
    AND (lease_owner IS NULL OR lease_expires_at < now() OR lease_owner = %s)
    AND (wake_at IS NULL OR wake_at <= now())
RETURNING *,
    (SELECT COALESCE(MAX(ev.seq), 0) FROM django_reactor_executionevent ev
        WHERE ev.execution_id = django_reactor_execution.id) AS claimed_last_seq,
    (SELECT COALESCE(json_agg(json_build_object(
            'step', sr.step, 'status', sr.status, 'arguments', sr.arguments,
            'result', sr.result, 'error', sr.error, 'compensable', sr.compensable,
            'rollback', sr.rollback) ORDER BY sr.seq), '[]'::json)
        FROM django_reactor_steprecord sr
        WHERE sr.execution_id = django_reactor_execution.id) AS claimed_steps
"""


def claim_for_worker(execution_id: uuid.UUID, owner: str) -> WorkerClaim | None:
    """Take a run nobody owns (pending, or running with an expired lease) for a worker.

    One conditional UPDATE: it bumps the fence, counts a recovery when the previous owner died
    mid-run, and keeps a rolling-back run rolling back. Returns None when the run is finished,
    owned by a live process (a duplicate delivery) or not due yet (a retry's wake-up time).
    The same ``owner`` may claim again (a claim whose reply a broken connection lost).
    """
    now = timezone.now()
    if connections[USING].vendor == "postgresql":
        rows = list(
            Execution.objects.using(USING).raw(
                _CLAIM_SQL,
                [
                    owner,
                    float(reactor_settings.LEASE_SECONDS),
                    owner,
                    execution_id,
                    list(RESUMABLE),
                    owner,
                ],
            )
        )
        return WorkerClaim(Owned(execution_id, rows[0].fence), rows[0]) if rows else None
    claimed = (
        Execution.objects.using(USING)
        .filter(pk=execution_id, status__in=RESUMABLE)
        .filter(Q(parent__isnull=True) | Q(detached=True))
        .filter(Q(lease_owner__isnull=True) | Q(lease_expires_at__lt=now) | Q(lease_owner=owner))
        .filter(Q(wake_at__isnull=True) | Q(wake_at__lte=now))
        .update(
            lease_owner=owner,
            lease_expires_at=now + dt.timedelta(seconds=reactor_settings.LEASE_SECONDS),
            fence=F("fence") + 1,
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
            started_at=Coalesce(F("started_at"), Value(now)),
            wake_at=None,
            updated_at=now,
        )
    )
    if not claimed:
        return None
    row = get_row(execution_id)
    if row.lease_owner != owner:  # pragma: no cover - taken again in the blink between
        return None
    return WorkerClaim(Owned(execution_id, row.fence), row)


def refence(owned: Owned, owner: str) -> Owned | None:
    """Take a run this process owns again, under a new fence, after its connection broke.

    A checkpoint sent on the broken connection may still be running on the server; it carries
    the old fence, so once this commits it either committed first (this waits for its row
    lock, then sees its writes) or writes nothing. None when the run is no longer this
    process's (that checkpoint released it, or another process took it over).
    """
    now = timezone.now()
    with transaction.atomic(using=USING):
        updated = (
            Execution.objects.using(USING)
            .filter(pk=owned.execution_id, fence=owned.fence, lease_owner=owner)
            .update(
                fence=F("fence") + 1,
                lease_expires_at=now + dt.timedelta(seconds=reactor_settings.LEASE_SECONDS),
                updated_at=now,
            )
        )
        if not updated:
            return None
        fence = (
            Execution.objects.using(USING)
            .filter(pk=owned.execution_id)
            .values_list("fence", flat=True)
            .get()
        )
    return Owned(owned.execution_id, fence)


def park_for_attention(
    owned: Owned, *, failure: dict[str, Any], event_kind: str, data: dict[str, Any]
) -> None:
    """End an owned run as needs_attention with ``failure``, releasing it; nothing else runs."""
    now = timezone.now()
    with transaction.atomic(using=USING):
        updated = (
            Execution.objects.using(USING)
            .filter(pk=owned.execution_id, fence=owned.fence)
            .update(
                status=ExecutionStatus.NEEDS_ATTENTION,
                failure=failure,
                lease_owner=None,
                lease_expires_at=None,
                finished_at=now,
                updated_at=now,
            )
        )
        if not updated:
            raise LeaseLost(f"execution {owned.execution_id} was taken over by another process")
        ExecutionEvent.objects.using(USING).create(
            execution_id=owned.execution_id,
            seq=_last_seq(owned.execution_id) + 1,
            kind=event_kind,
            at=now,
            data=data,
        )
        parent = (
            Execution.objects.using(USING)
            .filter(pk=owned.execution_id, detached=True)
            .values_list("parent_id", flat=True)
            .first()
        )
        if parent is not None:  # an async unit: its reader stops waiting
            _wake_parent(parent)


def find_child(parent_id: uuid.UUID, step: str) -> Execution | None:
    """The composed child a parent's step started, if any."""
    return Execution.objects.using(USING).filter(parent_id=parent_id, parent_step=step).first()


def adopt_child(execution_id: uuid.UUID) -> Owned:
    """Take a composed child over for its parent's owner: bump its fence, so writes from a
    previous owner of the parent (a zombie) are refused."""
    with transaction.atomic(using=USING):
        Execution.objects.using(USING).filter(pk=execution_id).update(
            fence=F("fence") + 1, updated_at=timezone.now()
        )
        fence = (
            Execution.objects.using(USING).filter(pk=execution_id).values_list("fence", flat=True)
        ).get()
    return Owned(execution_id, fence)


def execution_exists(execution_id: uuid.UUID) -> bool:
    return Execution.objects.using(USING).filter(pk=execution_id).exists()


# ---------------------------------------------------------------------------- the sweeper


@dataclass(slots=True)
class SweepReport:
    """What one sweep did."""

    republished: int = 0
    maps: int = 0
    recovered: int = 0
    woken: int = 0
    redispatched: int = 0
    deleted: int = 0
    expired: int = 0  # interrupts whose timeout passed (applied by services.sweep)

    def as_dict(self) -> dict[str, int]:
        return {
            "republished": self.republished,
            "maps": self.maps,
            "recovered": self.recovered,
            "woken": self.woken,
            "redispatched": self.redispatched,
            "deleted": self.deleted,
            "expired": self.expired,
        }


def sweep(*, limit: int, grace: float, redispatch_after: float, retention: float) -> SweepReport:
    """Find work a crash or a lost message left behind and queue it again.

    Safe on many hosts at once: rows are claimed with ``FOR UPDATE SKIP LOCKED``, and a run
    dispatched twice runs once (a worker must win its lease).
    """
    report = SweepReport()
    now = timezone.now()
    skip_locked = connections[USING].features.has_select_for_update_skip_locked

    def locked(qs: Any) -> Any:
        return qs.select_for_update(skip_locked=True) if skip_locked else qs

    # 1. Outbox rows the process that wrote them never published (it died after the commit).
    with transaction.atomic(using=USING):
        stale = list(
            locked(
                Dispatch.objects.using(USING).filter(
                    sent_at__isnull=True, created_at__lt=now - dt.timedelta(seconds=grace)
                )
            )
            .order_by("id")
            .values_list("id", "execution_id", "not_before", "reason", "map_run_id")[:limit]
        )
        if stale:
            report.republished = len(
                router.publish(
                    [
                        router.QueuedDispatch(
                            d,
                            e,
                            max(0.0, (nb - now).total_seconds()) if nb else 0.0,
                            task=reason if map_id is not None else "resume",
                            map_id=map_id,
                        )
                        for d, e, nb, reason, map_id in stale
                    ],
                    USING,
                )
            )

    # 2. Runs nobody owns that should be moving: a dead worker's run (lease expired), a retry
    #    whose wake-up time came, a pending run whose task was lost.
    unsent = Dispatch.objects.using(USING).filter(execution_id=OuterRef("pk"), sent_at__isnull=True)
    with transaction.atomic(using=USING):
        candidates = list(
            locked(
                Execution.objects.using(USING)
                .filter(status__in=RESUMABLE)
                .filter(Q(parent__isnull=True) | Q(detached=True))
                .filter(Q(lease_owner__isnull=True) | Q(lease_expires_at__lt=now))
                .filter(Q(wake_at__isnull=True) | Q(wake_at__lte=now))
                .exclude(Exists(unsent))
            )
            .order_by("updated_at")
            .values_list("id", "status", "lease_owner", "wake_at")[:limit]
        )
        queued = []
        recently = set(
            Dispatch.objects.using(USING)
            .filter(
                execution_id__in=[c[0] for c in candidates],
                sent_at__gte=now - dt.timedelta(seconds=redispatch_after),
            )
            .values_list("execution_id", flat=True)
        )
        for execution_id, status, lease_owner, wake_at in candidates:
            if execution_id in recently:
                continue  # a task for it went out moments ago; give a worker time to take it
            if lease_owner is not None or (status != ExecutionStatus.PENDING and wake_at is None):
                reason = Dispatch.Reason.RECOVER
                report.recovered += 1
            elif wake_at is not None:
                reason = Dispatch.Reason.WAKE
                report.woken += 1
            else:
                reason = Dispatch.Reason.START
                report.redispatched += 1
            row = Dispatch.objects.using(USING).create(execution_id=execution_id, reason=reason)
            queued.append(router.QueuedDispatch(row.id, execution_id))
        router.publish_on_commit(queued, USING)

    # 3. Forget dispatches that went out long ago (in batches: a sweep stays short).
    old = (
        Dispatch.objects.using(USING)
        .filter(sent_at__lt=now - dt.timedelta(seconds=retention))
        .values_list("id", flat=True)[:limit]
    )
    report.deleted, _ = Dispatch.objects.using(USING).filter(id__in=list(old)).delete()
    return report


def cancelled_while_running(execution_id: uuid.UUID) -> bool:
    """Whether the run's last cancellation abandoned it while running (its process gone)."""
    data = (
        ExecutionEvent.objects.using(USING)
        .filter(execution_id=execution_id, kind=EventKind.CANCEL)
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    return isinstance(data, dict) and data.get("previous_status") in (
        ExecutionStatus.RUNNING,
        ExecutionStatus.ROLLING_BACK,
    )


def had_step_failure(execution_id: uuid.UUID) -> bool:
    """Whether a step of the run failed (an interrupted step does not count)."""
    for error in (
        StepRecord.objects.using(USING)
        .filter(execution_id=execution_id, status=StepStatus.FAILED)
        .values_list("error", flat=True)
    ):
        if not error or error.get("kind") != ErrorKind.INTERRUPTED:
            return True
    return False


# ---------------------------------------------------------------------------- claiming runs


def claim(
    execution_id: uuid.UUID, *, allowed: Iterable[str], new_status: str, owner: str, action: str
) -> Owned:
    """Take ownership of a run that is in one of ``allowed`` and not owned by a live lease.

    The conditional UPDATE bumps the fence, so any previous owner's later writes are refused.
    Raises InvalidTransition (wrong status) or ExecutionBusy (live lease).
    """
    allowed = list(allowed)
    now = timezone.now()
    with transaction.atomic(using=USING):
        updated = (
            Execution.objects.using(USING)
            .filter(pk=execution_id, status__in=allowed)
            .filter(Q(lease_owner__isnull=True) | Q(lease_expires_at__lt=now))
            .update(
                status=new_status,
                lease_owner=owner,
                lease_expires_at=now + dt.timedelta(seconds=reactor_settings.LEASE_SECONDS),
                fence=F("fence") + 1,
                updated_at=now,
                finished_at=None,
            )
        )
        if updated:
            fence = (
                Execution.objects.using(USING)
                .filter(pk=execution_id)
                .values_list("fence", flat=True)
                .get()
            )
            if new_status in (ExecutionStatus.ROLLING_BACK, ExecutionStatus.CANCELLED):
                _close_interrupts(execution_id)
            return Owned(execution_id, fence)
    row = get_row(execution_id)
    if row.status not in allowed:
        raise InvalidTransition(
            f"cannot {action} execution {execution_id}: it is {row.status}; "
            f"{action} works on {', '.join(sorted(allowed))} runs",
            status=row.status,
        )
    raise ExecutionBusy(
        f"cannot {action} execution {execution_id}: {row.lease_owner} is working on it "
        f"(lease until {row.lease_expires_at:%Y-%m-%d %H:%M:%S %Z}); try again when it stops"
    )


def request_cancel(execution_id: uuid.UUID, *, reason: str, cancellable: Iterable[str]) -> str:
    """Cancel a run without rollback. Returns the status the run had.

    An unowned run in ``cancellable`` becomes cancelled at once; a running run owned by a live
    process gets a cancel request that its executor honours after the current step.
    """
    now = timezone.now()
    cancellable = list(cancellable)
    with transaction.atomic(using=USING):
        row = Execution.objects.using(USING).select_for_update().filter(pk=execution_id).first()
        if row is None:
            raise ExecutionNotFound(f"no execution with id {execution_id}")
        previous = row.status
        live = row.lease_owner is not None and (
            row.lease_expires_at is not None and row.lease_expires_at >= now
        )
        if row.status == ExecutionStatus.ROLLING_BACK and live:
            raise ExecutionBusy(
                f"cannot cancel execution {execution_id}: {row.lease_owner} is rolling it back; "
                "let the rollback finish"
            )
        if row.status == ExecutionStatus.RUNNING and live:
            if row.cancel_requested_at is None:
                row.cancel_requested_at = now
                row.cancel_reason = reason
                row.save(update_fields=["cancel_requested_at", "cancel_reason", "updated_at"])
            return previous
        if row.status not in cancellable:
            raise InvalidTransition(
                f"cannot cancel execution {execution_id}: it is {row.status}; cancel works on "
                f"{', '.join(sorted(cancellable))} runs",
                status=row.status,
            )
        row.status = ExecutionStatus.CANCELLED
        row.cancel_requested_at = now
        row.cancel_reason = reason
        row.finished_at = now
        row.lease_owner = None
        row.lease_expires_at = None
        row.fence = row.fence + 1
        row.save()
        _close_interrupts(execution_id)
        last = _last_seq(execution_id)
        ExecutionEvent.objects.using(USING).create(
            execution_id=execution_id,
            seq=last + 1,
            kind=EventKind.CANCEL,
            at=now,
            data={"reason": reason, "previous_status": previous},
        )
    return previous


def _close_interrupts(execution_id: uuid.UUID) -> None:
    from .interrupt_store import close_waiting

    close_waiting(execution_id)


def _last_seq(execution_id: uuid.UUID) -> int:
    """The highest trace sequence number of a run (0 for none)."""
    with connections[USING].cursor() as cursor:
        cursor.execute(
            f"SELECT MAX(seq) FROM {ExecutionEvent._meta.db_table} WHERE execution_id = %s",
            [_db_id(execution_id)],
        )
        row = cursor.fetchone()
    return int(row[0] or 0)


def append_event(execution_id: uuid.UUID, kind: str, data: dict[str, Any]) -> None:
    """Add an operator-level entry to a run's trace (not tied to an owner)."""
    with transaction.atomic(using=USING):
        # Lock the execution row so concurrent appends cannot pick the same sequence number.
        list(
            Execution.objects.using(USING).select_for_update().filter(pk=execution_id).values("pk")
        )
        last = _last_seq(execution_id)
        ExecutionEvent.objects.using(USING).create(
            execution_id=execution_id, seq=last + 1, kind=kind, at=timezone.now(), data=data
        )


def find_retry(execution_id: uuid.UUID) -> uuid.UUID | None:
    return (
        Execution.objects.using(USING)
        .filter(retry_of_id=execution_id)
        .values_list("id", flat=True)
        .first()
    )


# ---------------------------------------------------------------------------- pruning


def _prunable(cutoff: dt.datetime, statuses: Iterable[str]) -> models.QuerySet[Execution]:
    """Top-level runs in ``statuses`` that finished before ``cutoff`` and whose every
    descendant (composed children, async units) has finished too."""
    from .states import TERMINAL_STATUSES

    unfinished_descendant = (
        Execution.objects.using(USING)
        .filter(root_id=OuterRef("pk"))
        .exclude(status__in=TERMINAL_STATUSES)
    )
    return (
        Execution.objects.using(USING)
        .filter(
            parent__isnull=True,
            status__in=list(statuses),
            finished_at__isnull=False,
            finished_at__lt=cutoff,
        )
        .exclude(Exists(unfinished_descendant))
    )


def count_prunable(cutoff: dt.datetime, statuses: Iterable[str]) -> int:
    """How many top-level runs :func:`prune_finished` would delete now."""
    return _prunable(cutoff, statuses).count()


def prune_finished(cutoff: dt.datetime, statuses: Iterable[str], batch_size: int) -> Iterable[int]:
    """Delete finished top-level runs (see :func:`count_prunable`), ``batch_size`` at a time.

    Each batch is its own transaction: the runs are selected and locked (rows another process
    holds are skipped), then deleted with their step records, trace, interrupts, dispatches and
    child runs. Yields how many top-level runs each batch deleted.
    """
    statuses = list(statuses)
    while True:
        with transaction.atomic(using=USING):
            ids = list(
                _prunable(cutoff, statuses)
                .select_for_update(skip_locked=True, of=("self",))
                .order_by("finished_at", "id")
                .values_list("id", flat=True)[:batch_size]
            )
            if not ids:
                return
            Execution.objects.using(USING).filter(id__in=ids).delete()
        yield len(ids)
