"""Which reactor class a stored execution belongs to.

Every concrete ``Reactor`` subclass registers itself under its name (``Meta.name``, or the dotted
path of the class) when it is defined. ``AppConfig.ready()`` imports each installed app's
``reactors`` module so that workers, commands and the admin know every reactor.
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.utils.module_loading import autodiscover_modules, import_string

from .engine.definition import ReactorDefinition
from .exceptions import ReactorNotRegistered, VersionMissing

if TYPE_CHECKING:
    from .reactor import Reactor

logger = logging.getLogger("django_reactor.registry")

_lock = threading.Lock()
_reactors: dict[str, type[Reactor]] = {}
#: Every class declaring ``Meta.version``, the current ones and the kept ones, by name and
#: version.
_versions: dict[tuple[str, str], type[Reactor]] = {}


def register(reactor: type[Reactor]) -> None:
    """Register ``reactor`` under its definition name (a later definition replaces it); a
    version kept in code (``Meta.version_of``) under its name and version only."""
    definition = reactor.definition
    name = definition.name
    with _lock:
        previous = None if definition.kept else _reactors.get(name)
        if previous is not None and previous is not reactor:
            logger.debug("reactor %s redefined; the newest definition is used", name)
            replaced = (name, previous.definition.version)
            if _versions.get(replaced) is previous:
                del _versions[replaced]  # its version went with it, unless kept
        if definition.version:
            _versions[(name, definition.version)] = reactor
        if not definition.kept:
            _reactors[name] = reactor


def of_run(name: str, version: str) -> type[Reactor]:
    """The code of a stored run of reactor ``name`` that started on ``version`` (``""``: no
    declared version, so the current class, whose fingerprint the caller compares).

    Raises VersionMissing when this process has the reactor but not that version (a worker
    hands such a run back), ReactorNotRegistered when it has not the reactor.
    """
    current = get(name)  # imports the module that defines it, the first time
    if not version:
        return current
    with _lock:
        found = _versions.get((name, version))
    if found is not None:
        return found
    raise VersionMissing(
        f"this process has version(s) {', '.join(repr(v) for v in versions_of(name)) or 'none'}"
        f" of {name}, not {version!r}, the version the run started on. Keep that version in "
        f"code (a class with Meta.version_of = {short_name(name)} and Meta.version = "
        f"{version!r}) until its runs finish",
        reactor=name,
        version=version,
        current=current.definition.version,
    )


def versions_of(name: str) -> list[str]:
    """The declared versions of reactor ``name`` this process has, the current one first."""
    with _lock:
        current = _reactors.get(name)
        kept = sorted(v for (n, v) in _versions if n == name)
    first = current.definition.version if current is not None else ""
    return ([first] if first else []) + [v for v in kept if v != first]


def inventory() -> dict[str, dict[str, list[str]]]:
    """What code this process has, by reactor name: its declared ``versions`` and the
    fingerprints (``definitions``) of its current and kept classes. Workers report it with
    their heartbeats, so that a run is handed back only when a live worker can take it."""
    with _lock:
        classes = [*_reactors.values(), *_versions.values()]
    found: dict[str, dict[str, list[str]]] = {}
    for reactor in classes:
        definition = reactor.definition
        entry = found.setdefault(definition.name, {"versions": [], "definitions": []})
        if definition.version and definition.version not in entry["versions"]:
            entry["versions"].append(definition.version)
        if definition.definition_hash not in entry["definitions"]:
            entry["definitions"].append(definition.definition_hash)
    return found


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


def short_name(name: str) -> str:
    """A registered name without its module (``Refund`` of ``shop.reactors.Refund``)."""
    return name.rsplit(".", 1)[-1]


def resolve(name: str) -> type[Reactor]:
    """The reactor ``name`` names, the way every face takes a name: its registered name
    (``Meta.name`` or the class's dotted path), a dotted path to import, or the class name of
    exactly one registered reactor.

    Raises ReactorNotRegistered otherwise: with ``matches`` when the class name is shared by
    several reactors, and ``suggestions`` (the registered names close to it) when it names none.
    """
    known = all_reactors()
    if name in known:
        return known[name]
    matches = tuple(sorted(n for n in known if short_name(n) == name))
    if len(matches) == 1:
        return known[matches[0]]
    if matches:
        raise ReactorNotRegistered(
            f"{name!r} matches several reactors ({', '.join(matches)}); give the full name",
            matches=matches,
        )
    try:
        return get(name)
    except ReactorNotRegistered:
        pass
    close = suggestions(name, known)
    if close:
        hint = f"did you mean {' or '.join(repr(c) for c in close)}?"
    else:
        hint = f"known: {', '.join(sorted(known)[:10]) or 'none'}"
    raise ReactorNotRegistered(
        f"no reactor named {name!r} is known to this process ({hint}); give its registered "
        "name (Meta.name or the class's dotted path) or the class name of one registered reactor",
        suggestions=close,
    )


def suggestions(name: str, known: Iterable[str] | None = None) -> tuple[str, ...]:
    """Up to three registered names close to ``name`` (a typo, a class name, a moved module),
    closest first, and only those nearly as close as the closest. Closeness is difflib's ratio
    of the class names, or of the whole names when that is above 0.9 (names in one module share
    most of their letters, so a lower whole-name ratio says little)."""
    scored: list[tuple[float, str]] = []
    for registered in sorted(all_reactors() if known is None else known):
        short = difflib.SequenceMatcher(None, short_name(name), short_name(registered)).ratio()
        whole = difflib.SequenceMatcher(None, name, registered).ratio()
        score = max(short, whole if whole > 0.9 else 0.0)
        if score >= 0.6:
            scored.append((score, registered))
    if not scored:
        return ()
    scored.sort(key=lambda item: -item[0])
    best = scored[0][0]
    return tuple(registered for score, registered in scored if score >= best - 0.1)[:3]


def unknown(names: Iterable[str]) -> list[str]:
    """The names among ``names`` that name no registered reactor, in their order."""
    known = all_reactors()
    return [name for name in names if name not in known]


def all_reactors() -> dict[str, type[Reactor]]:
    """A snapshot of every registered reactor by name."""
    with _lock:
        return dict(_reactors)


def autodiscover(modules: list[str]) -> None:
    """Import ``<app>.<module>`` for every installed app and every module name given."""
    for module in modules:
        autodiscover_modules(module)
