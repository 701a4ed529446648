"""The coordination panel: who holds which lock, semaphore slots in use, rate-limit windows,
period buckets and ordered-lock queues, read through the configured backend's ``inspect()``
(never from Redis or the tables directly).

Each key is matched with the declarations of the registered reactors (``Meta.coordination``
and the steps' ``coordination``), so the panel can say which reactor declares it and give a
semaphore's limit and a rate limit's windows.
"""

from __future__ import annotations

import re
import string
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import registry
from ..conf import reactor_settings
from ..coordination import CoordinationUnavailable, Window, get_backend, parse_windows
from ..coordination.backends.base import INSPECT_LIMIT
from ..coordination.rates import NAMED_PREFIX, named_rate_limits
from ..coordination.types import CoordinationSnapshot
from ..display import format_duration
from ..engine.coordination import Declaration, Lock, OrderedLock, Period, RateLimit, Semaphore
from ..exceptions import ReactorImproperlyConfigured
from .display import execution_link

#: The backend key's first part for each declaration (``coordination.coordinator.backend_key``).
KINDS: dict[type, str] = {
    Lock: "lock",
    Semaphore: "semaphore",
    RateLimit: "rate",
    Period: "period",
    OrderedLock: "ordered",
}


@dataclass(frozen=True)
class Declared:
    """A declaration of a registered reactor and where it is declared."""

    declaration: Declaration
    where: str
    pattern: re.Pattern[str] | None


def _pattern(kind: str, key: Any) -> re.Pattern[str] | None:
    """The backend keys a declared key template can produce (None for a callable key)."""
    if not isinstance(key, str):
        return None
    parts = []
    for literal, field_name, _spec, _conversion in string.Formatter().parse(key):
        parts.append(re.escape(literal))
        if field_name is not None:
            parts.append(".+?")
    return re.compile(re.escape(f"{kind}:") + "".join(parts) + r"\Z")


def declarations() -> Iterator[Declared]:
    """Every coordination declaration of the registered reactors."""
    for name, reactor in sorted(registry.all_reactors().items()):
        definition = reactor.definition
        short = name.rsplit(".", 1)[-1]
        for declaration in definition.coordination:
            yield _declared(declaration, f"{short} (Meta.coordination)")
        for spec in definition.steps:
            for declaration in spec.coordination:
                yield _declared(declaration, f"{short}, step {spec.name}")


def _declared(declaration: Declaration, where: str) -> Declared:
    kind = KINDS[type(declaration)]
    if isinstance(declaration, RateLimit) and declaration.name is not None:
        return Declared(declaration, where, re.compile(re.escape(NAMED_PREFIX + declaration.name)))
    return Declared(declaration, where, _pattern(kind, declaration.key))


def owner_link(owner: str) -> SafeString:
    """A run's id as a link to its page (its short id, the whole id as its title); any other
    owner as text."""
    try:
        execution_id = uuid.UUID(owner)
    except ValueError:
        return format_html("{}", owner)
    return format_html('<span title="{}">{}</span>', owner, execution_link(execution_id))


def _shown_key(key: str) -> str:
    """The key as declared: ``lock:order-7`` is ``order-7``, ``named:stripe`` is ``stripe``."""
    for prefix in (*(f"{kind}:" for kind in KINDS.values()), NAMED_PREFIX):
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_duration(max(value, 0.0))


UNIT_NAMES = {1.0: _("second"), 60.0: _("minute"), 3600.0: _("hour"), 86400.0: _("day")}


def _window_text(window: Window) -> str:
    """``second``, ``minute``, ..., or the window's length (``15 s``)."""
    name = UNIT_NAMES.get(window.period)
    return str(name) if name else format_duration(window.period).replace(".0 s", " s")


def coordination_context() -> dict[str, Any]:
    """Everything the panel shows, or ``problem`` when the backend cannot be read."""
    path = reactor_settings.COORDINATION_BACKEND
    try:
        backend = get_backend()
    except ReactorImproperlyConfigured as exc:
        return {"backend": path, "problem": str(exc)}
    found = list(declarations())
    named = _named_limits()
    periods = {1.0, 60.0, 3600.0}
    for item in found:
        if isinstance(item.declaration, RateLimit) and item.declaration.name is None:
            periods.update(w.period for w in parse_windows(item.declaration.limits))
    for windows in named.values():
        periods.update(w.period for w in windows)
    try:
        snapshot = backend.inspect(periods=sorted(periods))
    except CoordinationUnavailable as exc:
        return {"backend": path, "problem": str(exc)}
    except NotImplementedError as exc:
        return {"backend": path, "problem": str(exc)}
    return {"backend": path, **_sections(snapshot, found, named)}


def _named_limits() -> dict[str, tuple[Window, ...]]:
    try:
        return named_rate_limits()
    except ReactorImproperlyConfigured:
        return {}


def _match(found: list[Declared], kind: type, key: str) -> Declared | None:
    for item in found:
        if isinstance(item.declaration, kind) and item.pattern and item.pattern.match(key):
            return item
    return None


def _sections(
    snapshot: CoordinationSnapshot,
    found: list[Declared],
    named: dict[str, tuple[Window, ...]],
) -> dict[str, Any]:
    locks = []
    for lock in snapshot.locks:
        declared = _match(found, Lock, lock.key)
        locks.append(
            {
                "key": _shown_key(lock.key),
                "owner": owner_link(lock.owner),
                "fence": lock.fence,
                "expires_in": _seconds(lock.expires_in),
                "declared": declared.where if declared else "",
            }
        )
    semaphores = []
    for slots in snapshot.semaphores:
        declared = _match(found, Semaphore, slots.key)
        limit = declared.declaration.limit if declared else None  # type: ignore[union-attr]
        used = len(slots.holders)
        semaphores.append(
            {
                "key": _shown_key(slots.key),
                "used": used,
                "limit": limit,
                "percent": min(100.0, 100.0 * used / limit) if limit else None,
                "holders": [
                    {"owner": owner_link(owner), "expires_in": _seconds(left)}
                    for owner, left in slots.holders
                ],
                "declared": declared.where if declared else "",
            }
        )
    rates = []
    for usage in snapshot.rates:
        counts = dict(zip(snapshot.periods, usage.counts, strict=True))
        windows: tuple[Window, ...] = ()
        where = ""
        if usage.key.startswith(NAMED_PREFIX):
            windows = named.get(usage.key[len(NAMED_PREFIX) :], ())
            where = str(_("REACTOR['RATE_LIMITS']"))
        else:
            declared = _match(found, RateLimit, usage.key)
            if declared is not None:
                windows = parse_windows(declared.declaration.limits)  # type: ignore[union-attr]
                where = declared.where
        if windows:
            rows = [
                {
                    "window": _window_text(w),
                    "used": counts.get(w.period, 0),
                    "limit": w.limit,
                    "percent": min(100.0, 100.0 * counts.get(w.period, 0) / w.limit),
                    "full": counts.get(w.period, 0) >= w.limit,
                }
                for w in windows
            ]
        else:
            rows = [
                {"window": _window_text(Window(1, p)), "used": c, "limit": None}
                for p, c in sorted(counts.items())
                if p in (1.0, 60.0, 3600.0)
            ]
        rates.append(
            {
                "key": _shown_key(usage.key),
                "named": usage.key.startswith(NAMED_PREFIX),
                "windows": rows,
                "last": _seconds(snapshot.at - usage.last_at) if usage.last_at else "-",
                "declared": where,
            }
        )
    holds = [
        {
            "key": _shown_key(hold.key),
            "bucket": hold.bucket,
            "state": hold.state,
            "owner": owner_link(hold.owner),
            "expires_in": _seconds(hold.expires_in),
            "declared": (d.where if (d := _match(found, Period, hold.key)) else ""),
        }
        for hold in snapshot.period_holds
    ]
    ordered = [
        {
            "key": _shown_key(queue.key),
            "head": owner_link(queue.head) if queue.head else None,
            "head_for": _seconds(snapshot.at - queue.head_since) if queue.head_since else "-",
            "queued": queue.queued,
            "next": [owner_link(owner) for owner in queue.first[1 if queue.head else 0 :]],
            "more": max(queue.queued - len(queue.first), 0),
            "halted_after": owner_link(queue.halted_after) if queue.halted_after else None,
            "skipped": [owner_link(owner) for owner in queue.skipped],
            "declared": (d.where if (d := _match(found, OrderedLock, queue.key)) else ""),
        }
        for queue in snapshot.ordered
    ]
    return {
        "at": snapshot.at,
        "locks": locks,
        "semaphores": semaphores,
        "rates": rates,
        "holds": holds,
        "ordered": ordered,
        "cut": snapshot.cut,
        "limit": INSPECT_LIMIT,
    }
