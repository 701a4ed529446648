"""The async twins of the operations an ASGI view calls: ``aresume_interrupt``, ``asend``,
``aemit``.

Each takes the same arguments as its sync operation and runs it through
:func:`django_reactor.runtime.aio.call` (``sync_to_async(thread_sensitive=True)``, the
connections it opened closed afterwards, at most ``REACTOR["ASYNC_DATABASE_CALLS"]`` at once
per event loop). ``Reactor.arun``, ``Reactor.afind`` and the handle's ``await_outcome``,
``arefresh`` and ``acancel`` are the others.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..engine.outcomes import Outcome
from ..runtime import aio
from .events import Emitted, emit
from .interrupts import InterruptName, resume_interrupt
from .messages import send


async def aresume_interrupt(
    execution_id: uuid.UUID | str | None = None,
    *,
    step: InterruptName | None = None,
    payload: Any,
    correlation_id: str | None = None,
    reactor: str | None = None,
    token: str | None = None,
    background: bool | None = None,
    idempotency_key: str | None = None,
    reason: str = "",
) -> Outcome:
    """The async :func:`~django_reactor.services.resume_interrupt`."""
    return await aio.call(
        resume_interrupt,
        execution_id,
        step=step,
        payload=payload,
        correlation_id=correlation_id,
        reactor=reactor,
        token=token,
        background=background,
        idempotency_key=idempotency_key,
        reason=reason,
    )


async def asend(
    execution: Any,
    topic: str,
    payload: Any,
    *,
    idempotency_key: str | None = None,
    background: bool | None = None,
) -> Outcome:
    """The async :func:`~django_reactor.services.send`."""
    return await aio.call(
        send, execution, topic, payload, idempotency_key=idempotency_key, background=background
    )


async def aemit(
    name: str,
    payload: Any = None,
    *,
    key: str | int | None = None,
    event_id: str | int | None = None,
    source: str = "python",
) -> Emitted:
    """The async :func:`~django_reactor.services.emit`."""
    return await aio.call(emit, name, payload, key=key, event_id=event_id, source=source)
