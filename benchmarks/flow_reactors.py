"""The reactors of the flow-control benchmarks (``fairness.py``, ``concurrency_cost.py``).

Each is one or two no-op steps, in pairs that differ only by ``Meta.concurrency``: the cost or
the order a key adds is all that differs between the two of a pair. Workers find them by their
dotted names (``benchmarks.flow_reactors.FairKeyed``...), so run them with the repository root
on ``PYTHONPATH``.

The key's limit of ``FairKeyed`` is read from ``FLOW_BENCH_LIMIT`` (default 2) when this module
is imported: the benchmark and its worker must agree on it, and ``fairness.py --limit`` sets it
for both.
"""

from __future__ import annotations

import os
from typing import Any, cast

from django_reactor import Concurrency, Reactor, arg, step

#: Runs in flight per key of ``FairKeyed`` (``fairness.py --limit``).
LIMIT = int(os.environ.get("FLOW_BENCH_LIMIT", "2"))


def noop(tenant: Any = None, prev: Any = None) -> Any:
    """A step that does nothing: returns what it was given."""
    return prev if prev is not None else tenant


def _reactor(
    name: str, *, steps: int, background: bool, concurrency: Concurrency | None
) -> type[Reactor]:
    attrs: dict[str, Any] = {"s0": step(noop, tenant=arg.input("tenant"))}
    for i in range(1, steps):
        attrs[f"s{i}"] = step(noop, prev=arg.result(f"s{i - 1}"))
    meta: dict[str, Any] = {}
    if background:
        meta["background"] = "all"
    if concurrency is not None:
        meta["concurrency"] = concurrency
    attrs["Meta"] = type("Meta", (), meta)
    return cast("type[Reactor]", type(name, (Reactor,), {"__module__": __name__, **attrs}))


#: ``fairness.py``: two no-op steps on a worker, at most ``LIMIT`` runs in flight per tenant.
FairKeyed = _reactor(
    "FairKeyed",
    steps=2,
    background=True,
    concurrency=Concurrency(key="{tenant}", limit=LIMIT, on_limit="queue"),
)
#: ``fairness.py``'s contrast: the same without a concurrency key (plain background runs).
FairPlain = _reactor("FairPlain", steps=2, background=True, concurrency=None)

#: ``concurrency_cost.py``: one no-op step inline, with a key per tenant (limit 1) and without.
CostKeyed = _reactor(
    "CostKeyed",
    steps=1,
    background=False,
    concurrency=Concurrency(key="{tenant}", limit=1, on_limit="queue"),
)
CostPlain = _reactor("CostPlain", steps=1, background=False, concurrency=None)

#: ``concurrency_cost.py --background``: the same one step, run by a worker.
CostKeyedOnWorker = _reactor(
    "CostKeyedOnWorker",
    steps=1,
    background=True,
    concurrency=Concurrency(key="{tenant}", limit=1, on_limit="queue"),
)
CostPlainOnWorker = _reactor("CostPlainOnWorker", steps=1, background=True, concurrency=None)
