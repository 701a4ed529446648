"""The hook crash tests attach to, to stop a process at a named place.

The engine and the store call ``active(point, step)`` at the places a crash is interesting
(``before_step``, ``after_step_commit``, ``before_publish``, ...) when it is set, and cost one
test of a module global otherwise. ``django_reactor.faults.install()`` sets it, when the
``REACTOR_FAULTS`` environment variable arms fault rules, as Django starts.
"""

from __future__ import annotations

from collections.abc import Callable

#: ``(point, step) -> None``; None in production.
active: Callable[[str, str], None] | None = None
