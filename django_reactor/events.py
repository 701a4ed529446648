"""``django_reactor.emit``: an event for the runs that wait for it, importable without touching
models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .services.events import Emitted


def emit(
    name: str,
    payload: Any = None,
    *,
    key: str | int | None = None,
    event_id: str | int | None = None,
) -> Emitted:
    """Record the event ``name`` durably (once per ``event_id``) and see to what it matches:
    the ``wait_for_event`` steps waiting for its ``key`` take it, ``Meta.triggers`` start a run
    each, ``Meta.cancel_on`` cancels the matching runs in flight. See
    :func:`django_reactor.services.events.emit`."""
    # Imported when called: this module is part of the public API, importable before Django
    # has loaded the models.
    from . import services

    return services.emit(name, payload, key=key, event_id=event_id)


async def aemit(
    name: str,
    payload: Any = None,
    *,
    key: str | int | None = None,
    event_id: str | int | None = None,
) -> Emitted:
    """The async :func:`emit`, for ASGI views and other coroutines (see
    :func:`django_reactor.services.aemit`)."""
    # Imported when called, as in the function above.
    from . import services

    return await services.aemit(name, payload, key=key, event_id=event_id)
