"""The constructs the executor runs, one module each, behind one protocol (:mod:`.base`).

- :mod:`.step`: a plain step (attempts, retries, halt, skip; undo and compensate);
- :mod:`.coordination`: a plain step under its holds, and the run's holds;
- :mod:`.compose`: a composed child reactor (its rollback is the child's);
- :mod:`.async_unit`: an async unit dispatched to workers (never undone by its parent);
- :mod:`.map`: a map over a collection (its rollback undoes its elements);
- :mod:`.interrupt`: a pause for an external payload;
- :mod:`.sleep`: a wait until a time, holding nothing.

The executor runs each step with the first construct that :meth:`~.base.Construct.claims`
it. A new construct is a module with a :class:`~.base.Construct` subclass, given to
:func:`register`; the executor needs no change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .async_unit import ASYNC_UNIT
from .base import Construct
from .compose import COMPOSE
from .coordination import COORDINATED_STEP
from .interrupt import INTERRUPT
from .map import MAP
from .sleep import SLEEP
from .step import STEP

if TYPE_CHECKING:
    from ..spec import StepSpec

__all__ = ["Construct", "construct_for", "register", "registered", "unregister"]

# In the order they are asked; the plain step, last, claims every step.
_constructs: list[Construct] = [
    INTERRUPT,
    SLEEP,
    ASYNC_UNIT,
    COMPOSE,
    MAP,
    COORDINATED_STEP,
    STEP,
]
# Each spec's construct, by the spec's id; the spec is kept so that its id is not reused.
_chosen: dict[int, tuple[StepSpec, Construct]] = {}


def construct_for(spec: StepSpec) -> Construct:
    """The construct that runs ``spec``: the first, most recently registered first, that
    claims it."""
    chosen = _chosen.get(id(spec))
    if chosen is not None and chosen[0] is spec:
        return chosen[1]
    for construct in _constructs:
        if construct.claims(spec):
            _chosen[id(spec)] = (spec, construct)
            return construct
    raise AssertionError("the plain step claims every step")  # pragma: no cover


def registered() -> tuple[Construct, ...]:
    """Every construct, in the order they are asked."""
    return tuple(_constructs)


def register(construct: Construct) -> None:
    """Add a construct, asked before every construct registered earlier (and the built-in
    ones)."""
    _constructs.insert(0, construct)
    _chosen.clear()


def unregister(construct: Construct) -> None:
    """Remove a construct given to :func:`register`."""
    _constructs.remove(construct)
    _chosen.clear()
