"""Signals, middleware and log lines for runs against the database."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from rest_framework import serializers

from django_reactor import Reactor, Step, Success, arg, interrupt, services, signals, step
from django_reactor.engine.observers import RunEvent, RunObserver, StepEvent
from django_reactor.exceptions import ReactorImproperlyConfigured
from tests.integration.reactors import FAIL_AT, Tracked, Transfer

pytestmark = pytest.mark.django_db

SECRET_PIN = "pin-zq81-secret"
INPUTS = {"account": "acc-secret-77", "amount": 25, "pin": SECRET_PIN}

HEARD: list[tuple[str, str]] = []


class GlobalObserver(RunObserver):
    def execution_started(self, event: RunEvent) -> None:
        HEARD.append(("global", "started"))

    def step_completed(self, event: StepEvent) -> None:
        HEARD.append(("global", event.step))


class ReactorObserver(RunObserver):
    def execution_started(self, event: RunEvent) -> None:
        HEARD.append(("reactor", "started"))

    def step_completed(self, event: StepEvent) -> None:
        HEARD.append(("reactor", event.step))


class Noop(Step):
    def run(self) -> Any:
        return Success("ok")


class Decision(serializers.Serializer):
    approved = serializers.BooleanField()


class Approve(Reactor):
    request = step(Tracked)
    approval = interrupt(after=["request"], payload=Decision)
    refund = step(Tracked, approved=arg.result("approval", "approved"))


class Audited(Reactor):
    only = step(Noop)

    class Meta:
        middleware = [ReactorObserver]


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    HEARD.clear()
    yield
    HEARD.clear()


@pytest.fixture
def received() -> Iterator[list[tuple[str, Any, Any]]]:
    """Every signal sent during the test, as (signal name, sender, event)."""
    names = [n for n in vars(signals) if isinstance(getattr(signals, n), signals.Signal)]
    heard: list[tuple[str, Any, Any]] = []
    receivers = {}
    for name in names:

        def receiver(sender: Any, event: Any, _name: str = name, **kwargs: Any) -> None:
            heard.append((_name, sender, event))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, weak=False)
    yield heard
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def test_signals_are_sent_with_the_reactor_class(received: list[Any]) -> None:
    outcome = Transfer.run(INPUTS)
    assert outcome.ok
    assert [(name, getattr(e, "step", None)) for name, _, e in received] == [
        ("execution_started", None),
        ("step_started", "debit"),
        ("step_completed", "debit"),
        ("step_started", "credit"),
        ("step_completed", "credit"),
        ("step_started", "notify"),
        ("step_completed", "notify"),
        ("execution_completed", None),
    ]
    assert {sender for _, sender, _ in received} == {Transfer}
    assert all(e.execution_id == outcome.execution_id for _, _, e in received)
    assert all(SECRET_PIN not in repr(e) for _, _, e in received)


def test_failure_signals_name_the_step_and_roll_back(received: list[Any]) -> None:
    FAIL_AT.add("credit")
    outcome = Transfer.run(INPUTS)
    assert not outcome.ok
    names = [(name, e.step) for name, _, e in received if name != "step_started"]
    assert names == [
        ("execution_started", None),
        ("step_completed", "debit"),
        ("step_failed", "credit"),
        ("step_compensated", "credit"),
        ("step_undone", "debit"),
        ("execution_failed", "credit"),
    ]


def test_middleware_runs_global_first_then_the_reactors_then_signals(
    received: list[Any],
) -> None:
    def heard_by_signal(sender: Any, event: Any, **kwargs: Any) -> None:
        HEARD.append(("signal", "started"))

    signals.execution_started.connect(heard_by_signal, weak=False)
    try:
        path = f"{__name__}.GlobalObserver"
        with override_settings(REACTOR={"MIDDLEWARE": [path]}):
            assert Audited.run({}).ok
    finally:
        signals.execution_started.disconnect(heard_by_signal)
    assert HEARD == [
        ("global", "started"),
        ("reactor", "started"),
        ("signal", "started"),
        ("global", "only"),
        ("reactor", "only"),
    ]


def test_middleware_must_name_observers() -> None:
    with (
        override_settings(REACTOR={"MIDDLEWARE": ["django_reactor.engine.executor.Executor"]}),
        pytest.raises(ReactorImproperlyConfigured, match="MIDDLEWARE"),
    ):
        Audited.run({})


def test_a_raising_receiver_does_not_break_the_run(caplog: pytest.LogCaptureFixture) -> None:
    def broken(sender: Any, event: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    signals.step_completed.connect(broken, weak=False)
    try:
        with caplog.at_level(logging.ERROR):
            assert Transfer.run(INPUTS).ok
    finally:
        signals.step_completed.disconnect(broken)
    assert any("receiver bug" in str(r.exc_info) for r in caplog.records if r.exc_info)


def test_log_lines_are_key_value_without_secrets(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="django_reactor.runs"):
        done = Transfer.run(INPUTS)
        FAIL_AT.add("credit")
        failed = Transfer.run({**INPUTS, "amount": 30})
    lines = [r.getMessage() for r in caplog.records if r.name == "django_reactor.runs"]
    assert len(lines) == 2
    completed, fail = lines
    assert completed.startswith(
        f"event=execution.completed execution_id={done.execution_id} "
        "reactor=tests.integration.reactors.Transfer status=completed duration_ms="
    )
    assert fail.startswith(
        f"event=execution.failed execution_id={failed.execution_id} "
        "reactor=tests.integration.reactors.Transfer status=failed step=credit duration_ms="
    )
    assert "error_class=" in fail
    for line in lines:
        assert SECRET_PIN not in line
        assert "acc-secret-77" not in line
    record = next(r for r in caplog.records if r.name == "django_reactor.runs")
    assert record.reactor_event["status"] == "completed"  # type: ignore[attr-defined]


def test_log_values_with_spaces_are_quoted() -> None:
    from django_reactor.observability import logfmt

    assert logfmt({"event": "x", "reason": "out of stock", "n": None, "q": 'a"b'}) == (
        'event=x reason="out of stock" q="a\\"b"'
    )


@pytest.mark.django_db(transaction=True)
def test_pause_and_resume_are_signalled_and_logged(
    received: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="django_reactor.runs"):
        paused = Approve.run({})
        done = services.resume_interrupt(
            paused.execution_id, step="approval", payload={"approved": True}
        )
    assert done.ok
    names = [name for name, _, _ in received if name.startswith("execution_")]
    assert names == [
        "execution_started",
        "execution_paused",
        "execution_resumed",
        "execution_completed",
    ]
    pause = next(e for name, _, e in received if name == "execution_paused")
    assert pause.step == "approval"
    assert pause.waiting_for == ("approval",)
    lines = [r.getMessage() for r in caplog.records if r.name == "django_reactor.runs"]
    assert [line.split()[0] for line in lines] == [
        "event=execution.paused",
        "event=execution.resumed",
        "event=execution.completed",
    ]
    assert "waiting_for=approval" in lines[0]
