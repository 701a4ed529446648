"""The checked shape of a reactor: :class:`ReactorDefinition` and its :class:`StepSpec` s.

Built by :mod:`.definition` from a reactor class body; read by the executor, its constructs and
the Django layer. Immutable once built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..exceptions import ArgumentResolutionError
from .attributes import Declared, resolve
from .changes import why_blocked
from .constructs.compose import ComposeStep
from .constructs.interrupt import InterruptSpec, InterruptStep
from .coordination import Declaration
from .flow import Batch, Concurrency, Debounce, Throttle
from .redaction import SecretPath
from .retry import Retry
from .routing import Route, route_for
from .step import Signature, Step
from .templates import ResolutionScope, Template

if TYPE_CHECKING:
    from .constructs.events import EventRule
    from .constructs.map import MapSpec
    from .definition import ReactorBase
    from .serialization import JSONValue


@dataclass(frozen=True, slots=True)
class Background:
    """Where a run moves from the caller to a Celery worker (``Meta.background``).

    ``mode`` is ``"all"`` (the whole run), ``"after"`` (after ``step`` completes) or
    ``"before"`` (before ``step`` starts).
    """

    mode: str
    step: str | None = None


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One step of a reactor, fully resolved and checked."""

    name: str
    impl: type[Step]
    arguments: Mapping[str, Template]
    retry: Retry
    wait_for: tuple[str, ...]
    depends_on: frozenset[str]
    contract: type | None
    secret_arguments: Mapping[str, tuple[SecretPath, ...]]
    undo_signature: Signature
    compensate_signature: Signature
    secret_argument_paths: tuple[SecretPath, ...] = ()
    # Secret paths into the step's result (``secret_result=``, an interrupt payload's
    # ``write_only`` fields, a composed child's secret value); ``()`` in it: all of it.
    secret_result_paths: tuple[SecretPath, ...] = ()
    # "step" (async_step) or "reactor" (async_reactor): the body runs as its own execution,
    # described by ``unit_definition``.
    unit: str | None = None
    unit_definition: ReactorDefinition | None = None
    # A map_over() step: its elements and policy.
    map: MapSpec | None = None
    # Lock, Semaphore, RateLimit, Period held around the step's body (keyed on its arguments).
    coordination: tuple[Declaration, ...] = ()
    # The body (and undo, compensate) runs inside the transaction of its checkpoint.
    atomic: bool = False
    # Seconds one attempt may run, and may go without a heartbeat (None: no bound).
    timeout: float | None = None
    heartbeat_timeout: float | None = None

    @property
    def child(self) -> type[ReactorBase] | None:
        """The composed reactor class, for a ``compose()`` step."""
        if self.unit is not None or not issubclass(self.impl, ComposeStep):
            return None
        return getattr(self.impl, "child", None)

    @property
    def interrupt(self) -> InterruptSpec | None:
        """How the run takes this step's payload, for an ``interrupt()`` step."""
        if not issubclass(self.impl, InterruptStep):
            return None
        return self.impl.interrupt

    @property
    def has_undo(self) -> bool:
        return self.impl.has_handler("undo")

    @property
    def has_compensate(self) -> bool:
        return self.impl.has_handler("compensate")

    def argument_secret_paths(self) -> list[SecretPath]:
        """Secret paths into this step's arguments (for redaction and the step record)."""
        return list(self.secret_argument_paths)


@dataclass(frozen=True, slots=True)
class ReactorDefinition:
    """The checked shape of a reactor: steps, their order constraints, inputs and return."""

    name: str
    reactor_class: type
    steps: tuple[StepSpec, ...]
    inputs_serializer: type | None
    input_fields: frozenset[str] | None
    input_secret_paths: tuple[SecretPath, ...]
    returns: str | None
    definition_hash: str
    by_name: Mapping[str, StepSpec] = field(repr=False)
    background: Background | None = None
    # RunObserver classes instantiated for each execution (Meta.middleware), in order.
    middleware: tuple[type, ...] = ()
    # Meta.coordination: held while the run runs, keyed on its inputs.
    coordination: tuple[Declaration, ...] = ()
    # Meta.max_concurrency: how many independent ready steps may run at the same time.
    max_concurrency: int = 1
    # Meta.deadline: seconds a run may take from its start (None: no deadline), and what
    # happens past it: "rollback" (fail and roll back) or "halt" (stop, nothing rolled back).
    deadline: float | None = None
    on_deadline: str = "rollback"
    # Meta.subject: whose secrets the run holds (``arg.input(...)``); they are sealed with that
    # subject's own key, which ``reactor_forget_subject`` deletes.
    subject: Template | None = None
    # Meta.triggers: a run starts for each event of these rules' names (``on_event``).
    triggers: tuple[EventRule, ...] = ()
    # Meta.cancel_on: events that cancel a run in flight whose input matches their key.
    cancel_on: tuple[EventRule, ...] = ()
    # Meta.attributes: the business attributes a run gets when it is created, read from its
    # inputs (``engine.attributes``).
    attributes: Declared = ()
    # Meta.queue and Meta.priority: where the reactor's runs wait (None: not declared, so the
    # caller's choice, a parent's, or the default; see ``engine.routing``).
    queue: str | None = None
    priority: int | None = None
    # Meta.concurrency: how many runs may be in flight per key (``engine.flow``).
    concurrency: Concurrency | None = None
    # Meta.throttle: how many runs may start per period and key (``engine.flow``).
    throttle: Throttle | None = None
    # Meta.debounce: starts of a key close together collapse into one run (``engine.flow``).
    debounce: Debounce | None = None
    # Meta.batch: starts of a key collect into one run receiving their inputs (``engine.flow``).
    batch: Batch | None = None
    # Meta.version: the label each run records (``""``: not declared; the definition's
    # fingerprint, ``definition_hash``, is its version). See ``engine.versions``.
    version: str = ""
    # Meta.version_of: an older version kept in code to finish its runs; it starts none.
    kept: bool = False

    # Secret paths into the run's value (``Execution.result``): the returned step's, or,
    # without ``Meta.returns``, each step's under its name. Worked out once, with the next.
    value_secret_paths: tuple[SecretPath, ...] = field(init=False, repr=False, compare=False)
    # Whether a run stores any secret (inputs, arguments, results).
    has_secrets: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.returns is not None:
            value = self.by_name[self.returns].secret_result_paths
        else:
            value = tuple(
                (spec.name, *path)
                for spec in self.steps
                if spec.unit is None
                for path in spec.secret_result_paths
            )
        object.__setattr__(self, "value_secret_paths", value)
        object.__setattr__(
            self,
            "has_secrets",
            bool(self.input_secret_paths)
            or any(spec.secret_argument_paths or spec.secret_result_paths for spec in self.steps),
        )

    def route(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        inherited: Route | None = None,
    ) -> Route:
        """The route of a new run: ``queue``/``priority`` given by the caller, else
        ``Meta.queue``/``Meta.priority``, else ``inherited`` (a parent's), else the default.
        Raises InvalidRoute naming the argument for a bad ``queue`` or ``priority``."""
        return route_for(
            self.queue, self.priority, queue=queue, priority=priority, inherited=inherited
        )

    def subject_of(self, inputs: Mapping[str, object]) -> str:
        """The run's subject (``Meta.subject`` read from ``inputs``), ``""`` for none (also
        when that input is missing or null)."""
        if self.subject is None:
            return ""
        try:
            value = self.subject.resolve(ResolutionScope(inputs=inputs, results={}))
        except ArgumentResolutionError:
            return ""
        return "" if value is None else str(value)

    def attributes_of(self, inputs: Mapping[str, object], *, strict: bool = True) -> dict[str, str]:
        """The attributes a run on ``inputs`` gets (``Meta.attributes``), as stored text
        (see :func:`.attributes.resolve`; ``strict=False`` for inputs that failed validation)."""
        if not self.attributes:
            return {}
        reactor = self.reactor_class.__qualname__
        return resolve(self.attributes, inputs, reactor=reactor, strict=strict)

    @property
    def shape(self) -> dict[str, dict[str, str | list[str]]]:
        """Each step's implementation and dependencies, stored with every run."""
        return {
            s.name: {
                "impl": f"{s.impl.__module__}.{s.impl.__qualname__}",
                "depends_on": sorted(s.depends_on),
            }
            for s in self.steps
        }

    def incompatibilities(self, stored_shape: Mapping[str, JSONValue], done: set[str]) -> list[str]:
        """Why a run that started under ``stored_shape`` cannot continue under this definition.

        A run may continue when every step it already recorded still exists with the same
        implementation and dependencies; steps it has not reached yet may change.
        """
        current = self.shape
        found = (why_blocked(name, stored_shape, current) for name in sorted(done))
        return [why for why in found if why is not None]

    def step(self, name: str) -> StepSpec:
        return self.by_name[name]

    def ready(
        self, done: set[str] | frozenset[str], skip: set[str] | frozenset[str] = frozenset()
    ) -> list[StepSpec]:
        """Every step whose dependencies are all done, in declaration order, except those done
        and those in ``skip`` (waiting, or in flight)."""
        return [
            spec
            for spec in self.steps
            if spec.name not in done and spec.name not in skip and spec.depends_on <= done
        ]

    def next_ready(
        self, done: set[str] | frozenset[str], waiting: set[str] | frozenset[str] = frozenset()
    ) -> StepSpec | None:
        """The first step, in declaration order, whose dependencies are all done.

        Steps in ``waiting`` (interrupts waiting for their payload) are not offered again.
        """
        for spec in self.steps:
            if spec.name not in done and spec.name not in waiting and spec.depends_on <= done:
                return spec
        return None

    @property
    def interrupts(self) -> tuple[StepSpec, ...]:
        """The reactor's ``interrupt()`` steps, in declaration order."""
        return tuple(s for s in self.steps if s.interrupt is not None)
