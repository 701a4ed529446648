"""``map_over(source, Element, ...)``: one step that runs an element reactor for every item.

Each element runs the element reactor (or a single step) with its own arguments: the item
(``arg.element()``) plus any of the map's other arguments, which are resolved once, in the
parent run, and shared by every element. Every element's outcome is stored in its own slot
(``MapResult``); the map's value is ``collect(results)`` or a lazy reader of those slots.

The executor resolves the source and the shared arguments; a :class:`MapRunner` (the Django
layer) stores the elements, runs them (inline, or fanned out to Celery workers, while the run
parks) and rolls them back (its rollback is the step's: completed elements are undone, highest
index first). One element runs in memory through :mod:`..elements`.
"""

from __future__ import annotations

import datetime as dt
import inspect
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ...exceptions import ArgumentResolutionError, DefinitionError, ReactorError
from ...states import EventKind
from ..declarations import StepDeclaration
from ..outcomes import Dispatched, ErrorInfo, ErrorKind, Outcome
from ..serialization import JSONObject
from ..step import Step
from ..templates import ElementRef, ResolutionScope, Template
from .base import (
    INTERRUPTIONS,
    Construct,
    RollbackAction,
    RollbackPending,
    StepDone,
    StepFailed,
    StepHalted,
    StepResult,
    Stop,
    record_nested_rollback,
)

if TYPE_CHECKING:
    from ..context import RunContext
    from ..outcomes import RollbackFailure
    from ..spec import ReactorDefinition, StepSpec
    from ..state import RunState

DEFAULT_BATCH_SIZE = 100
# The module a map step's class names when its element has none: it is part of the shape and
# hash stored with every run, so it stays what runs stored before this module moved here
# (compared as text, never imported).
SHAPE_MODULE = "django_reactor.engine.mapping"


class MapStep(Step):
    """The step a ``map_over()`` declaration makes; the executor runs its elements instead."""

    config: ClassVar[MapConfig]

    def run(self, **arguments: object) -> object:  # pragma: no cover - never called
        raise NotImplementedError("a map runs through the executor's map runner")


@dataclass(frozen=True, slots=True)
class MapConfig:
    """What ``map_over()`` was given (the element's definition is built with the reactor's)."""

    source: Template | Callable[..., object]
    element: type | Callable[..., object]  # a Reactor class, a Step class or a function
    element_arguments: Mapping[str, Template]
    fan_out: bool
    batch_size: int
    chunk_size: int
    atomic: bool
    max_failures: int | float | None
    collect: Callable[[Any], Any] | None
    undo_all: Callable[[Any], Any] | None

    @property
    def element_name(self) -> str:
        return getattr(self.element, "__qualname__", repr(self.element))


@dataclass(frozen=True, slots=True)
class MapSpec:
    """A map step, checked: its configuration and the definition each element runs."""

    config: MapConfig
    element_definition: ReactorDefinition

    @property
    def fan_out(self) -> bool:
        return self.config.fan_out

    def tolerated(self, size: int) -> int | None:
        """Failed elements the map tolerates (None: atomic, the first failure fails it)."""
        limit = self.config.max_failures
        if self.config.atomic:
            return None
        if limit is None:
            return size
        if isinstance(limit, float):
            return int(limit * size)
        return limit

    def resolve_source(self, scope: ResolutionScope, shared: Mapping[str, object]) -> object:
        """The collection to iterate: a template's value, or what the source callable returns.

        Raises ArgumentResolutionError (the map never started) with the reason.
        """
        source = self.config.source
        if isinstance(source, Template):
            return source.resolve(scope)
        try:
            parameters = inspect.signature(source).parameters.values()
            if any(p.kind is p.VAR_KEYWORD for p in parameters):
                return source(**shared)
            names = {p.name for p in parameters}
            return source(**{k: v for k, v in shared.items() if k in names})
        except Exception as exc:
            raise ArgumentResolutionError(
                f"the map's source {getattr(source, '__qualname__', source)!r} raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def element_inputs(self, shared: Mapping[str, object], item: object) -> dict[str, object]:
        """The element reactor's inputs for ``item``: the shared arguments plus the element's."""
        scope = ResolutionScope(inputs={}, results={}, element=item)
        inputs = dict(shared)
        for name, template in self.config.element_arguments.items():
            inputs[name] = template.resolve(scope)
        return inputs


@dataclass(frozen=True, slots=True)
class MapDone:
    """Every element settled and the map succeeded: ``value`` is its result."""

    value: object


@dataclass(frozen=True, slots=True)
class MapStopped:
    """The map failed (an element, the tolerance, or ``collect``) or an element halted."""

    error: ErrorInfo | None = None
    halt_reason: str | None = None


class MapPending:
    """The elements run on workers: the run waits for them (it is woken when they settle)."""


class MapRollbackPending(RollbackPending):
    """The map's elements are being undone on workers; the run waits in ``rolling_back``."""

    reason = "map_rollback"

    def __init__(self, step: str) -> None:
        super().__init__(step, f"the elements of map {step!r} are being undone on workers")

    @property
    def data(self) -> JSONObject:
        """The park's trace entry data."""
        return {"waiting_for": "map rollback", "map": self.step}


class MapSourceError(Exception):
    """The map's source is not iterable, or raised while it was read."""


class MapRunner(Protocol):
    """Stores, runs and rolls back map elements durably (implemented by the Django layer)."""

    def run_map(
        self, step: str, spec: MapSpec, source: object, shared: Mapping[str, object]
    ) -> MapDone | MapStopped | MapPending:
        """Run (or, after a crash, continue) the elements of ``step``."""
        ...

    def map_parked(self, step: str) -> None:
        """The run has parked for the map: wake it at once if the elements settled meanwhile."""
        ...

    def rollback_map(self, step: str, spec: MapSpec) -> list[RollbackFailure]:
        """Undo every completed element, highest index first; raise MapRollbackPending while
        workers are doing it."""
        ...


def map_over(
    source: Template | Callable[..., object],
    element: type | Callable[..., object],
    /,
    *,
    fan_out: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    chunk_size: int | None = None,
    atomic: bool = True,
    max_failures: int | float | None = None,
    collect: Callable[[Any], Any] | None = None,
    undo_all: Callable[[Any], Any] | None = None,
    wait_for: Iterable[str] | str = (),
    **arguments: Any,
) -> StepDeclaration:
    """Declare a step that runs ``element`` for every item of ``source``.

    ``ship = map_over(arg.result("reserve", "items"), ShipItem, item=arg.element(),
    order_id=arg.input("order_id"), fan_out=True, batch_size=100)``.

    ``source`` is ``arg.input(...)``, ``arg.result(...)``, or a callable taking the map's
    other arguments by name; it may give a list, any iterable, or a Django QuerySet (read in
    primary-key order, in chunks). ``element`` is a Reactor class, a Step class or a function;
    each keyword argument becomes one of its inputs, from ``arg.element(...)`` or any template.

    ``atomic=True`` (the default): the first failed element fails the map, no new element
    starts and every completed element is undone, highest index first. ``atomic=False``: the
    map completes with every element's outcome, unless more than ``max_failures`` elements
    fail (a count, or a fraction of the size such as ``0.1``); then it fails like an atomic
    map. ``collect(results)`` turns the results into the map's value; ``undo_all(results)``
    undoes every completed element at once instead of element by element.
    """
    if isinstance(wait_for, str):
        wait_for = (wait_for,)
    wait_for = tuple(wait_for)
    if not isinstance(source, Template) and not callable(source):
        raise DefinitionError(
            "map_over() source must be arg.input(...), arg.result(...) or a callable, "
            f"got {source!r}"
        )
    if isinstance(source, ElementRef):
        raise DefinitionError("map_over() source cannot be arg.element()")
    _check_element(element)
    _check_positive("batch_size", batch_size)
    if chunk_size is None:
        chunk_size = max(1, min(50, batch_size // 2 or 1))
    _check_positive("chunk_size", chunk_size)
    if chunk_size > batch_size:
        raise DefinitionError(
            f"map_over() chunk_size={chunk_size} is larger than batch_size={batch_size}: a task "
            "claims at most batch_size elements"
        )
    if max_failures is not None:
        if atomic:
            raise DefinitionError(
                "map_over(max_failures=...) needs atomic=False: an atomic map fails at its "
                "first failed element"
            )
        if isinstance(max_failures, bool) or not isinstance(max_failures, int | float):
            raise DefinitionError(
                f"max_failures must be a count or a fraction, got {max_failures!r}"
            )
        if isinstance(max_failures, float) and not 0 <= max_failures < 1:
            raise DefinitionError(
                f"max_failures={max_failures} as a fraction must be at least 0 and below 1 "
                "(use a count, or atomic=False without max_failures to tolerate every failure)"
            )
        if isinstance(max_failures, int) and max_failures < 0:
            raise DefinitionError(f"max_failures must not be negative, got {max_failures}")
    for name, fn in (("collect", collect), ("undo_all", undo_all)):
        if fn is not None and not callable(fn):
            raise DefinitionError(f"map_over({name}=...) must be callable, got {fn!r}")
    shared: dict[str, Template] = {}
    per_element: dict[str, Template] = {}
    for name, value in arguments.items():
        if not isinstance(value, Template):
            raise DefinitionError(
                f"map_over() argument {name}={value!r} must be arg.element(...), "
                "arg.input(...), arg.result(...) or arg.value(...)"
            )
        (per_element if isinstance(value, ElementRef) else shared)[name] = value
    if not per_element:
        raise DefinitionError(
            "map_over() passes no arg.element() to its element: add e.g. item=arg.element()"
        )
    if isinstance(source, Template) and source.depends_on:
        wait_for = (*wait_for, source.depends_on)
    config = MapConfig(
        source=source,
        element=element,
        element_arguments=per_element,
        fan_out=bool(fan_out),
        batch_size=batch_size,
        chunk_size=chunk_size,
        atomic=bool(atomic),
        max_failures=max_failures,
        collect=collect,
        undo_all=undo_all,
    )
    label = getattr(element, "__name__", "element")
    impl = type(
        f"Map{label[:1].upper()}{label[1:]}",
        (MapStep,),
        {
            "config": config,
            "__module__": getattr(element, "__module__", SHAPE_MODULE),
            "__doc__": f"Runs {config.element_name} for every element.",
        },
    )
    return StepDeclaration(impl, shared, wait_for=wait_for)


def _check_element(element: object) -> None:
    if isinstance(element, type):
        if getattr(element, "definition", None) is not None or issubclass(element, Step):
            return
        raise DefinitionError(
            f"map_over() element must be a Reactor class, a Step class or a function, "
            f"got class {element.__qualname__}"
        )
    if not callable(element):
        raise DefinitionError(
            "map_over() element must be a Reactor class, a Step class or a function, "
            f"got {element!r}"
        )


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DefinitionError(f"map_over() {name} must be a positive integer, got {value!r}")


def unsupported_in_element(definition: ReactorDefinition) -> list[str]:
    """Steps an element reactor may not have: elements run in memory, one slot each."""
    problems = []
    if definition.max_concurrency > 1:
        problems.append(
            "it declares Meta.max_concurrency, and an element runs its steps one after "
            "another (run more elements at once with batch_size instead)"
        )
    if definition.coordination or any(spec.coordination for spec in definition.steps):
        problems.append(
            "it declares coordination, which map elements do not take (limit them with "
            "batch_size, or declare the coordination on the reactor that declares the map)"
        )
    for spec in definition.steps:
        if spec.unit is not None or spec.child is not None or spec.map is not None:
            kind = "a map" if spec.map is not None else "a composed or async unit"
            problems.append(f"{spec.name!r} is {kind}")
        elif spec.atomic:
            problems.append(
                f"{spec.name!r} is atomic, and elements are recorded together, a chunk at a "
                "time, not each in a transaction of its own (make the element a plain step "
                "that is idempotent, or write its rows in a later atomic step)"
            )
    return problems


class Map(Construct):
    """Runs a map's elements through the executor's map runner; its rollback undoes them."""

    name = "map"

    def claims(self, spec: StepSpec) -> bool:
        return spec.map is not None

    def run(
        self, run: RunContext, spec: StepSpec, arguments: dict[str, object], started_at: dt.datetime
    ) -> StepResult:
        """Run (or continue) the elements: inline, or on workers while the run waits."""
        map_spec = spec.map
        assert map_spec is not None
        runner = map_runner(run, spec)
        try:
            source = map_spec.resolve_source(run.scope, arguments)
        except ArgumentResolutionError as unresolved:
            return StepFailed(run.error_info(unresolved, ErrorKind.ARGUMENT, spec, arguments, 0))
        run.notices.step_started(spec.name, 1)
        t0 = time.perf_counter()
        try:
            outcome = runner.run_map(spec.name, map_spec, source, arguments)
        except MapSourceError as bad:
            return StepFailed(run.error_info(bad, ErrorKind.ARGUMENT, spec, arguments, 0))
        except INTERRUPTIONS as interruption:
            run.abort(
                interruption, spec=spec, arguments=arguments, attempt=1, started_at=started_at
            )
            raise
        duration = (time.perf_counter() - t0) * 1000
        if isinstance(outcome, MapDone):
            return StepDone(outcome.value, attempts=1, duration_ms=duration)
        if isinstance(outcome, MapStopped):
            if outcome.error is None:
                return StepHalted(outcome.halt_reason or "", attempts=1, duration_ms=duration)
            error = ErrorInfo(
                **{
                    **outcome.error._fields(),
                    "step": spec.name,
                    "reactor": run.definition.name,
                    "inputs": run.redacted_inputs(),
                    "arguments": run.redacted_arguments(spec, arguments),
                }
            )
            # Elements that completed are undone by this step's compensation (the map's
            # rollback); the failed ones rolled themselves back.
            return StepFailed(error, started=True, attempts=1)
        return Stop(_park_map(run, spec, runner))

    def parked(self, run: RunContext, spec: StepSpec) -> None:
        """The run parked while workers undo the elements: wake it if they finished."""
        map_runner(run, spec).map_parked(spec.name)

    def rollback(
        self,
        run: RunContext,
        spec: StepSpec,
        action: RollbackAction,
        first: object,
        arguments: dict[str, object],
    ) -> list[RollbackFailure]:
        """Undo the completed elements (failed elements undid theirs); raises
        MapRollbackPending while workers undo them."""
        assert spec.map is not None
        t0 = time.perf_counter()
        failures = map_runner(run, spec).rollback_map(spec.name, spec.map)
        return record_nested_rollback(
            run,
            spec,
            action,
            failures,
            f"{len(failures)} map element rollback(s) failed",
            (time.perf_counter() - t0) * 1000,
        )

    def restore_unfinished(self, state: RunState, spec: StepSpec) -> None:
        """The map halted, or the run stopped while it ran: its completed elements are undone,
        in the step's place."""
        state.rolled_back_in_place(spec.name)


def map_runner(run: RunContext, spec: StepSpec) -> MapRunner:
    """The executor's map runner (its child runner); a map fails loudly without one."""
    runner = run.children
    if runner is None or not hasattr(runner, "run_map"):
        raise ReactorError(
            f"step {spec.name!r} is a map and needs a map runner, but this executor has none"
        )
    return runner  # type: ignore[return-value]


def _park_map(run: RunContext, spec: StepSpec, runner: MapRunner) -> Outcome:
    """The elements run on workers: release the run; the last element to settle wakes it."""
    event = run.event(EventKind.PARK, step=spec.name, data={"waiting_for": "map", "map": spec.name})
    parked = run.park(spec.name, reason="map", delay=run.policy.park_poll, event=event)
    runner.map_parked(spec.name)
    if run.policy.retry_later or run.policy.attached:
        return parked
    return Dispatched(execution_id=run.execution_id, results=dict(run.state.results))


MAP = Map()
