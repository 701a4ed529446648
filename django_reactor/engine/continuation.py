"""Continue-as-new: a run ends completed and hands its loop on to a new run of its reactor.

A long-lived loop (a subscription renewed every month for years) must not grow one run's
trace without bound. The step that ends one round returns :class:`ContinueAsNew` with the
inputs of the next: the step is recorded completed, the run completes, and its *successor* (a
new run of the same reactor on those inputs, validated by ``Inputs`` like any start) is
written in the same transaction as the run's final checkpoint, to start on a worker.

The rules, checked here when a step returns it:

- it ends the run, so it comes from the run's last step: every other step has ended by then
  (make the step depend on the others); otherwise the step fails, naming those steps;
- the successor's inputs must pass the reactor's ``Inputs``, or the step fails naming the
  fields (nothing is created, the run rolls back as for any failed step);
- only a run of its own continues: not a composed child, an async unit or a map's element,
  and not a reactor whose starts are governed by a key (``Meta.concurrency``, ``throttle``,
  ``debounce``, ``batch``) or ordered locks, whose successor would bypass them.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..exceptions import ResultNotSerializable
from .constructs.events import cancel_keys
from .coordination import OrderedLock
from .outcomes import ContinueAsNew, ErrorInfo, ErrorKind
from .redaction import SecretPath
from .serialization import JSONObject, JSONValue, encode
from .templates import ResolutionScope
from .validation import summarise_errors, validate

if TYPE_CHECKING:
    from .context import RunContext
    from .spec import ReactorDefinition, StepSpec

#: The longest idempotency key a run keeps (``Execution.idempotency_key``).
MAX_KEY_LENGTH = 255


@dataclass(frozen=True, slots=True)
class SuccessorWrite:
    """The run a :class:`ContinueAsNew` starts, written with its predecessor's final
    checkpoint (the store adds what it reads from the predecessor's row: its generation, its
    idempotency key, its route)."""

    execution_id: uuid.UUID
    #: The validated inputs, encoded as stored (the store seals the secrets among them).
    inputs: JSONValue
    secret_paths: Sequence[SecretPath]
    subject: str
    has_secrets: bool
    attributes: Mapping[str, str]
    cancel_keys: Sequence[tuple[str, str]]
    #: The step the successor starts at.
    first_step: str
    definition_hash: str
    definition_shape: Mapping[str, object]
    #: ``Meta.version`` of the code that continued: the successor runs on the same version.
    version: str = ""
    #: ``Meta.deadline``, counted from the successor's start (None: none).
    deadline_seconds: float | None = None


def marker(successor: uuid.UUID) -> JSONObject:
    """The stored result of the step that returned ContinueAsNew."""
    return {"continued_as_new": True, "continued_as": str(successor)}


def successor_key(key: str | None, generation: int) -> str | None:
    """The idempotency key of generation ``generation + 1`` of a run whose generation
    ``generation`` holds ``key``: the first generation's key with ``~continued~N`` after it
    (a key too long for that is replaced by its digest). None when the first had none.

    Derived, never chosen: a second creation of the same successor is refused by the key's
    unique constraint, and every generation of a lineage is found from the first's key.
    """
    if key is None:
        return None
    base = key
    if generation > 0:
        base = key.removesuffix(_suffix(generation))
    suffix = _suffix(generation + 1)
    if len(base) + len(suffix) > MAX_KEY_LENGTH:
        base = "sha256:" + hashlib.sha256(base.encode()).hexdigest()
    return base + suffix


def _suffix(generation: int) -> str:
    return f"~continued~{generation}"


def prepare(
    run: RunContext, spec: StepSpec, said: ContinueAsNew, arguments: dict[str, object]
) -> SuccessorWrite | ErrorInfo:
    """The successor ``said`` asks for, or why the step that said it fails (never retried)."""
    definition = run.definition
    refused = _refusal(run, spec, definition)
    if refused is not None:
        return _error(run, spec, refused, arguments)
    if not isinstance(said.inputs, Mapping):
        return _error(
            run,
            spec,
            f"step {spec.name!r} returned ContinueAsNew with inputs of type "
            f"{type(said.inputs).__name__}; give the next run's inputs as a dict",
            arguments,
        )
    data: Mapping[str, Any] = said.inputs
    if definition.inputs_serializer is not None:
        validated, errors = validate(definition.inputs_serializer, said.inputs)
        if errors or validated is None:
            return _error(
                run,
                spec,
                f"step {spec.name!r} returned ContinueAsNew with inputs that "
                f"{definition.reactor_class.__qualname__}.Inputs refuses: "
                f"{summarise_errors(errors)}; fix the inputs the step gives the next run",
                arguments,
                field_errors=errors or {},
            )
        data = validated
    try:
        stored = encode(dict(data))
    except ResultNotSerializable as exc:
        return _error(
            run,
            spec,
            f"step {spec.name!r} returned ContinueAsNew with inputs that cannot be stored: {exc}",
            arguments,
        )
    return SuccessorWrite(
        execution_id=uuid.uuid4(),
        inputs=stored,
        secret_paths=definition.input_secret_paths,
        subject=definition.subject_of(data),
        has_secrets=definition.has_secrets,
        attributes=definition.attributes_of(data),
        cancel_keys=cancel_keys(definition.cancel_on, ResolutionScope(data, {}))
        if definition.cancel_on
        else (),
        first_step=first.name if (first := definition.next_ready(frozenset())) else "",
        definition_hash=definition.definition_hash,
        definition_shape=definition.shape,
        version=definition.version,
        deadline_seconds=definition.deadline,
    )


def _refusal(run: RunContext, spec: StepSpec, definition: ReactorDefinition) -> str | None:
    """Why this run cannot continue as new from ``spec``, or None."""
    if not run.policy.continues:
        return (
            f"step {spec.name!r} returned ContinueAsNew, but this run is part of another "
            "(a composed child, an async unit or a map's element) and cannot continue as new; "
            "return ContinueAsNew from the top-level reactor's last step"
        )
    governed = [
        name
        for name, declared in (
            ("concurrency", definition.concurrency),
            ("throttle", definition.throttle),
            ("debounce", definition.debounce),
            ("batch", definition.batch),
        )
        if declared is not None
    ]
    if any(isinstance(d, OrderedLock) for d in definition.coordination):
        governed.append("coordination (an OrderedLock)")
    if governed:
        return (
            f"step {spec.name!r} returned ContinueAsNew, but "
            f"{definition.reactor_class.__qualname__} declares Meta."
            f"{', Meta.'.join(governed)}, which the next run would bypass; continue-as-new "
            "is for reactors without them"
        )
    pending = [
        s.name for s in definition.steps if s.name != spec.name and s.name not in run.state.done
    ]
    # A step running alongside others is never the last, whichever of them ends first.
    if pending or run.in_branch():
        which = (
            f"steps {', '.join(pending)} had not ended"
            if pending
            else "other steps were still running"
        )
        return (
            f"step {spec.name!r} returned ContinueAsNew while {which}; "
            "ContinueAsNew ends the run, so return it from the last step (give "
            f"{spec.name!r} wait_for= the steps it must come after)"
        )
    return None


def _error(
    run: RunContext,
    spec: StepSpec,
    message: str,
    arguments: dict[str, object],
    *,
    field_errors: JSONObject | None = None,
) -> ErrorInfo:
    return run.step_error(
        spec,
        ErrorKind.CONTINUATION,
        message,
        arguments=arguments,
        field_errors=field_errors or {},
        retryable=False,
    )
