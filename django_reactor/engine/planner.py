"""The dependency graph of a reactor: edges from templates and ``wait_for``, cycle detection."""

from __future__ import annotations

from collections.abc import Sequence
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
    """Return one cycle as a list of names (first name repeated at the end), or None."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = grey
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if colour.get(dep) == grey:
                return [*stack[stack.index(dep) :], dep]
            if colour.get(dep) == white:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        colour[node] = black
        return None

    for node in graph:
        if colour[node] == white:
            found = visit(node)
            if found:
                return found
    return None
