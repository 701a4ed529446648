"""The dependency graph of a reactor: edges from templates and ``wait_for``, cycle detection."""

from __future__ import annotations

from collections.abc import Sequence
from graphlib import CycleError, TopologicalSorter
from typing import TYPE_CHECKING

from ..exceptions import DefinitionError, DependencyCycleError

if TYPE_CHECKING:
    from .spec import StepSpec


def check(reactor: str, specs: Sequence[StepSpec]) -> None:
    """Reject unknown step references and cycles, naming the reactor and the steps."""
    names = {s.name for s in specs}
    for spec in specs:
        for dep in sorted(spec.depends_on):
            if dep == spec.name:
                raise DependencyCycleError(
                    f"{reactor}.{spec.name} depends on itself (through arg.result or wait_for)"
                )
            if dep not in names:
                how = "waits for" if dep in spec.wait_for else "reads the result of"
                raise DefinitionError(
                    f"{reactor}.{spec.name} {how} step {dep!r}, which {reactor} does not "
                    f"declare (steps: {', '.join(sorted(names)) or 'none'})"
                )
    cycle = find_cycle({s.name: s.depends_on for s in specs})
    if cycle:
        raise DependencyCycleError(
            f"{reactor} has a dependency cycle: {' -> '.join(cycle)}; a step cannot wait, "
            "directly or through others, for a step that waits for it"
        )


def find_cycle(graph: dict[str, frozenset[str]]) -> list[str] | None:
    """Return one cycle as a list of names, each waiting for the next (the first name repeated
    at the end), or None. The detection is the standard library's (``graphlib``)."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as cycle:
        # graphlib lists each node before the one that depends on it; the message reads the
        # other way (a -> b: a waits for b), starting from the first name in declaration order.
        nodes: list[str] = list(reversed(cycle.args[1]))[:-1]
        order = {name: i for i, name in enumerate(graph)}
        first = min(range(len(nodes)), key=lambda i: order.get(nodes[i], len(order)))
        rotated = nodes[first:] + nodes[:first]
        return [*rotated, rotated[0]]
    return None
