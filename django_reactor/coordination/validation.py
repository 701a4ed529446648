"""What is wrong with the coordination settings: the messages a system check would report."""

from __future__ import annotations

from ..conf import reactor_settings
from ..exceptions import ReactorImproperlyConfigured
from .rates import named_rate_limits


def settings_problems() -> list[str]:
    """What is wrong with the coordination settings (for a system check); [] when fine."""
    problems: list[str] = []
    try:
        named_rate_limits()
    except ReactorImproperlyConfigured as exc:
        problems.append(str(exc))
    path = reactor_settings.COORDINATION_BACKEND
    if not isinstance(path, str) or "." not in path:
        problems.append(f'REACTOR["COORDINATION_BACKEND"] must be a dotted path, got {path!r}')
    redis = reactor_settings.COORDINATION_REDIS
    if not isinstance(redis, str) or not redis:
        problems.append(
            f'REACTOR["COORDINATION_REDIS"] must be a cache alias or a redis:// URL, got {redis!r}'
        )
    prefix = reactor_settings.COORDINATION_KEY_PREFIX
    if not isinstance(prefix, str) or not prefix:
        problems.append(
            f'REACTOR["COORDINATION_KEY_PREFIX"] must be a non-empty string, got {prefix!r}'
        )
    return problems
