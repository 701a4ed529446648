"""``assert_idempotent``: every step run twice, the run must not change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..engine.step import Step
    from ..reactor import Reactor

from .mocks import impl_with_run, replaced
from .results import DEFAULT_MAX_ROUNDS, ReactorResult, run_reactor

# pytest loads this package through the ``pytest11`` entry point before Django is configured:
# nothing here may import models or settings at import time, so imports are inside functions.


def assert_idempotent(
    reactor: type[Reactor],
    inputs: Mapping[str, Any] | None = None,
    *,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
) -> ReactorResult:
    """Run ``reactor`` with every step's ``run`` called twice with the same arguments.

    A worker that dies mid-step runs that step again, so a step must give the same outcome when
    repeated. Fails naming each step whose second call returned something else or raised.
    Interrupts, composed reactors and async units are run once.
    """
    from ..engine.outcomes import as_step_outcome

    problems: list[str] = []
    impls: dict[str, type[Step]] = {}
    for spec in reactor.definition.steps:
        if spec.interrupt is not None or spec.child is not None or spec.unit is not None:
            continue

        def twice(instance: Step, arguments: dict[str, object], original: Any = spec.impl) -> Any:
            name = instance.context.step
            first = original(instance.context).run(**arguments)
            try:
                second = original(instance.context).run(**arguments)
            except Exception as exc:
                problems.append(
                    f"step {name!r} raised on its second call with the same arguments: "
                    f"{type(exc).__name__}: {exc}"
                )
                return first
            if as_step_outcome(first) != as_step_outcome(second):
                problems.append(
                    f"step {name!r} is not idempotent: its first call returned {first!r}, "
                    f"its second call with the same arguments returned {second!r}"
                )
            return first

        impls[spec.name] = impl_with_run(spec, twice)
    with replaced(reactor, impls):
        result = run_reactor(reactor, inputs, max_rounds=max_rounds)
    if problems:
        raise AssertionError("\n".join(problems) + "\n" + result._describe())
    return result
