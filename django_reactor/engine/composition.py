"""Where ``compose()`` and ``async_reactor()`` were declared; see :mod:`.constructs.compose`
and :mod:`.constructs.async_unit`. Kept so that existing imports go on working."""

from __future__ import annotations

from .constructs.async_unit import AsyncReactorStep, async_reactor
from .constructs.compose import ChildRunner, ComposeStep, compose

__all__ = ["AsyncReactorStep", "ChildRunner", "ComposeStep", "async_reactor", "compose"]
