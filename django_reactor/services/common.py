"""What the operations share: checks of the caller's arguments, and the handles they return."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from .. import store
from ..conf import reactor_settings
from ..engine.serialization import safe_repr, unstorable
from ..exceptions import (
    ExecutionNotFound,
    InvalidTransition,
    ReactorError,
    TransactionActive,
)
from ..handle import ExecutionHandle, Operations

if TYPE_CHECKING:
    from ..reactor import Reactor


logger = logging.getLogger("django_reactor.services")

#: The handles ``find()`` gives steer their run through these (set by the package, which sees
#: every operation; see ``services/__init__.py``).
OPERATIONS: Operations | None = None


MAX_KEY_LENGTH = 255


def check_key(key: Any) -> None:
    """Refuse an idempotency key that is not short, storable text."""
    problem = None
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
        problem = f"a non-empty string of at most {MAX_KEY_LENGTH} characters"
    elif (why := unstorable(key)) is not None:
        problem = f"storable text ({why})"
    if problem is not None:
        raise ReactorError(f"idempotency_key must be {problem}, got {safe_repr(key)}")


def refuse_open_transaction(action: str) -> None:
    if reactor_settings.REFUSE_INLINE_IN_TRANSACTION and store.inside_user_transaction():
        raise TransactionActive(
            f"cannot {action} inside transaction.atomic(): step code would run inside your "
            "transaction and could be rolled back after the saga recorded it as done. Call it "
            "after the transaction commits (transaction.on_commit), or outside atomic() (for "
            "views under ATOMIC_REQUESTS, decorate them with transaction.non_atomic_requests)."
        )


def refuse_child(row: Any, action: str) -> None:
    # Async units (detached) are executions of their own and may be steered; a composed child
    # is part of its parent's run. Retrying a unit would detach it from its reader.
    if row.parent_id is not None and (not row.detached or action == "retry"):
        raise InvalidTransition(
            f"cannot {action} execution {row.id}: it is the "
            f"{'async unit' if row.detached else 'composed child'} run by step "
            f"{row.parent_step!r} of execution {row.parent_id}; {action} that execution instead",
            status=row.status,
        )


def find(execution_id: uuid.UUID | str, *, reactor: type[Reactor] | None = None) -> ExecutionHandle:
    """The stored execution ``execution_id`` (of ``reactor``, when given)."""
    row = store.get_row(execution_id)
    if reactor is not None and row.reactor != reactor.definition.name:
        raise ExecutionNotFound(
            f"execution {row.id} is a run of {row.reactor}, not of {reactor.definition.name}"
        )
    return handle_of(row)


def handle_of(row: Any) -> ExecutionHandle:
    """A handle of the stored run ``row`` that steers it through the services."""
    return ExecutionHandle(row, OPERATIONS)
