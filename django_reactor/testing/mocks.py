"""Replacing steps in a test: ``mock_step`` and ``fail_step``, at nested paths too."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..engine.definition import ReactorDefinition, StepSpec
    from ..engine.step import Step
    from ..reactor import Reactor


# pytest loads this package through the ``pytest11`` entry point before Django is configured:
# nothing here may import models or settings at import time, so imports are inside functions.


@dataclasses.dataclass
class StepMock:
    """A replaced step: ``calls`` holds the arguments of every call of its replacement.

    For a step of map elements, ``indices`` holds the element index of each of those calls.
    """

    reactor: type[Reactor]
    step: str
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    indices: list[int] = dataclasses.field(default_factory=list)

    @property
    def called(self) -> bool:
        return bool(self.calls)


_UNSET: Any = object()
_SEGMENT = re.compile(r"(?P<name>[A-Za-z_]\w*)(?:\[(?P<index>\d+|\*)\])?")


@dataclasses.dataclass(frozen=True)
class _Target:
    """Where a step path leads: step ``step`` of ``owner``, or (``element_step`` given) the
    step ``element_step`` of the elements of ``owner``'s map ``step``."""

    owner: type[Reactor]
    step: str
    spec: StepSpec  # the step replaced: its impl is the original the replacement wraps
    element_step: str | None = None
    index: int | None = None  # the one element replaced (None: every element)

    def definition_with(self, impl: type[Step]) -> ReactorDefinition:
        """``owner``'s current definition with the target step's impl replaced by ``impl``."""
        definition: ReactorDefinition = self.owner.definition
        if self.element_step is None:
            return _with_impl(definition, self.step, impl)
        spec = definition.by_name[self.step]
        assert spec.map is not None
        element = _with_impl(spec.map.element_definition, self.element_step, impl)
        mapped = dataclasses.replace(spec.map, element_definition=element)
        return _with_spec(definition, dataclasses.replace(spec, map=mapped))


def _with_spec(definition: ReactorDefinition, spec: StepSpec) -> ReactorDefinition:
    steps = tuple(spec if s.name == spec.name else s for s in definition.steps)
    return dataclasses.replace(definition, steps=steps, by_name={s.name: s for s in steps})


def _with_impl(definition: ReactorDefinition, step: str, impl: type[Step]) -> ReactorDefinition:
    spec = definition.by_name[step]
    replaced = dataclasses.replace(spec, impl=impl)
    if spec.unit == "step" and spec.unit_definition is not None:
        # An async_step runs as a one-step reactor of its own, found through its parent.
        unit = _with_impl(spec.unit_definition, step, impl)
        replaced = dataclasses.replace(replaced, unit_definition=unit)
    return _with_spec(definition, replaced)


def _child_class(spec: StepSpec) -> Any:
    """The reactor class a compose() or async_reactor() step runs (None for other steps)."""
    if spec.child is not None:
        return spec.child
    if spec.unit == "reactor":
        return getattr(spec.impl, "child", None)
    return None


def _steps_of(definition: ReactorDefinition) -> str:
    return ", ".join(definition.by_name) or "none"


def _resolve(reactor: type[Reactor], path: str) -> _Target:
    """Follow ``path`` ("charge", "ship.pack", "lines[3].charge", "lines[*].charge") from
    ``reactor`` to the step it names; ValueError saying where it leads nowhere."""
    parsed = []
    for segment in path.split("."):
        match = _SEGMENT.fullmatch(segment)
        if match is None:
            raise ValueError(
                f"step path {path!r}: {segment!r} is not a step name, 'name[3]' (one map "
                "element) or 'name[*]' (every map element)"
            )
        parsed.append((match["name"], match["index"]))
    owner = reactor
    for position, (name, index) in enumerate(parsed):
        definition: ReactorDefinition = owner.definition
        where = getattr(owner, "__qualname__", definition.name)
        spec = definition.by_name.get(name)
        if spec is None:
            via = f" (reached by {'.'.join(n for n, _ in parsed[:position])!r})" if position else ""
            raise ValueError(
                f"{where}{via} has no step {name!r}; its steps: {_steps_of(definition)}"
            )
        rest = parsed[position + 1 :]
        if index is not None:
            if spec.map is None:
                raise ValueError(
                    f"step path {path!r}: step {name!r} of {where} is not a map_over() step; "
                    "only a map's elements are chosen with [index]"
                )
            return _element_target(owner, spec, index, rest, path)
        if not rest:
            _check_leaf(where, spec, path)
            return _Target(owner, name, spec)
        child = _child_class(spec)
        if child is None:
            if spec.map is not None:
                raise ValueError(
                    f"step path {path!r}: step {name!r} of {where} is a map; choose its "
                    f"elements: {name}[3].<step> (element 3) or {name}[*].<step> (every element)"
                )
            raise ValueError(
                f"step path {path!r}: step {name!r} of {where} is not a compose() or "
                "async_reactor() step: no steps are nested in it"
            )
        owner = child
    raise AssertionError("unreachable")  # pragma: no cover


def _check_leaf(where: str, spec: StepSpec, path: str) -> None:
    child = _child_class(spec)
    if child is not None:
        raise ValueError(
            f"step {spec.name!r} of {where} runs the reactor {child.__qualname__}; only plain "
            f"steps can be replaced: name one of its steps, {path}.<step> (its steps: "
            f"{_steps_of(child.definition)})"
        )
    if spec.map is not None:
        raise ValueError(
            f"step {spec.name!r} of {where} is a map; only plain steps can be replaced: name an "
            f"element's step, {path}[3].<step> (element 3) or {path}[*].<step> (every element)"
        )
    if spec.interrupt is not None:
        raise ValueError(
            f"step {spec.name!r} of {where} is an interrupt; only plain steps can be replaced "
            "(deliver its payload with ReactorResult.resume(...) instead)"
        )


def _element_target(
    owner: type[Reactor],
    spec: StepSpec,
    index: str,
    rest: list[tuple[str, str | None]],
    path: str,
) -> _Target:
    assert spec.map is not None
    element = spec.map.element_definition
    if len(rest) > 1 or (rest and rest[0][1] is not None):
        raise ValueError(
            f"step path {path!r}: the steps of a map element have nothing nested in them "
            "(an element cannot compose, dispatch or map)"
        )
    if rest:
        inner = element.by_name.get(rest[0][0])
        if inner is None:
            raise ValueError(
                f"step path {path!r}: the elements of map {spec.name!r} have no step "
                f"{rest[0][0]!r}; their steps: {_steps_of(element)}"
            )
    elif len(element.steps) == 1:
        inner = element.steps[0]  # "lines[*]": the element is one step
    else:
        raise ValueError(
            f"step path {path!r}: the elements of map {spec.name!r} have several steps; name "
            f"one: {path}.<step> (their steps: {_steps_of(element)})"
        )
    _check_leaf(element.name, inner, path)
    return _Target(
        owner,
        spec.name,
        inner,
        element_step=inner.name,
        index=None if index == "*" else int(index),
    )


def impl_with_run(
    spec: StepSpec, run: Callable[[Step, dict[str, Any]], Any], index: int | None = None
) -> type[Step]:
    """A subclass of the step's class whose ``run`` is ``run``; undo and compensate stay.

    With ``index``, only map element ``index`` calls ``run``; other elements run the
    original body. It keeps the original's module and qualified name, so the run's stored
    shape does not change: a run started with the replacement can continue without it, and
    back.
    """
    original = spec.impl

    def body(self: Step, **arguments: Any) -> Any:
        if index is not None:
            from ..engine.elements import current_element

            element = current_element()
            if element is None or element.index != index:
                return original.run(self, **arguments)
        return run(self, arguments)

    return type(
        original.__name__,
        (original,),
        {
            "run": body,
            "__module__": original.__module__,
            "__qualname__": original.__qualname__,
        },
    )


@contextlib.contextmanager
def _swapped(reactor: type[Reactor], definition: ReactorDefinition) -> Iterator[None]:
    """Make ``definition`` ``reactor``'s definition while the block runs; restore on exit.

    Workers find reactors through the registry: while the block runs, the registry returns
    this class for its name.
    """
    from .. import registry

    previous: ReactorDefinition = reactor.definition
    registered = registry.all_reactors().get(previous.name)
    reactor.definition = definition
    registry.register(reactor)
    try:
        yield
    finally:
        reactor.definition = previous
        if registered is not None:
            registry.register(registered)


@contextlib.contextmanager
def replaced(reactor: type[Reactor], impls: Mapping[str, type[Step]]) -> Iterator[None]:
    """Swap ``reactor.definition`` for one whose top-level steps use ``impls``."""
    definition: ReactorDefinition = reactor.definition
    for name, impl in impls.items():
        definition = _with_impl(definition, name, impl)
    with _swapped(reactor, definition):
        yield


@contextlib.contextmanager
def mock_step(
    reactor: type[Reactor],
    step: str,
    *,
    returns: Any = _UNSET,
    side_effect: Callable[..., Any] | None = None,
    raises: BaseException | type[BaseException] | None = None,
    wraps: Callable[..., Any] | None = None,
) -> Iterator[StepMock]:
    """Replace the body of ``reactor``'s ``step`` while the block runs.

    ``step`` is a step name or a path to a nested step: ``"ship.pack"`` is step ``pack`` of
    the reactor that step ``ship`` runs (``compose`` or ``async_reactor``; any depth,
    ``"a.b.c"``), ``"lines[3].charge"`` is step ``charge`` of element 3 of the map ``lines``
    (``"lines[*].charge"``: of every element; ``"lines[*]"`` when the element is one step).
    A step of a composed reactor is replaced in that reactor's class, so wherever the class
    runs while the block is open; a step of map elements only in that map.

    Give one of ``returns`` (the value the step returns: a plain value, ``Success``,
    ``Failure``, ``Halt`` or ``Skip``), ``side_effect`` (called with the step's arguments as
    keywords; what it returns or raises is the step's), ``raises`` (an exception to raise) or
    ``wraps`` (called as ``wraps(original, **arguments)``, where ``original(**arguments)``
    runs the step's own body; what it returns or raises is the step's). The step's ``undo``
    and ``compensate`` stay as they are.
    """
    given = [returns is not _UNSET, side_effect is not None, raises is not None, wraps is not None]
    if sum(given) != 1:
        raise TypeError(
            "mock_step() takes exactly one of returns=, side_effect=, raises= or wraps="
        )
    target = _resolve(reactor, step)
    record = StepMock(reactor, step)

    def run(instance: Step, arguments: dict[str, object]) -> Any:
        from ..engine.elements import current_element

        record.calls.append(dict(arguments))
        element = current_element()
        if element is not None:
            record.indices.append(element.index)
        if raises is not None:
            raise raises
        if side_effect is not None:
            return side_effect(**arguments)
        if wraps is not None:
            return wraps(functools.partial(target.spec.impl.run, instance), **arguments)
        return returns

    impl = impl_with_run(target.spec, run, index=target.index)
    with _swapped(target.owner, target.definition_with(impl)):
        yield record


def fail_step(
    reactor: type[Reactor],
    step: str,
    error: BaseException | str = "failed by fail_step()",
    *,
    retryable: bool = False,
) -> contextlib.AbstractContextManager[StepMock]:
    """Make ``step`` fail while the block runs (by default without retries).

    ``step`` is a name or a path, as for :func:`mock_step` (``"ship.pack"``,
    ``"lines[3].charge"``, ``"lines[*].charge"``). ``error`` is an exception to raise or a
    message. With ``retryable=False`` the step returns
    ``Failure(error, retryable=False)``, so its retry policy does not delay the failure.
    """
    from ..engine.outcomes import Failure

    if retryable:
        exc = error if isinstance(error, BaseException) else RuntimeError(error)
        return mock_step(reactor, step, raises=exc)
    return mock_step(reactor, step, returns=Failure(error, retryable=False))
