"""Rate-limit specifications: windows written by people, and the named limits in settings.

A specification is either a mapping of a unit to a limit, ``{"second": 3, "minute": 100}``
(units: second, minute, hour, day, week), or a sequence of ``(limit, seconds)`` pairs,
``[(3, 1), (100, 60)]``, for periods that are not whole units. ``REACTOR["RATE_LIMITS"]`` maps a
name to such a specification; the name is also the key the limit is counted under, so every
reactor and step that uses ``"stripe"`` shares one budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..conf import reactor_settings
from ..exceptions import ReactorImproperlyConfigured
from .exceptions import UnknownRateLimit
from .types import Window

UNITS: dict[str, float] = {
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 604800.0,
}

#: The key prefix of named limits, so a named limit never shares a log with an inline key.
NAMED_PREFIX = "named:"


def parse_windows(spec: Any) -> tuple[Window, ...]:
    """The windows of a specification, shortest period first; ValueError explains a bad one.

    >>> parse_windows({"second": 3, "minute": 100})
    (Window(limit=3, period=1.0), Window(limit=100, period=60.0))
    """
    windows: list[Window] = []
    if isinstance(spec, Window):
        windows.append(spec)
    elif isinstance(spec, Mapping):
        for unit, limit in spec.items():
            if unit not in UNITS:
                raise ValueError(
                    f"unknown rate-limit unit {unit!r}: use one of {', '.join(UNITS)}, or a "
                    "list of (limit, seconds) pairs"
                )
            windows.append(Window(limit, UNITS[unit]))
    elif isinstance(spec, Sequence) and not isinstance(spec, str | bytes):
        for item in spec:
            if isinstance(item, Window):
                windows.append(item)
                continue
            if not isinstance(item, Sequence) or isinstance(item, str | bytes) or len(item) != 2:
                raise ValueError(f"a rate-limit window is a (limit, seconds) pair, got {item!r}")
            windows.append(Window(item[0], item[1]))
    else:
        raise ValueError(
            "a rate limit is a mapping {unit: limit} or a list of (limit, seconds) pairs, "
            f"got {spec!r}"
        )
    if not windows:
        raise ValueError("a rate limit needs at least one window")
    if len({w.period for w in windows}) != len(windows):
        raise ValueError(f"two windows of a rate limit have the same period: {spec!r}")
    return tuple(sorted(windows, key=lambda w: w.period))


def named_rate_limits() -> dict[str, tuple[Window, ...]]:
    """Every limit in ``REACTOR["RATE_LIMITS"]``, parsed; ReactorImproperlyConfigured if bad."""
    configured = reactor_settings.RATE_LIMITS
    if not isinstance(configured, Mapping):
        raise ReactorImproperlyConfigured(
            f'REACTOR["RATE_LIMITS"] must be a dict of name to limit, got {configured!r}'
        )
    parsed: dict[str, tuple[Window, ...]] = {}
    for name, spec in configured.items():
        if not isinstance(name, str) or not name:
            raise ReactorImproperlyConfigured(
                f'REACTOR["RATE_LIMITS"] names must be non-empty strings, got {name!r}'
            )
        try:
            parsed[name] = parse_windows(spec)
        except ValueError as exc:
            raise ReactorImproperlyConfigured(f'REACTOR["RATE_LIMITS"][{name!r}]: {exc}') from exc
    return parsed


def named_rate_limit(name: str) -> tuple[str, tuple[Window, ...]]:
    """The counting key and the windows of the named limit ``name``.

    Raises :class:`UnknownRateLimit` (naming it and the known names) when it is not defined.
    """
    limits = named_rate_limits()
    if name not in limits:
        raise UnknownRateLimit(name, limits)
    return NAMED_PREFIX + name, limits[name]
