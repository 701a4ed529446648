"""The reactor ``background_throughput.py`` runs: 10 chained no-op steps, all on a worker.

Workers find it by its dotted name ``benchmarks.bg_reactors.Chain10`` (django_reactor's registry
imports the dotted path of a reactor it has not seen), so run them with the repository root on
``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any, cast

from django_reactor import Reactor, arg, step

STEPS = 10


def noop(prev: Any = None) -> Any:
    """A step that does nothing: returns the previous step's result."""
    return prev


def _chain(name: str, steps: int) -> type[Reactor]:
    attrs: dict[str, Any] = {"s0": step(noop)}
    for i in range(1, steps):
        attrs[f"s{i}"] = step(noop, prev=arg.result(f"s{i - 1}"))
    attrs["Meta"] = type("Meta", (), {"background": "all"})
    return cast("type[Reactor]", type(name, (Reactor,), {"__module__": __name__, **attrs}))


Chain10 = _chain("Chain10", STEPS)
