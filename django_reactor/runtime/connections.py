"""How this process's step bodies recover a lost database connection (see
:mod:`django_reactor.engine.reconnection`)."""

from __future__ import annotations

from .. import store
from ..conf import reactor_settings
from ..engine.context import Reconnect


def reconnect() -> Reconnect | None:
    """The :class:`Reconnect` of ``REACTOR["RECONNECT_WITHIN"]`` (0: bodies do not recover:
    a lost connection is the attempt's failure)."""
    within = reactor_settings.RECONNECT_WITHIN
    return Reconnect(store.reconnect_after, within) if within > 0 else None
