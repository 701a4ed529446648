"""The reactors ``events.py`` runs: a no-op step, a wait for ``bench.paid``, a no-op step.

Workers find them by their dotted names (``benchmarks.events_reactors.PaidBackground``...;
django_reactor's registry imports the dotted path of a reactor it has not seen), so run them
with the repository root on ``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any, cast

from django_reactor import Reactor, arg, step, wait_for_event

#: The event both reactors wait for, matched on the run's ``order`` input.
EVENT = "bench.paid"


def noop(prev: Any = None) -> Any:
    """A step that does nothing: returns what it was given."""
    return prev


def _paid(name: str, resume: str) -> type[Reactor]:
    attrs: dict[str, Any] = {
        "__module__": __name__,
        "before": step(noop, prev=arg.input("order")),
        "paid": wait_for_event(EVENT, match=arg.input("order"), resume=resume),
        "after": step(noop, prev=arg.result("paid")),
    }
    return cast("type[Reactor]", type(name, (Reactor,), attrs))


#: A worker runs the rest once the event is given (``resume="background"``).
PaidBackground = _paid("PaidBackground", "background")
#: The emitting process runs the rest itself (``resume="inline"``).
PaidInline = _paid("PaidInline", "inline")
