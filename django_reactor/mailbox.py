"""``django_reactor.send``: a message to a run, importable without touching models."""

from __future__ import annotations

from typing import Any

from .engine.outcomes import Outcome


def send(
    execution: Any,
    topic: str,
    payload: Any,
    *,
    idempotency_key: str | None = None,
    background: bool | None = None,
) -> Outcome:
    """Send ``payload`` to the run ``execution`` (its id, a handle or its row) on ``topic``:
    kept until a ``receive(topic)`` step of the run takes it, each message exactly once, in
    send order per topic. See :func:`django_reactor.services.messages.send`."""
    # Imported when called: this module is part of the public API, importable before Django
    # has loaded the models.
    from . import services

    return services.send(
        execution, topic, payload, idempotency_key=idempotency_key, background=background
    )


async def asend(
    execution: Any,
    topic: str,
    payload: Any,
    *,
    idempotency_key: str | None = None,
    background: bool | None = None,
) -> Outcome:
    """The async :func:`send`, for ASGI views and other coroutines (see
    :func:`django_reactor.services.asend`)."""
    # Imported when called, as in the function above.
    from . import services

    return await services.asend(
        execution, topic, payload, idempotency_key=idempotency_key, background=background
    )
