"""``interrupt(...)``: a step that pauses the run until an external payload arrives.

The payload is validated by a DRF serializer before anything changes; the accepted payload is
the interrupt step's result, read by later steps with ``arg.result("<name>")``::

    class Refund(Reactor):
        request = step(RequestRefund, order_id=arg.input("order_id"))
        approval = interrupt(
            after=["request"],
            payload=ApprovalSerializer,
            correlation_id=lambda run: f"refund-{run.inputs['order_id']}",
            timeout=dt.timedelta(days=2),
            on_timeout="fail",
            max_attempts=3,
            resume="background",
        )
        refund = step(IssueRefund, approval=arg.result("approval"))

Reaching an interrupt records that the run waits for it (its row, with a correlation id and a
resume token) and the run goes on with the other ready steps; when nothing else can run, the
run pauses. A payload accepted while it is paused is the step's result when it continues.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ...exceptions import CorrelationIdTaken, DefinitionError
from ...states import EventKind, ExecutionStatus, StepStatus
from .. import timevalues
from ..declarations import StepDeclaration
from ..journal import (
    Event,
    EventWaitWrite,
    InterruptWrite,
    JournalBatch,
    RecordedStep,
    StepWrite,
)
from ..outcomes import ErrorKind, Outcome, Paused, PendingInterrupt, exception_message
from ..serialization import decode, encode, safe_repr, unstorable
from ..step import Step
from ..templates import ResolutionScope, Template
from .base import CONTINUE, Construct, StepFailed, StepResult

if TYPE_CHECKING:
    from ..context import RunContext
    from ..spec import StepSpec
    from ..state import RunState

RESUME_MODES = ("inline", "background")
# The module and name an interrupt step's class records in the shape and hash stored with every
# run: what runs stored before this module moved here, so that they resume. They are compared
# as text and never imported.
SHAPE_MODULE = "django_reactor.engine.interrupts"


@dataclass(frozen=True, slots=True)
class ContinueWith:
    """``on_timeout=ContinueWith(payload)``: an expired interrupt resumes with this payload."""

    payload: object


@dataclass(frozen=True, slots=True)
class InterruptSpec:
    """How one interrupt takes its payload (checked when the reactor class is defined)."""

    payload: type | None
    correlation_id: Callable[[ResolutionScope], object] | Template | None
    timeout: float | None  # seconds
    on_timeout: str | ContinueWith
    max_attempts: int | None
    resume: str
    # A ``receive(topic)`` step: the run's messages sent to this topic are its payloads.
    topic: str | None = None

    # A ``wait_for_event(name)`` step: the events emitted with this name are its payloads.
    event: EventWait | None = None

    def correlation_for(self, scope: ResolutionScope) -> str | None:
        """The correlation id for a run (``scope`` resolves templates); None without one.

        Raises ValueError with a plain reason when the callable fails or returns no string.
        """
        return key_for(self.correlation_id, scope, "correlation_id")


@dataclass(frozen=True, slots=True)
class EventWait:
    """What a ``wait_for_event`` waits for: events named ``name`` whose key is the value of
    ``match`` for the run (any key, without one), emitted since ``lookback`` seconds before
    the run reached the step."""

    name: str
    match: Callable[[ResolutionScope], object] | Template | None
    lookback: float


def key_for(
    source: Callable[[ResolutionScope], object] | Template | None,
    scope: ResolutionScope,
    what: str,
) -> str | None:
    """The key ``source`` (a template, or ``callable(run)``) gives for a run: a correlation
    id, an event's match value; None without a source.

    Raises ValueError with a plain reason when the callable fails or gives no string.
    """
    if source is None:
        return None
    try:
        value = source.resolve(scope) if isinstance(source, Template) else source(scope)
    except Exception as exc:
        raise ValueError(f"{what} raised {type(exc).__name__}: {exception_message(exc)}") from exc
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value or len(value) > 255:
        raise ValueError(
            f"{what} must give a non-empty string of at most 255 characters, got {safe_repr(value)}"
        )
    problem = unstorable(value)
    if problem is not None:
        raise ValueError(f"{what} gave text the database cannot store: {problem}")
    return value


class InterruptStep(Step):
    """The step an ``interrupt()`` declaration makes; the executor pauses there instead."""

    interrupt: ClassVar[InterruptSpec]

    def run(self, **arguments: object) -> object:  # pragma: no cover - never called
        raise NotImplementedError("an interrupt's result is its payload; it has no body")


def interrupt(
    *,
    after: Iterable[str] | str = (),
    payload: type | None = None,
    correlation_id: Callable[[ResolutionScope], object] | Template | None = None,
    timeout: float | dt.timedelta | None = None,
    on_timeout: str | ContinueWith = "fail",
    max_attempts: int | None = None,
    resume: str = "inline",
) -> StepDeclaration:
    """Declare a point where the run pauses until a payload is delivered.

    - ``after``: the steps that must be done first (the interrupt has no arguments of its own).
    - ``payload``: a DRF serializer class validating the payload; its ``validated_data`` is the
      step's result. Without one, any JSON object is accepted as is.
    - ``correlation_id``: ``callable(run) -> str`` (``run.inputs`` and ``run.results`` are the
      run's inputs and the results so far) or ``arg.input(...)`` / ``arg.result(...)``: another
      key to resume by, unique among the reactor's waiting runs.
    - ``timeout`` (seconds or a ``timedelta``) and ``on_timeout``: ``"fail"`` (the run is undone
      and fails) or ``ContinueWith(payload)`` (the run goes on with that payload). The sweeper
      enforces it; a payload that comes later is refused.
    - ``max_attempts``: after this many invalid payloads the run is undone and fails with the
      field errors; without it, invalid payloads are counted and the run stays paused.
    - ``resume``: ``"inline"`` (the deliverer's process runs the rest and gets the outcome) or
      ``"background"`` (the deliverer validates and claims, a worker runs the rest).
    """
    if isinstance(after, str):
        after = (after,)
    after = tuple(after)
    if not all(isinstance(name, str) for name in after):
        raise DefinitionError(f"interrupt(after=...) must name steps as strings, got {after!r}")
    if payload is not None and not (isinstance(payload, type) and hasattr(payload, "is_valid")):
        raise DefinitionError(
            f"interrupt(payload=...) must be a DRF serializer class, got {payload!r}"
        )
    if correlation_id is not None and not (
        isinstance(correlation_id, Template) or callable(correlation_id)
    ):
        raise DefinitionError(
            "interrupt(correlation_id=...) must be a callable (run) -> str, or "
            f"arg.input(...) / arg.result(...), got {correlation_id!r}"
        )
    seconds = None if timeout is None else timevalues.declared(timeout, "interrupt(timeout=...)")
    if not (on_timeout == "fail" or isinstance(on_timeout, ContinueWith)):
        raise DefinitionError(
            f'interrupt(on_timeout=...) must be "fail" or ContinueWith(payload), got {on_timeout!r}'
        )
    if max_attempts is not None and (
        not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
    ):
        raise DefinitionError(
            f"interrupt(max_attempts=...) must be a positive integer or None, got {max_attempts!r}"
        )
    if resume not in RESUME_MODES:
        raise DefinitionError(
            f'interrupt(resume=...) must be "inline" or "background", got {resume!r}'
        )
    spec = InterruptSpec(payload, correlation_id, seconds, on_timeout, max_attempts, resume)
    impl = type("Interrupt", (InterruptStep,), {"interrupt": spec, "__module__": SHAPE_MODULE})
    return StepDeclaration(impl, {}, wait_for=after)


class InterruptConstruct(Construct):
    """Records an interrupt reached, pauses the run, records the payloads it was given."""

    name = "interrupt"

    def claims(self, spec: StepSpec) -> bool:
        return spec.interrupt is not None

    def run(
        self, run: RunContext, spec: StepSpec, arguments: dict[str, object], started_at: dt.datetime
    ) -> StepResult:
        """Record that the run waits at ``spec`` for a payload; other ready steps go on."""
        interrupt = spec.interrupt
        assert interrupt is not None
        waits_for = interrupt.event
        try:
            correlation = interrupt.correlation_for(run.scope)
            event_key = (
                key_for(waits_for.match, run.scope, "match") if waits_for is not None else None
            )
        except ValueError as exc:
            return _correlation_failure(run, spec, f"interrupt {spec.name!r}: {exc}")
        now = run.clock()
        expires_at = (
            now + dt.timedelta(seconds=interrupt.timeout) if interrupt.timeout is not None else None
        )
        token = secrets.token_urlsafe(32) if run.policy.issue_tokens else None
        event = interrupt_event(run, spec.name, correlation, expires_at)
        batch = JournalBatch(
            events=[event],
            step=StepWrite.of(spec, StepStatus.WAITING, event, 0, {}, started_at),
            current_step=spec.name,
            interrupt=InterruptWrite(
                spec.name,
                correlation,
                expires_at,
                interrupt.max_attempts,
                interrupt.resume,
                hashlib.sha256(token.encode()).hexdigest() if token else None,
                event=None
                if waits_for is None
                else EventWaitWrite(
                    waits_for.name, event_key, now - dt.timedelta(seconds=waits_for.lookback)
                ),
            ),
        )
        try:
            run.commit(batch)
        except CorrelationIdTaken as taken:
            return _correlation_failure(
                run,
                spec,
                f"interrupt {spec.name!r}: correlation id {correlation!r} is already used by "
                f"execution {taken.execution_id} of {run.definition.name}, which waits for it; "
                "correlation ids must be unique among a reactor's waiting runs",
            )
        run.state.waiting.add(spec.name)
        reached_interrupts(run)[spec.name] = PendingInterrupt(
            spec.name, correlation, expires_at, token
        )
        return CONTINUE

    def pause(self, run: RunContext, waiting: list[str]) -> Outcome:
        """Nothing else can run until a payload comes: release the run, waiting.

        A composed child that waits (its compose step is in ``waiting``) stands for the
        interrupts it reached, by path (``"checkout.approval"``).
        """
        reached = reached_interrupts(run)
        interrupts: list[PendingInterrupt] = []
        waiting_for: list[str] = []
        for name in waiting:
            if run.definition.step(name).interrupt is not None:
                interrupts.append(reached.get(name, PendingInterrupt(name)))
                waiting_for.append(name)
            else:  # a composed child waits: the interrupts it reached here, by path
                nested = [p for path, p in reached.items() if path.startswith(f"{name}.")]
                interrupts.extend(nested)
                waiting_for.extend([p.step for p in nested] or [name])
        run.commit(
            JournalBatch(
                events=[run.event(EventKind.PAUSE, data={"waiting_for": waiting_for})],
                status=ExecutionStatus.PAUSED,
                current_step=waiting[0],
                release=True,
            )
        )
        run.notices.paused(step=waiting[0], waiting_for=tuple(waiting))
        return Paused(
            execution_id=run.execution_id,
            interrupts=tuple(interrupts),
            results=dict(run.state.results),
        )

    def catch_up(self, run: RunContext) -> None:
        """Record the payloads accepted while the run was paused as their steps' results."""
        state = run.state
        if not state.claimed:
            return
        for spec in run.definition.steps:
            if spec.name not in state.claimed or spec.interrupt is None:
                continue
            payload = state.claimed.pop(spec.name)
            event = run.event(EventKind.PAYLOAD, step=spec.name)
            run.commit(
                JournalBatch(
                    events=[event],
                    # The payload as it was stored when it was accepted: encoded again.
                    step=StepWrite.of(
                        spec, StepStatus.COMPLETED, event, 1, {}, None, result=encode(payload)
                    ),
                    current_step=spec.name,
                )
            )
            state.waiting.discard(spec.name)
            state.completed(spec.name, {}, payload, undo=True)

    def restore(self, state: RunState, spec: StepSpec | None, record: RecordedStep) -> None:
        """A reached interrupt waits; one whose payload was accepted while the run was paused
        has it claimed, to be recorded as its result when the run goes on."""
        if record.status == StepStatus.WAITING:
            state.waiting.add(record.step)
        elif record.status == StepStatus.RESUMED:
            state.waiting.add(record.step)
            state.claimed[record.step] = decode(record.result)
        else:
            super().restore(state, spec, record)


def reached_interrupts(run: RunContext) -> dict[str, PendingInterrupt]:
    """The interrupts this process reached in the run, with their tokens (for ``Paused``), by
    path: the run's own by name, its composed children's as ``"<step>.<interrupt>"``."""
    reached: dict[str, PendingInterrupt] = run.memo.setdefault(INTERRUPT.name, {})
    return reached


def interrupt_event(
    run: RunContext, path: str, correlation: str | None, expires_at: dt.datetime | None
) -> Event:
    """The ``interrupt`` trace entry of an interrupt reached (``path``: its step, or its path
    through composed children)."""
    return run.event(
        EventKind.INTERRUPT,
        step=path,
        data={
            "correlation_id": correlation,
            "expires_at": expires_at.isoformat() if expires_at else None,
        },
    )


def _correlation_failure(run: RunContext, spec: StepSpec, message: str) -> StepFailed:
    error = run.step_error(spec, ErrorKind.CORRELATION, message, retryable=False)
    return StepFailed(error, arguments={})


INTERRUPT = InterruptConstruct()
