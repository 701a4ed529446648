"""The transaction an atomic step's action runs in: its body's writes and its checkpoint commit
together, or not at all (the engine's :class:`~django_reactor.engine.journal.StepTransaction`).

The body runs inside ``transaction.atomic()`` on the run's database. Inside it:

- queries on any other database alias are refused (:class:`AtomicStepError`): they could not
  commit with the checkpoint;
- on PostgreSQL the body's first query starts with ``SET LOCAL statement_timeout`` (what is
  left of ``REACTOR["ATOMIC_STEP_TIMEOUT"]``), so that no statement or lock wait outlives the
  bound, and ``SET CONSTRAINTS ALL IMMEDIATE``, so that a foreign key the body breaks fails
  the statement that breaks it instead of the commit (Django declares them deferred): the
  dialect's ``bound_statements``;
- a body that returns after the bound is failed and rolled back (:class:`AtomicStepTimeout`),
  so no transaction that held row locks longer than that commits.

A body that sent nothing to the database has nothing to make atomic: its transaction ends
unused (no round trip) and its checkpoint commits as a plain step's does.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

try:
    import psycopg
except ImportError:  # pragma: no cover - psycopg is a dependency; others: Django's state only
    psycopg = None  # type: ignore[assignment]

from ..conf import reactor_settings
from ..exceptions import AtomicStepError, AtomicStepTimeout
from .db import connection_lost, using
from .dialects import Dialect
from .dialects import dialect as store_dialect
from .rows import Owned

logger = logging.getLogger("django_reactor.store")


class _Rollback(Exception):
    """Handed to ``Atomic.__exit__`` to make it roll back."""


class DatabaseStepTransaction:
    """One action (run, undo, compensate) of an atomic step, in its own transaction."""

    def __init__(
        self,
        step: str,
        action: str,
        owned: Owned,
        *,
        dialect: Dialect | None = None,
    ) -> None:
        self.step = step
        self.action = action
        self.owned = owned
        self.bound = reactor_settings.ATOMIC_STEP_TIMEOUT
        self.connection = connections[using()]
        self.dialect = store_dialect() if dialect is None else dialect
        self.queried = False
        self.open = True
        self._guards = contextlib.ExitStack()
        self._atomic = transaction.atomic(using=using())
        self._atomic.__enter__()
        try:
            for alias in connections:
                if alias != using():
                    self._guards.enter_context(connections[alias].execute_wrapper(self._elsewhere))
            self._guards.enter_context(self.connection.execute_wrapper(self._here))
        except BaseException:
            self._guards.close()
            self._atomic.__exit__(_Rollback, _Rollback(), None)
            raise
        self.started = time.monotonic()

    # -- the body's queries ---------------------------------------------------------------------

    def _elsewhere(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        alias = context["connection"].alias
        raise AtomicStepError(
            f"step {self.step!r} is atomic (its {self.action} runs inside a transaction on the "
            f"database {using()!r}), so it cannot query the database {alias!r}: that write could "
            "not commit or roll back with the step. Its writes were rolled back. Move the work "
            f"on {alias!r} to a step that is not atomic"
        )

    def _here(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if not self.queried:
            self.queried = True
            if self.dialect.bounds_statements:
                self._bound_statements()
        try:
            return execute(sql, params, many, context)
        except (OperationalError, InterfaceError) as exc:
            # Past the bound, the server cancelled the statement, or ended the session that
            # waited too long between two: the body took too long, its connection is not lost.
            if time.monotonic() - self.started >= self.bound and (
                _cancelled(exc) or connection_lost(exc)
            ):
                raise self._too_long() from exc
            raise

    def _bound_statements(self) -> None:
        """Before the body's first statement: every statement (a lock wait included) ends
        within what is left of the bound."""
        left = self.bound - (time.monotonic() - self.started)
        if left <= 0:
            raise self._too_long()
        self.dialect.bound_statements(left, self.owned.execution_id, self.owned.fence)

    def _too_long(self) -> AtomicStepTimeout:
        held = time.monotonic() - self.started
        return AtomicStepTimeout(
            f"step {self.step!r} is atomic and its {self.action} held its transaction for "
            f"{held:.1f} s, longer than REACTOR['ATOMIC_STEP_TIMEOUT'] ({self.bound:g} s): its "
            "writes were rolled back so that no row stays locked that long. Make the step's "
            "database work shorter (move slow calls out of it), or raise the bound"
        )

    # -- the engine's StepTransaction -----------------------------------------------------------

    def settle(self) -> None:
        self._guards.close()
        if time.monotonic() - self.started > self.bound:
            raise self._too_long()
        if self._aborted():
            raise AtomicStepError(
                f"step {self.step!r} is atomic and its {self.action} went on after a database "
                "error it caught: its transaction can only roll back now, so its writes were "
                "rolled back. Let the error propagate (the attempt fails and is retried as its "
                "policy says), or catch it around a nested transaction.atomic() block"
            )
        if self._unused():
            self._close(None)  # nothing to commit: the checkpoint commits on its own

    def _aborted(self) -> bool:
        """Whether a statement failed in the transaction and the body carried on."""
        if self.connection.needs_rollback:
            return True
        raw = self.connection.connection
        return bool(
            psycopg is not None
            and isinstance(raw, psycopg.Connection)
            and raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        )

    def _unused(self) -> bool:
        """Whether the body left nothing in the transaction: no statement reached the server
        (where the dialect can tell, whatever path the body took) and no ``on_commit``
        callback waits for the checkpoint's commit."""
        return not self.connection.run_on_commit and self.dialect.sent_nothing()

    def commit(self) -> None:
        self._close(None)

    def rollback(self) -> None:
        self._close(_Rollback())

    def _close(self, error: BaseException | None) -> None:
        if not self.open:
            return
        self.open = False
        self._guards.close()
        if error is None:
            self._atomic.__exit__(None, None, None)
        else:
            self._atomic.__exit__(type(error), error, None)


def _cancelled(exc: BaseException) -> bool:
    """Whether PostgreSQL cancelled the statement (``statement_timeout``: SQLSTATE 57014)."""
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) == "57014"


def end_stalled_owners(owned: Owned) -> int:
    """End the database sessions of this run's earlier owners still inside one of its atomic
    steps' transactions (a process stopped or cut off past its lease, taken over, still
    holding row locks the new owner would wait on); return how many were ended.

    Their transactions could never commit (their fence is older), and they end anyway at
    ``ATOMIC_STEP_TIMEOUT``; ending them now spares the new owner that wait. Where the
    database cannot tell or refuses (another role without ``pg_signal_backend``), none is
    ended and they end at their bound.
    """
    try:
        ended = store_dialect().end_stalled_owners(owned.execution_id, owned.fence)
    except DatabaseError as exc:
        logger.warning(
            "could not end the stalled sessions of execution %s's earlier owner (%s); they "
            "end within REACTOR['ATOMIC_STEP_TIMEOUT']",
            owned.execution_id,
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        )
        return 0
    if ended:
        logger.warning(
            "ended %d database session(s) of execution %s's earlier owner, stalled inside an "
            "atomic step's transaction past its lease: its writes are rolled back and its row "
            "locks released",
            ended,
            owned.execution_id,
        )
    return ended
