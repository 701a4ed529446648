"""The reactor ``background_throughput.py`` runs: 10 chained no-op steps, all on a worker.

Workers find it by its dotted name ``benchmarks.bg_reactors.Chain10`` (django_reactor's registry
imports the dotted path of a reactor it has not seen), so run them with the repository root on
``PYTHONPATH``.
"""

from __future__ import annotations

import time
from typing import Any, cast

from django_reactor import Reactor, arg, sleep_until, step

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
#: ``capacity.py``: a one-step run, whose costs less a step's are the fixed costs of a run.
Chain1 = _chain("Chain1", 1)


IO_STEPS = 8
IO_SECONDS = 0.1


def io_wait(seconds: float) -> float:
    """A step whose work is waiting on I/O (a partner's API, a file server): ``seconds`` long."""
    time.sleep(seconds)
    return seconds


def _side_by_side(name: str, *, limit: int, background: bool) -> type[Reactor]:
    attrs: dict[str, Any] = {
        f"io{i}": step(io_wait, seconds=arg.value(IO_SECONDS)) for i in range(IO_STEPS)
    }
    meta: dict[str, Any] = {"max_concurrency": limit}
    if background:
        meta["background"] = "all"
    attrs["Meta"] = type("Meta", (), meta)
    return cast("type[Reactor]", type(name, (Reactor,), {"__module__": __name__, **attrs}))


#: ``parallel_steps.py``: eight independent 100 ms I/O steps, side by side and one by one.
IoSideBySide = _side_by_side("IoSideBySide", limit=IO_STEPS, background=False)
IoOneByOne = _side_by_side("IoOneByOne", limit=1, background=False)
IoSideBySideOnWorker = _side_by_side("IoSideBySideOnWorker", limit=IO_STEPS, background=True)


def sleep_then_note(nap: Any = None) -> Any:
    """The step after a sleep: does nothing (the run resumed)."""
    return nap


#: ``sleeping_runs.py``: sleeps until ``at`` (an input), then one no-op step.
NapsUntil = cast(
    "type[Reactor]",
    type(
        "NapsUntil",
        (Reactor,),
        {
            "__module__": __name__,
            "nap": sleep_until(arg.input("at")),
            "after": step(sleep_then_note, nap=arg.result("nap")),
        },
    ),
)
