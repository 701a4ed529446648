"""The store's database connection: which alias, and what to do when a connection breaks."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, Error, InterfaceError, OperationalError, connections
from django.db.models import Model

from ..conf import reactor_settings
from ..exceptions import ReactorError
from ..models import Execution
from ..models.routing import bound as bound
from ..models.routing import bound_alias
from ..models.routing import unbound as unbound

try:
    import psycopg
except ImportError:  # pragma: no cover - psycopg is a dependency; others: Django's errors only
    psycopg = None  # type: ignore[assignment]


logger = logging.getLogger("django_reactor.store")

T = TypeVar("T")

#: Errors that mean the database connection broke (the server went away, a pooler dropped it,
#: an operator terminated the backend): reconnecting may help, unlike a refused statement.
CONNECTION_ERRORS = (OperationalError, InterfaceError)

#: SQLSTATE ``read_only_sql_transaction``: the server refused a write (or a row lock) because it
#: only reads. It did nothing; the server that takes writes is another one.
READ_ONLY_SQLSTATE = "25006"

# Pauses before the attempts after the first when the connection broke (a PostgreSQL restart
# or failover takes a moment to accept connections again).
RECONNECT_PAUSES = (0.0, 0.2, 1.0)


def using() -> str:
    """The database alias the store reads and writes in this context: the one bound by
    :func:`bound` (a run's, while an entry point works on it), else the default database of
    ``REACTOR["DATABASE"]``."""
    return bound_alias() or default_alias()


def bound_to(row: Model) -> AbstractContextManager[str]:
    """Bind the database ``row`` was read from (a handle's run, an interrupt found in whichever
    database has it), so that what follows reads and writes beside it."""
    return bound(row._state.db or using())


def default_alias() -> str:
    """The database of reactors ``REACTOR["DATABASE"]`` does not name (Django's ``default``
    unless it says otherwise). Read on every statement: no more than a lookup."""
    routing = reactor_settings.DATABASE
    return routing if isinstance(routing, str) else routing.get("default", DEFAULT_DB_ALIAS)


def alias_for(reactor_name: str) -> str:
    """The database the runs of the reactor registered as ``reactor_name`` are written to."""
    routing = reactor_settings.DATABASE
    if isinstance(routing, str):
        return routing
    return routing.get(reactor_name) or routing.get("default", DEFAULT_DB_ALIAS)


def aliases() -> tuple[str, ...]:
    """Every database runs are written to: the default first, then the others as configured
    (the sweeper sweeps each; a run found by its id is looked for in each)."""
    routing = reactor_settings.DATABASE
    if isinstance(routing, str):
        return (routing,)
    named = (alias for name, alias in routing.items() if name != "default")
    return tuple(dict.fromkeys([default_alias(), *named]))


def refused_as_read_only(error: BaseException) -> bool:
    """Whether ``error`` is the server refusing a write because it only reads: a standby (a
    connection made without ``target_session_attrs=read-write``), or a primary fenced read-only
    for a switchover (``default_transaction_read_only``), whose connections stay open."""
    for raised in (error, error.__cause__):
        # psycopg 3 says ``sqlstate``, psycopg2 ``pgcode``.
        code = getattr(raised, "sqlstate", None) or getattr(raised, "pgcode", None)
        if code == READ_ONLY_SQLSTATE:
            return True
    return False


def reconnectable(error: BaseException) -> bool:
    """Whether an operation of the store's that raised ``error`` may be sent again on a new
    connection (``reconnecting``, a worker's run): any ``CONNECTION_ERRORS``, as before, or a
    lost connection or a write refused as read-only however it was raised
    (:func:`connection_lost`). The new connection finds the server that takes writes (a
    multi-host ``HOST`` with ``target_session_attrs``, or a name the failover moved)."""
    return isinstance(error, CONNECTION_ERRORS) or connection_lost(error)


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
                if _usable(connection):
                    connection.health_check_done = True  # type: ignore[attr-defined]
                else:
                    _close(connection)
            elif (
                connection.settings_dict.get("CONN_MAX_AGE")
                and connection.close_at is not None
                and time.monotonic() >= connection.close_at
            ):
                connection.close()
        except Exception:  # closing a broken connection can fail too; it is dropped anyway
            logger.debug("closing connection %s failed", connection.alias, exc_info=True)
            connection.connection = None


# SQLSTATEs of a connection that is gone: class 08 (connection exception) and the server's
# shutdowns (57P01 admin_shutdown, what pg_terminate_backend sends; 57P02 crash_shutdown;
# 57P03 cannot_connect_now, a server starting or a replica being promoted).
_LOST_STATES = ("57P01", "57P02", "57P03")


def connection_lost(error: BaseException) -> bool:
    """Whether ``error`` (or what it was raised from) says a database connection was lost.

    Unlike a refused statement (a constraint, a statement timeout, a deadlock), such an error
    says nothing about the work: the same statements may succeed on a new connection. Client-
    side errors without a SQLSTATE (``the connection is lost``, ``server closed the connection
    unexpectedly``) are connection errors too; Django's ``InterfaceError`` says it used a
    connection already closed; and a write refused as read-only (:func:`refused_as_read_only`)
    says this connection's server is no longer the one that takes writes.
    """
    for current in _chain(error):
        if isinstance(current, ReactorError):
            return False  # ours says what happened (an atomic step held its transaction too long)
        if isinstance(current, InterfaceError) or (
            psycopg is not None and isinstance(current, psycopg.InterfaceError)
        ):
            return True
        if refused_as_read_only(current):
            return True
        if psycopg is not None and isinstance(current, psycopg.OperationalError):
            state = current.sqlstate
            if state is None or state.startswith("08") or state in _LOST_STATES:
                return True
    return False


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it was raised from (or while handling), newest first (bounded)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )


def reconnect_after(error: BaseException) -> bool:
    """If ``error`` says a database connection was lost, drop this thread's broken connections
    (the next statement connects again) and return True; otherwise change nothing and return
    False. A connection inside a transaction the caller opened is left alone (its work is gone
    with it: only the caller can start again), and then False is returned."""
    if not connection_lost(error):
        return False
    # A connection to a server that only reads answers SELECT 1: it is dropped all the same.
    read_only = any(refused_as_read_only(e) for e in _chain(error))
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if connection.in_atomic_block:
            if read_only or not _usable(connection):
                return False
            continue
        if read_only or not _usable(connection):
            _close(connection)
    return True


def _usable(connection: Any) -> bool:
    """Whether ``connection`` can still run a statement (tested with one only after an error)."""
    raw = connection.connection
    if psycopg is not None and isinstance(raw, psycopg.Connection) and (raw.closed or raw.broken):
        return False
    if not connection.errors_occurred:
        return True
    try:
        usable = bool(connection.is_usable())
    except Exception:
        return False
    if usable:
        connection.errors_occurred = False
    return usable


def _close(connection: Any) -> None:
    try:
        connection.close()
    except Exception:  # closing a broken connection can fail too; it is dropped anyway
        logger.debug("closing connection %s failed", connection.alias, exc_info=True)
        connection.connection = None


def close_thread_connections() -> None:
    """Close this thread's database connections (a thread that ran steps is ending)."""
    connections.close_all()


def open_connections() -> frozenset[str]:
    """The aliases of this thread's open database connections."""
    return frozenset(
        c.alias for c in connections.all(initialized_only=True) if c.connection is not None
    )


def give_back_connections(kept: Collection[str] = ()) -> None:
    """Close this thread's database connections that hold no transaction (an open
    ``atomic()`` block keeps its connection), but those of ``kept``. The async API calls it
    after each call, keeping those open before it (a worker's, whose session may hold locks):
    a thread serving many coroutines keeps no connection while they wait, and a pooled
    connection (``DATABASES[...]["OPTIONS"]["pool"]``) goes back to its pool."""
    for connection in connections.all(initialized_only=True):
        if (
            connection.connection is not None
            and not connection.in_atomic_block
            and connection.alias not in kept
        ):
            _close(connection)


def reconnecting(operation: Callable[[], T], *, what: str) -> T:
    """Run ``operation``; when the database connection broke, or its server refused a write
    because it only reads (:func:`reconnectable`), reconnect and run it again.

    Only for operations that are safe to repeat (a claim by the same owner, a read, a sweep)
    and outside any transaction. After the last attempt the error is raised.
    """
    connection = connections[using()]
    for attempt, pause in enumerate(RECONNECT_PAUSES, start=1):
        if pause:
            time.sleep(pause)
        try:
            return operation()
        except Error as exc:
            if (
                not reconnectable(exc)
                or attempt == len(RECONNECT_PAUSES)
                or connection.in_atomic_block
            ):
                raise
            # Expected in production (a failover, a pooler restart) and handled here: one line
            # at WARNING, the traceback only at DEBUG.
            logger.warning(
                "%s while %s (%s); reconnecting (attempt %d of %d)",
                "the database server refused a write as read-only"
                if refused_as_read_only(exc)
                else "database connection lost",
                what,
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                attempt + 1,
                len(RECONNECT_PAUSES),
            )
            logger.debug("the lost connection's error", exc_info=True)
            connection.close()
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def conflict_target(fields: list[str], alias: str | None = None) -> list[str] | None:
    """``unique_fields`` for an upsert (``bulk_create(update_conflicts=True)``) on ``alias``
    (default: the store's database): ``fields``, or None where the database names no conflict
    target (MariaDB and MySQL: their ``ON DUPLICATE KEY UPDATE`` takes any unique key, so the
    model must have no unique key but its primary key and ``fields``)."""
    features = connections[alias or using()].features
    return fields if features.supports_update_conflicts_with_target else None


def inside_user_transaction(alias: str | None = None) -> bool:
    """True inside an ``atomic()`` block the caller opened (test-case wrappers do not count),
    on ``alias`` (default: the store's database, and Django's ``default`` too when runs are
    routed elsewhere: step bodies write there)."""
    for checked in dict.fromkeys([alias or using(), DEFAULT_DB_ALIAS]):
        if checked not in connections.settings:
            continue
        connection = connections[checked]
        if connection.in_atomic_block and not all(
            getattr(block, "_from_testcase", False) for block in connection.atomic_blocks
        ):
            return True
    return False


def side_by_side_limit(alias: str | None = None) -> int | None:
    """1 inside the transaction of a test case (``django.test.TestCase``, pytest-django's
    ``db``): steps in other threads could not see its rows, so they run one after another
    there. None elsewhere: the reactor's own ``Meta.max_concurrency``."""
    connection = connections[alias or using()]
    return 1 if connection.in_atomic_block else None


def db_id(execution_id: uuid.UUID) -> Any:
    """An execution id as the database stores it (raw SQL skips the field's conversion)."""
    return Execution._meta.pk.get_db_prep_value(execution_id, connections[using()])


def locate(execution_id: uuid.UUID | str) -> str | None:
    """The database that holds the run ``execution_id`` (one query per database tried, none
    when only one is configured); None when no database has it or the id is not one."""
    known = aliases()
    if len(known) == 1:
        return known[0]
    return first_holding(lambda: holds_run(execution_id))


def holds_run(execution_id: uuid.UUID | str) -> bool:
    """Whether the bound database has the run ``execution_id`` (False for what is not an id)."""
    try:
        key = execution_id if isinstance(execution_id, uuid.UUID) else uuid.UUID(str(execution_id))
    except ValueError:
        return False
    return Execution.objects.using(using()).filter(pk=key).exists()


def first_holding(holds: Callable[[], bool]) -> str | None:
    """The first database runs are written to (the default first) where ``holds()``, asked
    with that database bound, is true; None when none."""
    for alias in aliases():
        with bound(alias):
            if holds():
                return alias
    return None
