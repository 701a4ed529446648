"""The steering history: how a steering service says what it did, by whom and why.

A steering service makes one :class:`~django_reactor.engine.actors.Steering` with
:func:`steering` (it checks the reason and takes the current actor: see
``django_reactor.engine.actors``) and hands it to the store function that applies the change,
which records it in the same transaction (and puts ``by``, ``via`` and ``reason`` on the trace
entry it writes). A change the store does not
make in one transaction of the run's database (an ordered lock held in Redis) is recorded right
after it with :func:`record`. Either way an action that was refused records nothing.

The history is read with :func:`of_run` (a run's page, its API detail, ``reactor_show``) and
listed in the admin ("Steering history").
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from .. import store
from ..engine.actors import Actor, Steering, current_actor
from ..engine.serialization import safe_repr, unstorable
from ..exceptions import ReactorError
from ..models import AuditAction, AuditEntry


def check_reason(reason: Any, action: str) -> str:
    """``reason`` if it is text the database can store; ReactorError saying why not."""
    if not isinstance(reason, str) or (why := unstorable(reason)) is not None:
        detail = "it is not a string" if not isinstance(reason, str) else why
        raise ReactorError(f"cannot {action} with the reason {safe_repr(reason)}: {detail}")
    return reason


def steering(
    action: str,
    *,
    reason: str = "",
    execution_id: uuid.UUID | None = None,
    reactor: str = "",
    target: str = "",
    detail: Mapping[str, Any] | None = None,
    actor: Actor | None = None,
) -> Steering:
    """The steering action ``action`` (an :class:`~django_reactor.models.AuditAction` value)
    by the current actor, with ``reason`` (checked: storable text) on the run ``execution_id``
    of ``reactor``, or on ``target`` (``"schedule nightly"``, ``"subject customer-7"``,
    ``"ordered lock account-7"``), with JSON ``detail``. ``actor``: who, when it is not the
    current actor (the system's own actions: an event cancelling a run).

    Call it before changing anything (a bad reason refuses the action), then pass it to the
    store function that applies the change.
    """
    if action not in AuditAction.values:
        raise ReactorError(
            f"{action!r} is not a steering action the history knows; add it to "
            "django_reactor.models.AuditAction"
        )
    check_reason(reason, action.replace("_", " "))
    return Steering(
        action=action,
        actor=actor or current_actor(),
        reason=reason,
        execution_id=execution_id,
        reactor=reactor,
        target=target,
        detail=dict(detail or {}),
    )


def record(steering: Steering, **detail: Any) -> AuditEntry:
    """Record ``steering`` (with ``detail`` besides its own) now, in the caller's transaction
    if there is one, else in its own: for a change already applied that the store could not
    record with it. Call it only once the change was applied."""
    return store.audit.record(steering, **detail)


def of_run(execution_id: uuid.UUID) -> list[AuditEntry]:
    """The steering actions on a run, oldest first (the latest 100)."""
    return store.audit.of_run(execution_id)
