"""The checks an operation makes of its call before it changes anything: the reactor named,
an idempotency key, an open transaction, a composed child steered on its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import registry, store
from ..conf import reactor_settings
from ..engine.serialization import safe_repr, unstorable
from ..exceptions import InvalidTransition, ReactorError, ReactorNotRegistered, TransactionActive

if TYPE_CHECKING:
    from ..models import Execution
    from ..reactor import Reactor


MAX_KEY_LENGTH = 255


def reactor_named(reactor: type[Reactor] | str) -> type[Reactor]:
    """``reactor``, or the reactor a name names, as every face takes names
    (``registry.resolve``: the registered name, a dotted path, the class name of one
    registered reactor); ReactorNotRegistered, with close names, when it names none."""
    if not isinstance(reactor, str):
        return reactor
    if ":" in reactor:
        raise ReactorNotRegistered(
            f"{reactor!r} names an async step's unit, not a reactor; run the reactor that "
            "declares it"
        )
    return registry.resolve(reactor)


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
    """Refuse to run step code inside the caller's ``transaction.atomic()`` (see
    ``REACTOR["REFUSE_INLINE_IN_TRANSACTION"]``)."""
    if reactor_settings.REFUSE_INLINE_IN_TRANSACTION and store.inside_user_transaction():
        raise TransactionActive(
            f"cannot {action} inside transaction.atomic(): step code would run inside your "
            "transaction and could be rolled back after the saga recorded it as done. Call it "
            "after the transaction commits (transaction.on_commit), or outside atomic() (for "
            "views under ATOMIC_REQUESTS, decorate them with transaction.non_atomic_requests)."
        )


def refuse_child(row: Execution, action: str) -> None:
    """Refuse to steer a composed child on its own (its parent is steered instead)."""
    # Async units (detached) are executions of their own and may be steered; a composed child
    # is part of its parent's run. Retrying a unit would detach it from its reader.
    if row.parent_id is not None and (not row.detached or action == "retry"):
        raise InvalidTransition(
            f"cannot {action} execution {row.id}: it is the "
            f"{'async unit' if row.detached else 'composed child'} run by step "
            f"{row.parent_step!r} of execution {row.parent_id}; {action} that execution instead",
            status=row.status,
        )
