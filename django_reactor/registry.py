"""Which reactor class a stored execution belongs to.

Every concrete ``Reactor`` subclass registers itself under its name (``Meta.name``, or the dotted
path of the class) when it is defined. ``AppConfig.ready()`` imports each installed app's
``reactors`` module so that workers, commands and the admin know every reactor.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from django.utils.module_loading import autodiscover_modules, import_string

from .engine.definition import ReactorDefinition
from .exceptions import ReactorNotRegistered

if TYPE_CHECKING:
    from .reactor import Reactor

logger = logging.getLogger("django_reactor.registry")

_lock = threading.Lock()
_reactors: dict[str, type[Reactor]] = {}


def register(reactor: type[Reactor]) -> None:
    """Register ``reactor`` under its definition name (a later definition replaces it)."""
    name = reactor.definition.name
    with _lock:
        previous = _reactors.get(name)
        if previous is not None and previous is not reactor:
            logger.debug("reactor %s redefined; the newest definition is used", name)
        _reactors[name] = reactor


def get(name: str) -> type[Reactor]:
    """The reactor registered as ``name``; falls back to importing a dotted path."""
    with _lock:
        found = _reactors.get(name)
    if found is not None:
        return found
    if ":" in name:
        # An async_step unit: "<parent reactor>:<step>".
        parent_name, _, step_name = name.rpartition(":")
        parent = get(parent_name)
        spec = parent.definition.by_name.get(step_name)
        if spec is not None and spec.unit_definition is not None:
            return _UnitReactor(spec.unit_definition)  # type: ignore[return-value]
        raise ReactorNotRegistered(
            f"{parent_name} has no async step {step_name!r} (its definition changed?)"
        )
    try:
        candidate = import_string(name)
    except ImportError:
        candidate = None
    # A reactor class is known by its definition (the registry sits below ``reactor.py``).
    if isinstance(candidate, type) and isinstance(
        getattr(candidate, "definition", None), ReactorDefinition
    ):
        return candidate
    raise ReactorNotRegistered(
        f"no reactor named {name!r} is known to this process; make sure the module defining "
        "it is imported (reactors in <app>/reactors.py are found automatically)"
    )


class _UnitReactor:
    """Stands in for a reactor class where only a definition exists (async_step units)."""

    def __init__(self, definition: ReactorDefinition) -> None:
        self.definition = definition


def all_reactors() -> dict[str, type[Reactor]]:
    """A snapshot of every registered reactor by name."""
    with _lock:
        return dict(_reactors)


def autodiscover(modules: list[str]) -> None:
    """Import ``<app>.<module>`` for every installed app and every module name given."""
    for module in modules:
        autodiscover_modules(module)
