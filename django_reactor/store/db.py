"""The store's database connection: which alias, and what to do when a connection breaks."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, Error, InterfaceError, OperationalError, connections

from ..models import Execution

#: The database alias every store module writes to.
USING = DEFAULT_DB_ALIAS

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


def connection_lost(error: BaseException) -> bool:
    """Whether ``error`` means the store's connection cannot carry on: it broke
    (``CONNECTION_ERRORS``), or its server no longer takes writes. Either way the statement may
    be sent again on a new connection, which finds the server that takes writes (a multi-host
    ``HOST`` with ``target_session_attrs``, or a name the failover moved)."""
    return isinstance(error, CONNECTION_ERRORS) or refused_as_read_only(error)


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


def close_thread_connections() -> None:
    """Close this thread's database connections (a thread that ran steps is ending)."""
    connections.close_all()


def reconnecting(operation: Callable[[], T], *, what: str) -> T:
    """Run ``operation``; when the database connection broke, or its server refused a write
    because it only reads (``connection_lost``), reconnect and run it again.

    Only for operations that are safe to repeat (a claim by the same owner, a read, a sweep)
    and outside any transaction. After the last attempt the error is raised.
    """
    connection = connections[USING]
    for attempt, pause in enumerate(RECONNECT_PAUSES, start=1):
        if pause:
            time.sleep(pause)
        try:
            return operation()
        except Error as exc:
            if (
                not connection_lost(exc)
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


def inside_user_transaction(using: str = USING) -> bool:
    """True inside an ``atomic()`` block the caller opened (test-case wrappers do not count)."""
    connection = connections[using]
    if not connection.in_atomic_block:
        return False
    return not all(getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


def side_by_side_limit(using: str = USING) -> int | None:
    """1 inside the transaction of a test case (``django.test.TestCase``, pytest-django's
    ``db``): steps in other threads could not see its rows, so they run one after another
    there. None elsewhere: the reactor's own ``Meta.max_concurrency``."""
    connection = connections[using]
    return 1 if connection.in_atomic_block else None


def db_id(execution_id: uuid.UUID) -> Any:
    """An execution id as the database stores it (raw SQL skips the field's conversion)."""
    return Execution._meta.pk.get_db_prep_value(execution_id, connections[USING])
