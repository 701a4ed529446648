"""Lifecycle notifications from the pure executor, on a memory journal."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from django_reactor import Failure, Halt, Reactor, Retry, Step, Success, arg, step
from django_reactor.engine.executor import Executor, RunState
from django_reactor.engine.journal import MemoryJournal
from django_reactor.engine.observers import (
    NOTIFICATIONS,
    CompositeObserver,
    RunEvent,
    RunObserver,
    StepEvent,
)
from django_reactor.exceptions import DefinitionError
from django_reactor.states import ExecutionStatus


class Recorder(RunObserver):
    """Records every notification as ``(name, step, status, attempt)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, str, int]] = []
        self.events: list[Any] = []


def _recording(name: str) -> Any:
    def record(self: Recorder, event: Any) -> None:
        self.events.append(event)
        self.calls.append((name, event.step, event.status, getattr(event, "attempt", 0)))

    return record


for _name in NOTIFICATIONS:
    setattr(Recorder, _name, _recording(_name))


class Raising(RunObserver):
    def step_completed(self, event: StepEvent) -> None:
        raise RuntimeError("observer bug")

    def execution_completed(self, event: RunEvent) -> None:
        raise RuntimeError("observer bug")


class Ok(Step):
    def run(self, **arguments: Any) -> Any:
        return Success(self.context.step)

    def undo(self, result: Any, **arguments: Any) -> None:
        pass


class NoUndo(Step):
    def run(self, **arguments: Any) -> Any:
        return Success(1)


class Boom(Step):
    def run(self, **arguments: Any) -> Any:
        raise ValueError("card declined")

    def compensate(self, error: Any, **arguments: Any) -> None:
        pass


FLAKY: dict[str, int] = {}


class Flaky(Step):
    def run(self, **arguments: Any) -> Any:
        FLAKY["n"] = FLAKY.get("n", 0) + 1
        if FLAKY["n"] < 3:
            return Failure(ConnectionError("timeout"))
        return Success("ok")


class Stop(Step):
    def run(self, **arguments: Any) -> Any:
        return Halt("out of stock")


def run(reactor: type, observer: RunObserver | None, **inputs: Any) -> Any:
    executor = Executor(
        reactor.definition,  # type: ignore[attr-defined]
        MemoryJournal(),
        inputs=inputs,
        state=RunState(),
        sleep=lambda _: None,
        observer=observer,
    )
    return executor.run()


def test_completed_run_notifies_in_order() -> None:
    class Chain(Reactor):
        a = step(Ok, secret=arg.input("card"))
        b = step(Ok, x=arg.result("a"))

    recorder = Recorder()
    outcome = run(Chain, recorder, card="4111-1111")
    assert outcome.ok
    assert recorder.calls == [
        ("execution_started", None, ExecutionStatus.RUNNING, 0),
        ("step_started", "a", "running", 1),
        ("step_completed", "a", "completed", 1),
        ("step_started", "b", "running", 1),
        ("step_completed", "b", "completed", 1),
        ("execution_completed", None, ExecutionStatus.COMPLETED, 0),
    ]
    done = recorder.events[-1]
    assert done.reactor == Chain.definition.name
    assert done.duration_ms is not None
    assert done.duration_ms >= 0
    assert recorder.events[2].duration_ms is not None
    # Events never carry inputs or arguments.
    assert all("4111" not in repr(e) for e in recorder.events)


def test_failed_run_notifies_failure_then_rollback_newest_first() -> None:
    class Checkout(Reactor):
        reserve = step(Ok)
        note = step(NoUndo, wait_for=["reserve"])
        hold = step(Ok, wait_for=["note"])
        charge = step(Boom, wait_for=["hold"])

    recorder = Recorder()
    outcome = run(Checkout, recorder)
    assert not outcome.ok
    tail = recorder.calls[recorder.calls.index(("step_started", "charge", "running", 1)) :]
    assert tail == [
        ("step_started", "charge", "running", 1),
        ("step_failed", "charge", "step", 1),
        ("step_compensated", "charge", "compensated", 1),
        ("step_undone", "hold", "undone", 1),
        ("step_undone", "note", "no_handler", 1),
        ("step_undone", "reserve", "undone", 1),
        ("execution_failed", "charge", ExecutionStatus.FAILED, 0),
    ]
    failed = recorder.events[recorder.calls.index(tail[1])]
    assert failed.error == "card declined"
    assert failed.error_class == "ValueError"
    assert recorder.events[-1].error_class == "ValueError"


def test_retries_are_notified_with_their_delay() -> None:
    FLAKY.clear()

    class Charge(Reactor):
        charge = step(Flaky, retry=Retry(attempts=5, delay=0.5))

    recorder = Recorder()
    assert run(Charge, recorder).ok
    assert recorder.calls[1:-1] == [
        ("step_started", "charge", "running", 1),
        ("step_retried", "charge", "retry", 1),
        ("step_started", "charge", "running", 2),
        ("step_retried", "charge", "retry", 2),
        ("step_started", "charge", "running", 3),
        ("step_completed", "charge", "completed", 3),
    ]
    retried = recorder.events[2]
    assert retried.delay == 0.5
    assert retried.error == "timeout"
    assert retried.error_class == "ConnectionError"


def test_halt_is_notified() -> None:
    class Shop(Reactor):
        a = step(Ok)
        stop = step(Stop, wait_for=["a"])

    recorder = Recorder()
    run(Shop, recorder)
    assert recorder.calls[-1] == ("execution_halted", "stop", ExecutionStatus.HALTED, 0)
    assert recorder.events[-1].reason == "out of stock"


def test_raising_observer_is_logged_and_the_run_completes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Chain(Reactor):
        a = step(Ok)

    recorder = Recorder()
    with caplog.at_level(logging.ERROR, logger="django_reactor.observers"):
        outcome = run(Chain, CompositeObserver([Raising(), recorder]))
    assert outcome.ok
    # The observer after the raising one still hears everything.
    assert [c[0] for c in recorder.calls][-2:] == ["step_completed", "execution_completed"]
    errors = [r for r in caplog.records if r.name == "django_reactor.observers"]
    assert len(errors) == 2
    assert all(r.exc_info and "Raising" in r.getMessage() for r in errors)


def test_a_lone_raising_observer_cannot_break_a_run(caplog: pytest.LogCaptureFixture) -> None:
    class Chain(Reactor):
        a = step(Ok)

    with caplog.at_level(logging.ERROR, logger="django_reactor.observers"):
        assert run(Chain, Raising()).ok
    assert len(caplog.records) == 2


def test_a_steps_event_is_built_only_for_an_observer_that_listens() -> None:
    class Chain(Reactor):
        a = step(Ok)

    class Deaf(Recorder):
        def listens(self, notification: str) -> bool:
            return notification.startswith("execution_")

    class Unsure(Recorder):
        def listens(self, notification: str) -> bool:
            raise RuntimeError("observer bug")

    deaf, unsure = Deaf(), Unsure()
    assert run(Chain, CompositeObserver([deaf])).ok
    assert [c[0] for c in deaf.calls] == ["execution_started", "execution_completed"]
    # An observer whose listens() raises is told all the same.
    assert run(Chain, CompositeObserver([deaf, unsure])).ok
    assert [c[0] for c in unsure.calls] == [
        "execution_started",
        "step_started",
        "step_completed",
        "execution_completed",
    ]
    assert not CompositeObserver([Raising()]).listens("step_started")  # not overridden


def test_no_observer_is_the_default() -> None:
    class Chain(Reactor):
        a = step(Ok)

    assert run(Chain, None).ok


def test_meta_middleware_must_be_observer_classes() -> None:
    class Audited(Reactor):
        a = step(Ok)

        class Meta:
            middleware = [Recorder]

    assert Audited.definition.middleware == (Recorder,)

    def declare() -> None:
        class Broken(Reactor):
            a = step(Ok)

            class Meta:
                middleware = [object]

    with pytest.raises(DefinitionError, match=r"Meta\.middleware"):
        declare()


def test_the_observers_event_keeps_its_old_name_with_a_warning() -> None:
    from django_reactor.engine import observers

    with pytest.warns(DeprecationWarning, match="RunEvent"):
        old = observers.ExecutionEvent
    assert old is observers.RunEvent
