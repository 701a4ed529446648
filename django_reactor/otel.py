"""OpenTelemetry spans for runs, as middleware: name
``"django_reactor.otel.OpenTelemetryMiddleware"`` in ``REACTOR["MIDDLEWARE"]``.

Needs the ``opentelemetry-api`` package (``pip install "django-reactor[otel]"``) and, to export
anything, an SDK configured by your project. Spans go to the global tracer provider.

What each process sees of a run is one *segment*: a run started by a caller, handed off and
finished by a worker is two spans, ``reactor <name>`` in the caller and ``reactor <name>`` in the
worker, in the same trace (the Celery task carries the W3C trace context in its headers, see
:func:`trace_headers` and :func:`task_context`). Under a segment span:
* ``step <name>``: one span per attempt of a step, current while the step's body runs (spans
  your step code starts, and composed children, nest under it);
* ``undo <step>`` / ``compensate <step>``: one span per rollback action, after the failure;
* events ``retry`` (on the failed attempt), ``handoff``, ``park``, ``pause``, ``halt``,
  ``cancel`` and ``acquire`` (coordination taken).

Attributes carry ids, names, statuses and error summaries, never inputs or arguments.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from contextvars import Token
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "django_reactor.otel needs the opentelemetry-api package: "
        "pip install 'django-reactor[otel]'"
    ) from exc

from . import __version__
from .engine.observers import CoordinationEvent, RunEvent, RunObserver, StepEvent
from .models import Execution

logger = logging.getLogger("django_reactor.otel")

TRACER_NAME = "django_reactor"

_tracer = trace.get_tracer(TRACER_NAME, __version__)

# Statuses of a run that end its segment in error.
_ERROR_STATUSES = frozenset({"failed", "needs_attention", "aborted"})
# Rollback statuses that are errors of the undo / compensate span.
_ROLLBACK_ERRORS = frozenset({"failed"})


def _ns(seconds_ago_ms: float | None = None) -> int:
    """Now in nanoseconds since the epoch, moved back by ``seconds_ago_ms`` milliseconds."""
    now = time.time_ns()
    if seconds_ago_ms:
        now -= int(seconds_ago_ms * 1_000_000)
    return now


def _attributes(**values: Any) -> dict[str, Any]:
    """Span attributes without the ``None`` values (OpenTelemetry refuses them)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        if not isinstance(value, str | bool | int | float | tuple | list):
            value = str(value)
        out[key.replace("__", ".")] = value
    return out


class OpenTelemetryMiddleware(RunObserver):
    """A span per run segment, per step attempt and per rollback action (see the module doc).

    Instantiated per execution and per process. ``tracer_provider`` (a class attribute) chooses
    a provider other than the global one: subclass and set it, for instance in tests.
    """

    tracer_provider: Any = None

    def __init__(self) -> None:
        provider = self.tracer_provider
        self.tracer = _tracer if provider is None else provider.get_tracer(TRACER_NAME, __version__)
        self.span: Span | None = None
        self._token: Token[Context] | None = None
        # The attempt running now: (step, span, context token).
        self._step: tuple[str, Span, Token[Context]] | None = None
        self._error_kind: str | None = None
        self._execution_id: Any = None
        self._reactor = ""

    # ------------------------------------------------------------------ the run's segment

    def execution_started(self, event: RunEvent) -> None:
        self._begin(event, resumed=False)

    def execution_resumed(self, event: RunEvent) -> None:
        self._begin(event, resumed=True)

    def _begin(self, event: RunEvent | StepEvent, *, resumed: bool) -> Span:
        if self.span is not None:  # one segment per executor; never open two
            return self.span
        self._execution_id = event.execution_id
        self._reactor = event.reactor
        # The executor started (and took the run's coordination) event.duration_ms ago.
        started = _ns(event.duration_ms)
        span = self.span = self.tracer.start_span(
            f"reactor {event.reactor}",
            kind=SpanKind.INTERNAL,
            start_time=started,
            attributes=_attributes(
                reactor__name=event.reactor,
                reactor__execution_id=str(event.execution_id),
                reactor__parent_execution_id=_parent_of(event.execution_id),
                reactor__resumed=resumed,
            ),
        )
        # Current while the run runs here: what steps do, and the tasks the run publishes
        # (hand-off, retries, async units, map elements), joins this trace under this span.
        self._token = otel_context.attach(trace.set_span_in_context(span))
        return span

    def execution_completed(self, event: RunEvent) -> None:
        self._end(event)

    def execution_failed(self, event: RunEvent) -> None:
        self._end(event)

    def execution_halted(self, event: RunEvent) -> None:
        self._end(event, "halt", reactor__reason=event.reason, reactor__step=event.step)

    def execution_cancelled(self, event: RunEvent) -> None:
        self._end(event, "cancel", reactor__reason=event.reason, reactor__step=event.step)

    def execution_paused(self, event: RunEvent) -> None:
        self._end(
            event,
            "pause",
            reactor__step=event.step,
            reactor__waiting_for=list(event.waiting_for) or None,
        )

    def execution_suspended(self, event: RunEvent) -> None:
        self._end(event, "suspend", reactor__reason=event.reason)

    def execution_handed_off(self, event: RunEvent) -> None:
        self._end(event, "handoff", reactor__next_step=event.step)

    def execution_parked(self, event: RunEvent) -> None:
        self._end(
            event,
            "park",
            reactor__step=event.step,
            reactor__reason=event.reason,
            reactor__delay=event.delay,
        )

    def _end(self, event: RunEvent, happened: str | None = None, **fields: Any) -> None:
        # No start notification when undo() rolls a finished run back: begin here.
        span = self._begin(event, resumed=True)
        try:
            self._close_step(event.status)
            if happened is not None:
                span.add_event(happened, _attributes(**fields))
            span.set_attribute("reactor.status", event.status)
            if event.status in _ERROR_STATUSES:
                span.set_attributes(
                    _attributes(
                        reactor__error__kind=self._error_kind or event.status,
                        reactor__error__message=event.error,
                        reactor__step=event.step,
                        error__type=event.error_class or self._error_kind or event.status,
                    )
                )
                span.set_status(Status(StatusCode.ERROR, event.error or event.status))
        finally:  # whatever failed above, the segment ends and stops being current
            self._finish()

    def _finish(self) -> None:
        span, token = self.span, self._token
        self.span, self._token = None, None
        if token is not None:
            otel_context.detach(token)
        if span is not None:
            span.end()

    def __del__(self) -> None:
        # The process was interrupted mid-run (no ending notification): end what is open, so
        # the spans are exported. The context it attached is the caller's to restore.
        try:
            if self._step is not None:
                self._step[1].end()
            if self.span is not None:
                self.span.set_attribute("reactor.status", "interrupted")
                self.span.set_status(Status(StatusCode.ERROR, "interrupted"))
                self.span.end()
        except Exception:  # pragma: no cover - never raise from a finaliser
            pass

    # ------------------------------------------------------------------ steps

    def _parent(self, event: StepEvent) -> Context:
        return trace.set_span_in_context(self._begin(event, resumed=True))

    def step_started(self, event: StepEvent) -> None:
        self._close_step("interrupted")
        span = self.tracer.start_span(
            f"step {event.step}",
            context=self._parent(event),
            attributes=_attributes(
                reactor__name=event.reactor,
                reactor__execution_id=str(event.execution_id),
                reactor__step=event.step,
                reactor__step__attempt=event.attempt,
            ),
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        self._step = (event.step, span, token)

    def _step_span(self, event: StepEvent) -> Span:
        """The open attempt of ``event.step``, or a new instant span (no ``step_started``)."""
        if self._step is not None and self._step[0] == event.step:
            _step, span, token = self._step
            self._step = None
            otel_context.detach(token)
            return span
        return self.tracer.start_span(
            f"step {event.step}",
            context=self._parent(event),
            start_time=_ns(event.duration_ms),
            attributes=_attributes(
                reactor__name=event.reactor,
                reactor__execution_id=str(event.execution_id),
                reactor__step=event.step,
                reactor__step__attempt=event.attempt,
            ),
        )

    def _close_step(self, status: str) -> None:
        if self._step is not None:
            _step, span, token = self._step
            self._step = None
            otel_context.detach(token)
            span.set_attribute("reactor.step.status", status)
            span.end()

    def step_completed(self, event: StepEvent) -> None:
        span = self._step_span(event)
        span.set_attributes(
            _attributes(reactor__step__status=event.status, reactor__duration_ms=event.duration_ms)
        )
        span.end()

    def step_failed(self, event: StepEvent) -> None:
        self._error_kind = event.status
        span = self._step_span(event)
        _record_error(span, event)
        span.end()

    def step_retried(self, event: StepEvent) -> None:
        if self._step is not None and self._step[0] == event.step:
            span = self._step_span(event)
            owned = True
        elif self.span is not None:
            span, owned = self.span, False
        else:
            return
        span.add_event(
            "retry",
            _attributes(
                reactor__step=event.step,
                reactor__step__attempt=event.attempt,
                reactor__delay=event.delay,
                error__type=event.error_class,
                exception__message=event.error,
            ),
        )
        if owned:
            _record_error(span, event)
            span.end()

    def step_undone(self, event: StepEvent) -> None:
        self._rollback("undo", event)

    def step_compensated(self, event: StepEvent) -> None:
        self._rollback("compensate", event)

    def _rollback(self, action: str, event: StepEvent) -> None:
        # Notified once the action ran: the span is drawn back over its duration.
        end = _ns()
        span = self.tracer.start_span(
            f"{action} {event.step}",
            context=self._parent(event),
            start_time=end - int((event.duration_ms or 0) * 1_000_000),
            attributes=_attributes(
                reactor__name=event.reactor,
                reactor__execution_id=str(event.execution_id),
                reactor__step=event.step,
                reactor__rollback__status=event.status,
            ),
        )
        if event.status in _ROLLBACK_ERRORS or event.error is not None:
            _record_error(span, event, kind=f"{action}_failed")
        span.end(end_time=end)

    # ------------------------------------------------------------------ coordination

    def coordination_acquired(self, event: CoordinationEvent) -> None:
        """An ``acquire`` event on the run's span (the step's, for a step's coordination)."""
        span = self.span
        if span is None:
            return
        span.add_event(
            "acquire",
            _attributes(
                reactor__step=event.step,
                reactor__coordination__fence=event.fence,
                **{f"reactor__coordination__{event.kind}": event.key},
            ),
        )


def _record_error(span: Span, event: StepEvent, kind: str | None = None) -> None:
    span.add_event(
        "exception",
        _attributes(exception__type=event.error_class, exception__message=event.error),
    )
    span.set_attributes(
        _attributes(
            reactor__step__status=event.status,
            reactor__error__kind=kind or event.status,
            reactor__error__message=event.error,
            error__type=event.error_class or kind or event.status,
        )
    )
    span.set_status(Status(StatusCode.ERROR, event.error or event.status))


def _parent_of(execution_id: Any) -> str | None:
    """The execution that composed or dispatched this one (one primary-key read)."""
    parent = Execution.objects.filter(pk=execution_id).values_list("parent_id", flat=True).first()
    return str(parent) if parent is not None else None


# ---------------------------------------------------------------------------- Celery hand-off


def trace_headers() -> dict[str, str] | None:
    """The current trace context as message headers (``traceparent``, ``tracestate``, ...);
    ``None`` outside any span. The router passes them to ``apply_async(headers=...)``."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


class _RequestGetter(Getter[Any]):
    """Reads propagation fields from a Celery task request: its custom ``headers`` (the
    worker and eager runs), else its attributes (Celery copies message headers onto them)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        headers = getattr(carrier, "headers", None)
        value = headers.get(key) if isinstance(headers, Mapping) else None
        if value is None:
            value = getattr(carrier, key, None)
        if value is None:
            return None
        return [value] if isinstance(value, str) else [str(v) for v in value]

    def keys(self, carrier: Any) -> list[str]:
        headers = getattr(carrier, "headers", None)
        return list(headers) if isinstance(headers, Mapping) else []


_getter = _RequestGetter()


@contextlib.contextmanager
def task_context(request: Any) -> Iterator[None]:
    """Make the publisher's trace context (from the task's headers) current while the task
    runs, so the worker's spans join the trace of the request that started the run.

    When a span is already current (Celery's own OpenTelemetry instrumentation made one),
    it is kept: it already continues the publisher's trace.
    """
    if trace.get_current_span().get_span_context().is_valid:
        yield
        return
    token = otel_context.attach(propagate.extract(request, getter=_getter))
    try:
        yield
    finally:
        otel_context.detach(token)
