"""OpenTelemetry middleware: span trees, the Celery hand-off's trace context, robustness."""

from __future__ import annotations

import ast
import contextvars
import gc
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from rest_framework import serializers

from django_reactor import Dispatched, Lock, Reactor, Retry, arg, compose, step
from django_reactor.celery import router, tasks
from django_reactor.otel import OpenTelemetryMiddleware, trace_headers
from tests.integration.reactors import FAIL_AT, Tracked, Transfer, ledger

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
INPUTS = {"account": "acc-1", "amount": 25, "pin": "pin-zq81-secret"}

# The tests' own provider, handed to the middleware through a subclass: the global provider
# (set at most once per process) is left alone.
EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
TRACER = PROVIDER.get_tracer("tests")


class TracedMiddleware(OpenTelemetryMiddleware):
    tracer_provider = PROVIDER


class Broken(SpanProcessor):
    """A span processor (think: a failing exporter) that raises on every span."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("processor bug")

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("processor bug")


BROKEN_PROVIDER = TracerProvider()
BROKEN_PROVIDER.add_span_processor(Broken())


class BrokenMiddleware(OpenTelemetryMiddleware):
    tracer_provider = BROKEN_PROVIDER


class Flaky(Reactor):
    @step(retry=Retry(attempts=3, backoff="fixed", delay=0))
    def call() -> str:
        from django_reactor import step_context

        ledger("run", "call")
        if step_context().attempt < 3:
            raise TimeoutError(f"attempt {step_context().attempt} timed out")
        return "ok"


class HandsOff(Reactor):
    reserve = step(Tracked)
    charge = step(Tracked, wait_for=["reserve"])

    class Meta:
        background = {"after": "reserve"}


class AllInBackground(Reactor):
    one = step(Tracked)

    class Meta:
        background = "all"


class Interrupted(Reactor):
    @step
    def stop() -> None:
        raise KeyboardInterrupt


class Shipping(Reactor):
    pack = step(Tracked)


class Order(Reactor):
    reserve = step(Tracked)
    ship = compose(Shipping, wait_for=["reserve"])


class Locked(Reactor):
    class Inputs(serializers.Serializer):
        order_id = serializers.IntegerField()

    charge = step(Tracked, coordination=[Lock("card-{order}", ttl=30)], order=arg.input("order_id"))

    class Meta:
        coordination = [Lock("otel-order-{order_id}", ttl=30)]


def _use(settings: Any, middleware: type) -> None:
    settings.REACTOR = {**settings.REACTOR, "MIDDLEWARE": [f"{__name__}.{middleware.__name__}"]}


@pytest.fixture
def spans(settings: Any) -> Iterator[InMemorySpanExporter]:
    _use(settings, TracedMiddleware)
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def _named(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    return by_name


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_a_failed_run_is_an_error_span_with_its_steps_and_rollback_in_reverse(
    spans: InMemorySpanExporter,
) -> None:
    FAIL_AT.add("credit")
    outcome = Transfer.run(INPUTS)
    assert not outcome.ok
    finished = spans.get_finished_spans()
    (run,) = [s for s in finished if s.name.startswith("reactor ")]
    assert run.name == "reactor tests.integration.reactors.Transfer"
    assert run.status.status_code is StatusCode.ERROR
    assert run.attributes is not None
    assert run.attributes["reactor.execution_id"] == str(outcome.execution_id)
    assert run.attributes["reactor.name"] == "tests.integration.reactors.Transfer"
    assert run.attributes["reactor.status"] == "failed"
    assert run.attributes["reactor.error.kind"] == "step"
    assert run.attributes["reactor.error.message"] == "credit exploded"
    assert run.attributes["error.type"] == "RuntimeError"
    assert "reactor.parent_execution_id" not in run.attributes

    children = sorted(
        (s for s in finished if s is not run), key=lambda s: (s.start_time or 0, s.end_time or 0)
    )
    assert [s.name for s in children] == [
        "step debit",
        "step credit",
        "compensate credit",
        "undo debit",
    ]
    assert all(_parent_id(s) == run.context.span_id for s in children)
    assert all(s.context.trace_id == run.context.trace_id for s in children)
    debit, credit, compensate, undo = children
    assert debit.status.status_code is StatusCode.UNSET
    assert credit.status.status_code is StatusCode.ERROR
    (exception,) = [e for e in credit.events if e.name == "exception"]
    assert exception.attributes == {
        "exception.type": "RuntimeError",
        "exception.message": "credit exploded",
    }
    assert (compensate.attributes or {})["reactor.rollback.status"] == "compensated"
    assert (undo.attributes or {})["reactor.rollback.status"] == "undone"
    # Rollback runs after the failure, compensate first, then undo in reverse step order.
    assert (credit.end_time or 0) <= (compensate.start_time or 0)
    assert (compensate.end_time or 0) <= (undo.start_time or 0) <= (run.end_time or 0)
    # Neither inputs nor arguments reach the spans.
    text = repr([(s.attributes, [e.attributes for e in s.events]) for s in finished])
    assert "pin-zq81-secret" not in text
    assert "acc-1" not in text
    # The run's spans are no longer current once it returned.
    assert not trace.get_current_span().get_span_context().is_valid


def test_retries_are_events_on_the_failed_attempts(spans: InMemorySpanExporter) -> None:
    assert Flaky.run({}).ok
    attempts = sorted(_named(spans)["step call"], key=lambda s: s.start_time or 0)
    assert [(s.attributes or {})["reactor.step.attempt"] for s in attempts] == [1, 2, 3]
    assert [s.status.status_code for s in attempts] == [
        StatusCode.ERROR,
        StatusCode.ERROR,
        StatusCode.UNSET,
    ]
    for number, attempt in enumerate(attempts[:2], start=1):
        (retry,) = [e for e in attempt.events if e.name == "retry"]
        assert retry.attributes is not None
        assert retry.attributes["reactor.step.attempt"] == number
        assert retry.attributes["reactor.delay"] == 0
        assert retry.attributes["error.type"] == "TimeoutError"
    assert not [e for e in attempts[2].events if e.name == "retry"]
    (run,) = _named(spans)["reactor tests.integration.test_otel.Flaky"]
    assert run.status.status_code is StatusCode.UNSET
    assert (run.attributes or {})["reactor.status"] == "completed"


def test_an_interrupted_run_still_ends_its_spans(spans: InMemorySpanExporter) -> None:
    def run() -> None:
        with pytest.raises(KeyboardInterrupt):
            Interrupted.run({})

    # No ending notification: the spans stay current in the run's context (here a copy).
    contextvars.copy_context().run(run)
    gc.collect()
    named = _named(spans)
    (execution,) = named["reactor tests.integration.test_otel.Interrupted"]
    assert (execution.attributes or {})["reactor.status"] == "interrupted"
    assert execution.status.status_code is StatusCode.ERROR
    assert _parent_id(named["step stop"][0]) == execution.context.span_id
    assert not trace.get_current_span().get_span_context().is_valid


def test_a_composed_child_nests_under_its_parents_step(spans: InMemorySpanExporter) -> None:
    outcome = Order.run({})
    assert outcome.ok
    named = _named(spans)
    (parent,) = named["reactor tests.integration.test_otel.Order"]
    (ship,) = named["step ship"]
    (child,) = named["reactor tests.integration.test_otel.Shipping"]
    (pack,) = named["step pack"]
    assert _parent_id(ship) == parent.context.span_id
    assert _parent_id(child) == ship.context.span_id
    assert _parent_id(pack) == child.context.span_id
    assert (child.attributes or {})["reactor.parent_execution_id"] == str(outcome.execution_id)


def _publish_capturing() -> Any:
    """Patch the tasks' apply_async: what the router sends is recorded, not sent."""
    sent: list[tuple[Any, dict[str, Any]]] = []

    def fake(task: Any) -> Any:
        def apply_async(args: Any = None, **options: Any) -> None:
            sent.append((task, {"args": args, **options}))

        return apply_async

    patches = [
        mock.patch.object(task, "apply_async", fake(task))
        for task in (tasks.resume, tasks.map_elements, tasks.map_rollback)
    ]
    return sent, patches


def _deliver(task: Any, message: dict[str, Any]) -> None:
    """Run the task as a worker would: a fresh context, the message's headers on the request."""
    contextvars.Context().run(task.apply, args=message["args"], headers=message.get("headers"))


@pytest.mark.django_db(transaction=True)
def test_a_handed_off_run_continues_the_requests_trace_in_the_worker(
    spans: InMemorySpanExporter,
) -> None:
    sent, patches = _publish_capturing()
    with patches[0], patches[1], patches[2]:
        with TRACER.start_as_current_span("GET /orders") as request:
            outcome = HandsOff.run({})
        assert isinstance(outcome, Dispatched)
        ((task, message),) = sent
    assert task is tasks.resume
    assert message["args"] == [str(outcome.execution_id)]  # the body stays identity-only
    assert set(message["headers"]) >= {"traceparent"}
    assert f"{request.get_span_context().trace_id:032x}" in message["headers"]["traceparent"]

    _deliver(task, message)

    runs = sorted(
        _named(spans)["reactor tests.integration.test_otel.HandsOff"],
        key=lambda s: s.start_time or 0,
    )
    assert len(runs) == 2
    caller, worker = runs
    trace_id = request.get_span_context().trace_id
    assert {caller.context.trace_id, worker.context.trace_id} == {trace_id}
    assert _parent_id(caller) == request.get_span_context().span_id
    # The hand-off was published inside the caller's segment: the worker's continues it.
    assert _parent_id(worker) == caller.context.span_id
    assert (caller.attributes or {})["reactor.status"] == "pending"
    assert [e.name for e in caller.events] == ["handoff"]
    assert (caller.events[0].attributes or {})["reactor.next_step"] == "charge"
    assert (worker.attributes or {})["reactor.resumed"] is True
    assert (worker.attributes or {})["reactor.status"] == "completed"
    (charge,) = _named(spans)["step charge"]
    assert _parent_id(charge) == worker.context.span_id


@pytest.mark.django_db(transaction=True)
def test_a_background_run_is_a_child_of_the_request_span(
    spans: InMemorySpanExporter,
) -> None:
    sent, patches = _publish_capturing()
    with patches[0], patches[1], patches[2]:
        with TRACER.start_as_current_span("POST /reports") as request:
            outcome = AllInBackground.run({})
        ((task, message),) = sent
    _deliver(task, message)
    assert ledger.calls == [("run", "one")]
    (run,) = _named(spans)["reactor tests.integration.test_otel.AllInBackground"]
    assert run.context.trace_id == request.get_span_context().trace_id
    assert _parent_id(run) == request.get_span_context().span_id
    assert (run.attributes or {})["reactor.execution_id"] == str(outcome.execution_id)


def test_no_span_no_headers_and_a_task_without_headers_starts_its_own_trace(
    spans: InMemorySpanExporter,
) -> None:
    assert trace_headers() is None
    outcome = AllInBackground.run({})
    _deliver(tasks.resume, {"args": [str(outcome.execution_id)]})
    (run,) = _named(spans)["reactor tests.integration.test_otel.AllInBackground"]
    assert run.parent is None


def test_a_raising_tracer_never_breaks_the_run(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _use(settings, BrokenMiddleware)
    with caplog.at_level(logging.ERROR, logger="django_reactor.observers"):
        assert Transfer.run(INPUTS).ok
        FAIL_AT.add("credit")
        failed = Transfer.run(INPUTS)
    assert failed.status == "failed"
    assert ledger.calls[-2:] == [("compensate", "credit"), ("undo", "debit")]
    assert any("processor bug" in str(r.exc_info) for r in caplog.records if r.exc_info)
    assert not trace.get_current_span().get_span_context().is_valid


def test_a_raising_exporter_never_breaks_the_run(settings: Any) -> None:
    class Failing(InMemorySpanExporter):
        def export(self, spans: Any) -> Any:
            raise ConnectionError("collector unreachable")

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Failing()))

    class FailingExport(OpenTelemetryMiddleware):
        tracer_provider = provider

    settings.REACTOR = {**settings.REACTOR, "MIDDLEWARE": [FailingExport]}
    assert Transfer.run(INPUTS).ok


def test_only_the_otel_module_imports_opentelemetry() -> None:
    importers = []
    for path in (ROOT / "django_reactor").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n.split(".")[0] == "opentelemetry" for n in names):
                importers.append(str(path.relative_to(ROOT)))
    assert sorted(set(importers)) == ["django_reactor/otel.py"]


def test_without_opentelemetry_the_import_error_says_what_to_install() -> None:
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if it were not installed
import django
django.setup()
from django_reactor.celery import router, tasks
assert router.trace_headers is None
with tasks.task_context(object()):
    pass
try:
    import django_reactor.otel
except ImportError as exc:
    print(exc)
else:
    raise SystemExit("imported")
"""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'django-reactor[otel]'" in result.stdout


@pytest.mark.django_db  # the publisher reads the database's identity for its header
def test_the_router_sends_no_trace_headers_outside_a_span() -> None:
    sent, patches = _publish_capturing()
    item = router.QueuedDispatch(dispatch_id=0, execution_id=__import__("uuid").uuid4())
    publisher = router.CeleryPublisher()
    with patches[0], patches[1], patches[2]:
        publisher.publish([item])
        with TRACER.start_as_current_span("request"):
            publisher.publish([item])
    (_, quiet), (_, traced) = sent
    assert "traceparent" not in quiet["headers"]
    assert "traceparent" in traced["headers"]
    assert (
        quiet["headers"]["django_reactor_database"] == traced["headers"]["django_reactor_database"]
    )


@pytest.mark.django_db(transaction=True)
def test_coordination_taken_is_an_acquire_event(spans: InMemorySpanExporter, settings: Any) -> None:
    settings.REACTOR = {
        **settings.REACTOR,
        "COORDINATION_BACKEND": "django_reactor.coordination.backends.database.DatabaseBackend",
    }
    assert Locked.run({"order_id": 7}).ok
    (run,) = _named(spans)["reactor tests.integration.test_otel.Locked"]
    acquired = [dict(e.attributes or {}) for e in run.events if e.name == "acquire"]
    assert [(a.get("reactor.coordination.lock"), a.get("reactor.step")) for a in acquired] == [
        ("otel-order-7", None),
        ("card-7", "charge"),
    ]
    assert all(a["reactor.coordination.fence"] >= 1 for a in acquired)
    assert all(run.start_time <= e.timestamp <= run.end_time for e in run.events)  # type: ignore[operator]
