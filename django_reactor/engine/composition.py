"""``compose(Child, ...)``: a whole reactor run as one step of another.

The child runs in the same process as its parent, as an execution of its own (linked to the
parent), checkpointing its own steps. If it fails it has rolled itself back before the parent
sees the failure; if a later parent step fails, the completed child is undone in place (its own
steps, newest first). A ``Halt`` inside a child halts the parent: a child is part of its
parent's run, and ``Halt`` stops the run it is in. Children are never retried as a whole: put
retries on their steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..exceptions import DefinitionError
from .declarations import StepDeclaration
from .step import Step
from .templates import Template

if TYPE_CHECKING:
    from .definition import ReactorDefinition
    from .outcomes import Outcome, RollbackFailure


class ComposeStep(Step):
    """The step a ``compose()`` declaration makes; the executor runs its child instead."""

    child: ClassVar[type]

    def run(self, **arguments: Any) -> Any:  # pragma: no cover - the executor never calls it
        raise NotImplementedError("a composed reactor runs through the executor's child runner")


class ChildRunner(Protocol):
    """Runs and rolls back composed children durably (implemented by the Django layer)."""

    def run(self, step: str, definition: ReactorDefinition, inputs: Mapping[str, Any]) -> Outcome:
        """Run (or, after a crash, continue) the child of ``step``; return its outcome."""
        ...

    def rollback(self, step: str) -> list[RollbackFailure]:
        """Undo everything the child of ``step`` completed, newest first."""
        ...

    def dispatch(self, step: str, definition: ReactorDefinition, inputs: Mapping[str, Any]) -> Any:
        """Start the async unit of ``step`` on workers (or find it, if already started)."""
        ...

    def settle(self, step: str, *, wait: bool) -> Outcome | None:
        """The unit's outcome; None while it runs (after waiting, when ``wait``).

        Raises UnitWaitTimeout once the unit has taken longer than its reader may wait.
        """
        ...


def _child_declaration(
    child: type, options: dict[str, Any], what: str, base: type[Step], unit: str | None
) -> StepDeclaration:
    definition = getattr(child, "definition", None)
    if not isinstance(child, type) or definition is None:
        raise DefinitionError(f"{what}() takes a Reactor subclass, got {child!r}")
    if unit is None and any(s.interrupt is not None for s in definition.steps):
        raise DefinitionError(
            f"compose({child.__qualname__}): the child has interrupt steps, and a composed child "
            "cannot pause its parent. Declare the interrupt on the parent, or run the child with "
            "async_reactor() (it pauses on its own and its readers wait for it)"
        )
    if "retry" in options:
        raise DefinitionError(
            f"{what}({child.__qualname__}) cannot be retried as a whole: a retried child could "
            "resume with undone steps. Put Retry(...) on the child's steps instead"
        )
    wait_for = options.pop("wait_for", ())
    if isinstance(wait_for, str):
        wait_for = (wait_for,)
    for name, value in options.items():
        if not isinstance(value, Template):
            raise DefinitionError(
                f"{what}({child.__qualname__}) argument {name}={value!r} must be "
                "arg.input(...), arg.result(...) or arg.value(...)"
            )
    impl = type(
        f"{base.__name__.removesuffix('Step')}{child.__name__}",
        (base,),
        {
            "child": child,
            "Inputs": getattr(child, "Inputs", None),
            "__module__": child.__module__,
            "__doc__": f"Runs {child.__qualname__} as one step.",
        },
    )
    return StepDeclaration(impl, dict(options), wait_for=tuple(wait_for), unit=unit)


class AsyncReactorStep(ComposeStep):
    """The step an ``async_reactor()`` declaration makes: dispatches its child to workers."""


def async_reactor(child: type, /, **options: Any) -> StepDeclaration:
    """Declare a step that dispatches the reactor ``child`` as an independent execution.

    The child gets its own id, runs on workers and recovers on its own; the parent never undoes
    it. Its inputs are validated when the step is reached: invalid inputs fail the step and
    create nothing. Steps that read ``arg.result("<name>")`` wait for the child to finish.
    """
    return _child_declaration(child, options, "async_reactor", AsyncReactorStep, "reactor")


def compose(child: type, /, **options: Any) -> StepDeclaration:
    """Declare a step that runs the reactor ``child`` with arguments wired like a step's.

    ``checkout = compose(Checkout, order_id=arg.input("order_id"), wait_for=["reserve"])``.
    The child's ``Inputs`` serializer validates the arguments (a violation fails the step
    without rollback of the child, which never started). The step's result is the child's
    value.
    """
    return _child_declaration(child, options, "compose", ComposeStep, None)
