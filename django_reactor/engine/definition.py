"""Turning a reactor class body into a validated, immutable :class:`ReactorDefinition`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from ..exceptions import DefinitionError
from . import attributes, planner, routing, timevalues, versions
from .constructs.compose import ComposeStep
from .constructs.events import check_cancel_on, check_triggers
from .constructs.interrupt import InterruptStep
from .constructs.map import MapSpec, MapStep, unsupported_in_element
from .coordination import OrderedLock, check_declarations
from .declarations import StepDeclaration, _function_step
from .flow import (
    BATCH_INPUT,
    Debounce,
    check_batch,
    check_concurrency,
    check_debounce,
    check_throttle,
)
from .observers import RunObserver
from .redaction import SecretPath, secret_paths_of_serializer
from .retry import NO_RETRY, Retry
from .spec import Background, ReactorDefinition, StepSpec
from .step import rollback_signature, run_signature
from .templates import InputRef, Template, parse_path

__all__ = ["Background", "ReactorBase", "ReactorDefinition", "StepSpec", "build_definition"]

META_OPTIONS = frozenset(
    {
        "returns",
        "name",
        "abstract",
        "background",
        "middleware",
        "coordination",
        "max_concurrency",
        "deadline",
        "on_deadline",
        "subject",
        "triggers",
        "cancel_on",
        "attributes",
        "queue",
        "priority",
        "concurrency",
        "throttle",
        "debounce",
        "batch",
        "version",
        "version_of",
    }
)
ON_DEADLINE = ("rollback", "halt")


def _duration(value: object, what: str) -> float | None:
    """An optional declared duration (``Meta.deadline``, a step's timeouts) as seconds."""
    return None if value is None else timevalues.declared(value, what)


def _meta_options(cls: type) -> dict[str, Any]:
    meta = cls.__dict__.get("Meta")
    if meta is None:
        return {}
    options = {k: v for k, v in vars(meta).items() if not k.startswith("_")}
    unknown = set(options) - META_OPTIONS
    if unknown:
        raise DefinitionError(
            f"{cls.__qualname__}.Meta has unknown option(s) {', '.join(sorted(unknown))}; "
            f"known options: {', '.join(sorted(META_OPTIONS))}"
        )
    return options


def _collect_declarations(cls: type) -> dict[str, StepDeclaration]:
    found: dict[str, StepDeclaration] = {}
    for klass in reversed(cls.__mro__):
        namespace = vars(klass)
        bound = {id(v) for v in namespace.values() if isinstance(v, StepDeclaration)}
        for attr, value in namespace.items():
            declaration = value if isinstance(value, StepDeclaration) else None
            owner = getattr(value, "_reactor_rollback_of", None)
            if (
                declaration is None
                and isinstance(owner, StepDeclaration)
                and id(owner) not in bound
            ):
                # ``@reserve.undo`` above ``def reserve(...)``: the rollback function took the
                # step's name, and the step keeps it.
                owner.name = attr
                declaration = owner
            if declaration is not None:
                found.pop(attr, None)  # a redeclaration moves to where the subclass puts it
                found[attr] = declaration
            elif attr in found:
                del found[attr]  # a subclass replaced the step with something else
    return found


def _input_fields(serializer: type | None, reactor: str) -> frozenset[str] | None:
    if serializer is None:
        return None
    try:
        return frozenset(serializer().fields)
    except Exception:  # needs context or the app registry: checked at run time instead
        return None


def build_definition(cls: type, name: str) -> ReactorDefinition:
    """Check a reactor class and build its definition. Raises DefinitionError naming the problem."""
    reactor = cls.__qualname__
    meta = _meta_options(cls)
    inputs_serializer = getattr(cls, "Inputs", None)
    if inputs_serializer is not None and not (
        isinstance(inputs_serializer, type) and hasattr(inputs_serializer, "is_valid")
    ):
        raise DefinitionError(
            f"{reactor}.Inputs must be a DRF serializer class (rest_framework.serializers."
            f"Serializer), got {inputs_serializer!r}"
        )
    input_fields = _input_fields(inputs_serializer, reactor)
    input_secrets = tuple(secret_paths_of_serializer(inputs_serializer))
    batch = check_batch(meta.get("batch"), reactor, input_fields, meta)
    if batch is not None:
        # ``Inputs`` is one start's; the run's inputs are the list of them.
        input_fields = frozenset({BATCH_INPUT})
        input_secrets = tuple((BATCH_INPUT, "*", *path) for path in input_secrets)

    declarations = _collect_declarations(cls)
    result_secrets = {
        step_name: _result_secrets(f"{reactor}.{step_name}", decl)
        for step_name, decl in declarations.items()
    }
    specs = [
        _build_spec(reactor, step_name, decl, input_fields, input_secrets, result_secrets)
        for step_name, decl in declarations.items()
    ]
    specs = [_with_unit(name, cls, spec) for spec in specs]
    by_name = {spec.name: spec for spec in specs}
    planner.check(reactor, specs)

    background = _background(reactor, meta.get("background"), by_name)
    returns = meta.get("returns")
    if returns is not None and returns in by_name and by_name[returns].unit is not None:
        raise DefinitionError(
            f"{reactor}.Meta.returns names {returns!r}, an async unit: its result arrives later "
            "and only to the steps that read it. Return a step that reads it instead"
        )
    if returns is not None and returns not in by_name:
        raise DefinitionError(
            f"{reactor}.Meta.returns names {returns!r}, which is not a step of {reactor} "
            f"(steps: {', '.join(by_name) or 'none'})"
        )
    middleware = _middleware(reactor, meta.get("middleware", ()))
    max_concurrency = meta.get("max_concurrency", 1)
    if (
        isinstance(max_concurrency, bool)
        or not isinstance(max_concurrency, int)
        or max_concurrency < 1
    ):
        raise DefinitionError(
            f"{reactor}.Meta.max_concurrency must be a positive whole number (how many "
            f"independent steps may run at the same time; 1 runs them one after another), got "
            f"{max_concurrency!r}"
        )
    coordination = check_declarations(meta.get("coordination"), f"{reactor}.Meta.coordination")
    subject = _subject(reactor, meta.get("subject"), input_fields)
    triggers = check_triggers(meta.get("triggers"), reactor)
    cancel_on = check_cancel_on(meta.get("cancel_on"), reactor, input_fields)
    declared_attributes = attributes.declared(
        meta.get("attributes"), reactor, input_fields, input_secrets
    )
    deadline = _duration(meta.get("deadline"), f"{reactor}.Meta.deadline")
    on_deadline = meta.get("on_deadline", "rollback")
    if on_deadline not in ON_DEADLINE:
        raise DefinitionError(
            f'{reactor}.Meta.on_deadline must be "rollback" (fail and roll back) or "halt" '
            f"(stop, nothing rolled back), got {on_deadline!r}"
        )
    queue, priority = routing.declared(reactor, meta.get("queue"), meta.get("priority"))
    return ReactorDefinition(
        name=name,
        reactor_class=cls,
        steps=tuple(specs),
        inputs_serializer=inputs_serializer,
        input_fields=input_fields,
        input_secret_paths=input_secrets,
        returns=returns,
        definition_hash=_hash(specs, returns),
        by_name=by_name,
        background=background,
        middleware=middleware,
        coordination=coordination,
        max_concurrency=max_concurrency,
        deadline=deadline,
        on_deadline=on_deadline,
        subject=subject,
        triggers=triggers,
        cancel_on=cancel_on,
        attributes=declared_attributes,
        queue=queue,
        priority=priority,
        concurrency=check_concurrency(meta.get("concurrency"), reactor, input_fields),
        throttle=check_throttle(meta.get("throttle"), reactor, input_fields),
        debounce=_debounce(reactor, meta, input_fields),
        batch=batch,
        version=versions.declared_version(meta.get("version"), reactor),
        kept=meta.get("version_of") is not None,
    )


def _debounce(
    reactor: str, meta: Mapping[str, Any], input_fields: frozenset[str] | None
) -> Debounce | None:
    """``Meta.debounce``, which a throttle cannot share a reactor with: a debounced run's start
    time is its key's quiet time, not a throttle's slot."""
    debounce = check_debounce(meta.get("debounce"), reactor, input_fields)
    if debounce is not None and meta.get("throttle") is not None:
        raise DefinitionError(
            f"{reactor}.Meta declares both debounce and throttle: a debounced run starts when "
            "its key is quiet, which a throttle cannot delay further. Keep one of them"
        )
    return debounce


def _subject(reactor: str, option: object, input_fields: frozenset[str] | None) -> InputRef | None:
    """``Meta.subject``: ``arg.input(...)``, the input that names whose secrets a run holds."""
    if option is None:
        return None
    if not isinstance(option, InputRef):
        raise DefinitionError(
            f"{reactor}.Meta.subject must be arg.input(...), the input that names whose "
            f'secrets a run holds (Meta.subject = arg.input("customer_id")), got {option!r}'
        )
    if input_fields is not None and option.name not in input_fields:
        raise DefinitionError(
            f"{reactor}.Meta.subject reads input {option.name!r}, which {reactor}.Inputs does "
            f"not declare (inputs: {', '.join(sorted(input_fields)) or 'none'})"
        )
    return option


def _result_secrets(where: str, decl: StepDeclaration) -> tuple[SecretPath, ...]:
    """Secret paths into a step's result: ``secret_result=`` (or the step class's), the
    ``write_only`` fields of an interrupt's payload, a composed reactor's secret value."""
    impl = decl.impl
    option = decl.secret_result if decl.secret_result is not None else impl.secret_result
    found: list[SecretPath] = []
    if option is True:
        found.append(())
    elif isinstance(option, str):
        found.append(parse_path(option))
    elif isinstance(option, list | tuple) and all(isinstance(p, str) for p in option):
        found.extend(parse_path(p) for p in option)
    elif option is not False:
        raise DefinitionError(
            f"{where}: secret_result must be True, False, a dotted path into the result "
            f'("api_key", "cards.*.number") or a list of them, got {option!r}'
        )
    if issubclass(impl, InterruptStep):
        found.extend(secret_paths_of_serializer(impl.interrupt.payload))
    child = getattr(impl, "child", None) if issubclass(impl, ComposeStep) else None
    child_definition = getattr(child, "definition", None)
    if isinstance(child_definition, ReactorDefinition):
        found.extend(child_definition.value_secret_paths)
    return tuple(dict.fromkeys(found))


def _middleware(reactor: str, option: object) -> tuple[type, ...]:
    classes = tuple(option) if isinstance(option, list | tuple) else None
    if classes is None or not all(
        isinstance(c, type) and issubclass(c, RunObserver) for c in classes
    ):
        raise DefinitionError(
            f"{reactor}.Meta.middleware must be a list of RunObserver subclasses "
            f"(django_reactor.engine.observers.RunObserver), got {option!r}"
        )
    return classes


def _with_map(name: str, cls: type, spec: StepSpec) -> StepSpec:
    """Attach the definition each element of a ``map_over()`` step runs."""
    if not issubclass(spec.impl, MapStep):
        return spec
    config = spec.impl.config
    where = f"{cls.__qualname__}.{spec.name}"
    element = config.element
    names = frozenset(spec.arguments) | frozenset(config.element_arguments)
    element_definition = getattr(element, "definition", None)
    if isinstance(element_definition, ReactorDefinition):
        fields = element_definition.input_fields
        if fields is not None and not names <= fields:
            raise DefinitionError(
                f"{where}: map_over() passes {', '.join(sorted(names - fields))} to "
                f"{element.__qualname__}, whose Inputs do not declare it (inputs: "
                f"{', '.join(sorted(fields)) or 'none'})"
            )
    else:
        impl = element if isinstance(element, type) else _function_step(element)
        element_name = f"{name}:{spec.name}"
        step_name = getattr(element, "__name__", "element")
        declaration = StepDeclaration(impl, {n: InputRef(name=n) for n in sorted(names)})
        element_spec = _build_spec(element_name, step_name, declaration, names, (), {})
        element_definition = ReactorDefinition(
            name=element_name,
            reactor_class=cls,
            steps=(element_spec,),
            inputs_serializer=None,
            input_fields=names,
            input_secret_paths=(),
            returns=step_name,
            definition_hash=_hash([element_spec], step_name),
            by_name={step_name: element_spec},
        )
    problems = unsupported_in_element(element_definition)
    if problems:
        raise DefinitionError(
            f"{where}: map elements run in memory, one stored slot each, so the element "
            f"reactor cannot have compose, async or map steps nor coordination "
            f"({'; '.join(problems)})"
        )
    return dataclasses.replace(spec, map=MapSpec(config, element_definition))


def _with_unit(name: str, cls: type, spec: StepSpec) -> StepSpec:
    """Attach the definition an async unit runs as (its own one-step reactor for async_step)."""
    spec = _with_map(name, cls, spec)
    if spec.unit == "reactor":
        return dataclasses.replace(spec, unit_definition=spec.impl.child.definition)  # type: ignore[attr-defined]
    if spec.unit != "step":
        return spec
    unit_name = f"{name}:{spec.name}"
    wiring: dict[str, Template] = {arg: InputRef(name=arg) for arg in spec.arguments}
    declaration = StepDeclaration(
        spec.impl, wiring, retry=spec.retry, coordination=list(spec.coordination)
    )
    arguments = frozenset(spec.arguments)
    secrets = tuple(spec.secret_argument_paths)
    unit_spec = _build_spec(
        unit_name, spec.name, declaration, arguments, secrets, {spec.name: spec.secret_result_paths}
    )
    unit = ReactorDefinition(
        name=unit_name,
        reactor_class=cls,
        steps=(unit_spec,),
        inputs_serializer=None,
        input_fields=arguments,
        input_secret_paths=secrets,
        returns=spec.name,
        definition_hash=_hash([unit_spec], spec.name),
        by_name={spec.name: unit_spec},
    )
    return dataclasses.replace(spec, unit_definition=unit)


def _background(reactor: str, option: object, steps: Mapping[str, StepSpec]) -> Background | None:
    if option is None:
        return None
    if option == "all":
        return Background("all")
    if isinstance(option, dict) and len(option) == 1:
        ((mode, step_name),) = option.items()
        if mode in ("after", "before"):
            if step_name not in steps:
                raise DefinitionError(
                    f"{reactor}.Meta.background hands off {mode} {step_name!r}, which is not a "
                    f"step of {reactor} (steps: {', '.join(steps) or 'none'})"
                )
            if mode == "after" and steps[step_name].interrupt is not None:
                # The run pauses there and whoever delivers the payload runs the rest (as the
                # interrupt's resume= says): no caller is left to hand anything off.
                raise DefinitionError(
                    f"{reactor}.Meta.background hands off after {step_name!r}, an interrupt: "
                    "the run pauses there and the rest runs where its payload is delivered, "
                    f'so nothing is handed off. Use interrupt(resume="background") to have a '
                    f'worker run the rest, or {{"before": {step_name!r}}} to hand off before it'
                )
            return Background(mode, step_name)
    raise DefinitionError(
        f'{reactor}.Meta.background must be "all", {{"after": "<step>"}} or '
        f'{{"before": "<step>"}} (exactly one hand-off point), got {option!r}'
    )


def _build_spec(
    reactor: str,
    name: str,
    decl: StepDeclaration,
    input_fields: frozenset[str] | None,
    input_secrets: tuple[SecretPath, ...],
    result_secrets: Mapping[str, tuple[SecretPath, ...]],
) -> StepSpec:
    where = f"{reactor}.{name}"
    impl = decl.impl
    contract = getattr(impl, "Inputs", None)
    if contract is not None and not (isinstance(contract, type) and hasattr(contract, "is_valid")):
        raise DefinitionError(f"{where}: {impl.__qualname__}.Inputs must be a DRF serializer class")
    body = run_signature(impl)
    contract_fields = _contract_fields(contract)

    arguments: dict[str, Template] = dict(decl.wiring)
    for arg_name, template in arguments.items():
        if contract_fields is not None and arg_name not in contract_fields:
            raise DefinitionError(
                f"{where}: argument {arg_name!r} is not a field of {impl.__qualname__}.Inputs "
                f"(fields: {', '.join(sorted(contract_fields))})"
            )
        if contract_fields is None and not body.accepts(arg_name):
            raise DefinitionError(
                f"{where}: {impl.__qualname__}.run() takes no argument {arg_name!r} "
                f"(it takes: {', '.join(sorted(body.accepted)) or 'nothing'})"
            )
        if (
            isinstance(template, InputRef)
            and input_fields is not None
            and template.name not in input_fields
        ):
            raise DefinitionError(
                f"{where}: argument {arg_name!r} reads input {template.name!r}, which "
                f"{reactor}.Inputs does not declare (inputs: "
                f"{', '.join(sorted(input_fields)) or 'none'})"
            )

    required = contract_fields_required(contract) if contract is not None else body.required
    for needed in sorted(required - set(arguments)):
        if input_fields is not None and needed in input_fields:
            arguments[needed] = InputRef(name=needed)  # wired by name from the reactor input
        else:
            raise DefinitionError(
                f"{where}: {impl.__qualname__} needs argument {needed!r} but nothing provides "
                f"it; add {needed}=arg.input(...) or {needed}=arg.result(...) to the step, "
                f"or declare an input named {needed!r} on {reactor}.Inputs"
            )

    retry = decl.retry or getattr(impl, "retry", None) or NO_RETRY
    if not isinstance(retry, Retry):
        raise DefinitionError(f"{where}: {impl.__qualname__}.retry must be a Retry(...)")

    depends = {t.depends_on for t in arguments.values() if t.depends_on} | set(decl.wait_for)
    if issubclass(impl, InterruptStep):
        correlation = impl.interrupt.correlation_id
        if decl.unit is not None:
            raise DefinitionError(f"{where}: an interrupt cannot be an async unit")
        if isinstance(correlation, Template) and correlation.depends_on:
            depends.add(correlation.depends_on)
    secret_arguments = {
        arg_name: tuple(paths)
        for arg_name, template in arguments.items()
        if (paths := template.secret_paths(input_secrets, result_secrets))
    }
    for field_path in secret_paths_of_serializer(contract):
        secret_arguments[field_path[0]] = (*secret_arguments.get(field_path[0], ()), field_path[1:])

    atomic = decl.atomic if decl.atomic is not None else getattr(impl, "atomic", False)
    if not isinstance(atomic, bool):
        raise DefinitionError(f"{where}: {impl.__qualname__}.atomic must be True or False")
    if atomic and decl.unit is not None:
        raise DefinitionError(
            f"{where}: an async unit cannot be atomic: it runs in a Celery task of its own, "
            "outside the transaction that records this step, so its writes could not commit "
            "with it. Use step(..., atomic=True) for a step whose database writes must happen "
            "once"
        )
    timeout = _duration(
        decl.timeout if decl.timeout is not None else getattr(impl, "timeout", None),
        f"{where}: timeout",
    )
    heartbeat_timeout = _duration(
        decl.heartbeat_timeout
        if decl.heartbeat_timeout is not None
        else getattr(impl, "heartbeat_timeout", None),
        f"{where}: heartbeat_timeout",
    )
    if (timeout or heartbeat_timeout) and atomic:
        raise DefinitionError(
            f"{where}: an atomic step is bounded by REACTOR['ATOMIC_STEP_TIMEOUT'] (its "
            "transaction's statements are cancelled there); it takes no timeout= or "
            "heartbeat_timeout="
        )
    if atomic and impl.has_handler("compensate"):
        raise DefinitionError(
            f"{where}: an atomic step has nothing to compensate: when it fails, its writes are "
            f"rolled back with its transaction. Remove {impl.__qualname__}.compensate(), or "
            "make the step not atomic"
        )
    declared = decl.coordination if decl.coordination is not None else impl.coordination
    coordination = check_declarations(declared, f"{where} coordination")
    misplaced = [type(d).__name__ for d in coordination if isinstance(d, OrderedLock)]
    if misplaced:
        raise DefinitionError(
            f"{where}: an OrderedLock orders whole runs; declare it in Meta.coordination"
        )
    return StepSpec(
        coordination=coordination,
        atomic=atomic,
        timeout=timeout,
        heartbeat_timeout=heartbeat_timeout,
        unit=decl.unit,
        name=name,
        impl=impl,
        arguments=arguments,
        retry=retry,
        wait_for=decl.wait_for,
        depends_on=frozenset(depends),
        contract=contract,
        secret_arguments=secret_arguments,
        undo_signature=rollback_signature(impl, "undo"),
        compensate_signature=rollback_signature(impl, "compensate"),
        secret_argument_paths=tuple(
            (arg_name, *sub) for arg_name, subs in secret_arguments.items() for sub in subs
        ),
        secret_result_paths=result_secrets.get(name, ()),
    )


def _contract_fields(contract: type | None) -> frozenset[str] | None:
    if contract is None:
        return None
    try:
        return frozenset(contract().fields)
    except Exception:
        return None


def contract_fields_required(contract: type) -> frozenset[str]:
    try:
        fields = contract().fields
    except Exception:
        return frozenset()
    return frozenset(
        name
        for name, fld in fields.items()
        if getattr(fld, "required", False) and not getattr(fld, "read_only", False)
    )


def _hash(specs: list[StepSpec], returns: str | None) -> str:
    shape = {
        "steps": [
            {
                "name": s.name,
                "impl": f"{s.impl.__module__}.{s.impl.__qualname__}",
                "depends_on": sorted(s.depends_on),
                "arguments": sorted(s.arguments),
            }
            for s in specs
        ],
        "returns": returns,
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


class _ClassBody(dict[str, object]):
    """A reactor's class body as it runs: a name bound to a second step declaration is refused,
    since the second step would silently replace the first and their results collide under
    one name (a rollback function may take its step's name: ``@reserve.undo def reserve``)."""

    def __setitem__(self, key: str, value: object) -> None:
        previous = self.get(key)
        if (
            isinstance(previous, StepDeclaration)
            and isinstance(value, StepDeclaration)
            and previous is not value
        ):
            owner = self.get("__qualname__", "the reactor")
            raise DefinitionError(
                f"{owner}: step {key!r} is declared twice; the second declaration would replace "
                "the first, and their results would collide under one name. Give each step a "
                "name of its own"
            )
        super().__setitem__(key, value)


class ReactorType(type):
    """The metaclass of reactors: runs class bodies in a :class:`_ClassBody`."""

    @classmethod
    def __prepare__(metacls, name: str, bases: tuple[type, ...], **kwargs: Any) -> _ClassBody:  # type: ignore[override]
        return _ClassBody()


class ReactorBase(metaclass=ReactorType):
    """Engine half of :class:`django_reactor.Reactor`: builds the definition at class creation."""

    Inputs: ClassVar[type | None] = None
    definition: ClassVar[ReactorDefinition]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        meta = _meta_options(cls)
        cls.definition = build_definition(cls, versions.declared_name(cls, meta))
        cls._on_defined(abstract=bool(meta.get("abstract", False)))

    @classmethod
    def _on_defined(cls, *, abstract: bool) -> None:
        """Hook for the Django layer (registration)."""
