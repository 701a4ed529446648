"""Time in the pure executor: sleeps, deadlines, step timeouts and heartbeats, with a clock the
test moves (never a real wait, except for the bodies the timeout tests abandon)."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest

from django_reactor import (
    Reactor,
    Retry,
    Step,
    arg,
    interrupt,
    sleep,
    sleep_until,
    step,
)
from django_reactor.engine.context import RunPolicy
from django_reactor.engine.executor import Executor, RunState
from django_reactor.engine.journal import MemoryJournal
from django_reactor.engine.outcomes import ErrorKind, Rescheduled
from django_reactor.exceptions import DefinitionError
from django_reactor.states import EventKind, ExecutionStatus, StepStatus
from tests.helpers import ledger, trace

T0 = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += dt.timedelta(**delta)


def executor(
    reactor: Any,
    journal: MemoryJournal,
    clock: Clock,
    state: RunState | None = None,
    **options: Any,
) -> Executor:
    return Executor(
        reactor.definition,
        journal,
        inputs=options.pop("inputs", {}),
        state=state or RunState(),
        clock=clock,
        sleep=lambda seconds: None,
        policy=RunPolicy(**options),
    )


def resumed(journal: MemoryJournal) -> RunState:
    """The state a worker restores: the records so far, the sleeps among them."""
    return RunState.restore(ReturnWindow.definition, journal.read())


@step()
def charge() -> str:
    ledger("run", "charge")
    return "charged"


class ReturnWindow(Reactor):
    charge = charge
    window = sleep(dt.timedelta(days=3), after=["charge"])

    @step(wait_for=["window"], until=arg.result("window"))
    def payout(until: str) -> str:
        ledger("run", "payout")
        return f"paid after {until}"

    class Meta:
        returns = "payout"


def test_a_sleep_parks_the_run_until_its_time_then_the_run_goes_on() -> None:
    clock, journal = Clock(), MemoryJournal()
    outcome = executor(ReturnWindow, journal, clock).run()
    assert isinstance(outcome, Rescheduled)
    assert outcome.reason == "sleep"
    assert outcome.delay == 3 * 86400
    assert journal.steps["window"].status == StepStatus.SLEEPING
    assert journal.steps["window"].result == (T0 + dt.timedelta(days=3)).isoformat()
    assert journal.dispatches == []  # no message waits: the sweeper wakes it
    assert journal.statuses == [ExecutionStatus.PENDING]

    clock.advance(days=1)  # woken early (a duplicate message): it waits on, for what is left
    outcome = executor(ReturnWindow, journal, clock, state=resumed(journal)).run()
    assert isinstance(outcome, Rescheduled)
    assert outcome.delay == 2 * 86400
    assert ("run", "payout") not in ledger.calls

    clock.advance(days=2)
    outcome = executor(ReturnWindow, journal, clock, state=resumed(journal)).run()
    assert outcome.ok
    assert outcome.value == f"paid after {(T0 + dt.timedelta(days=3)).isoformat()}"
    assert journal.steps["window"].status == StepStatus.COMPLETED
    assert [k for k, s in trace(journal) if s == "window"] == ["sleep", "sleep", "run"]


def test_a_time_already_past_completes_at_once_and_the_trace_says_so() -> None:
    class Late(Reactor):
        nap = sleep_until(arg.input("when"))

    clock, journal = Clock(), MemoryJournal()
    when = (T0 - dt.timedelta(hours=1)).isoformat()
    outcome = executor(Late, journal, clock, inputs={"when": when}).run()
    assert outcome.ok
    sleeps = [e.data for e in journal.events if e.kind == EventKind.SLEEP]
    assert sleeps == [{"until": when, "past": True}]


def test_a_sleep_until_a_time_without_zone_fails_the_step_plainly() -> None:
    class Naive(Reactor):
        nap = sleep_until(arg.input("when"))

    clock, journal = Clock(), MemoryJournal()
    outcome = executor(Naive, journal, clock, inputs={"when": "2026-12-24T10:00:00"}).run()
    assert outcome.status == ExecutionStatus.FAILED
    assert "a time without a time zone" in outcome.error.message


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda: sleep(-5), "a sleep cannot be negative"),
        (lambda: sleep("soon"), "must be a timedelta or a number of seconds"),
        (lambda: sleep_until(dt.datetime(2026, 12, 24)), "a time without a time zone"),
        (lambda: sleep_until("tomorrow"), "not an ISO 8601 time"),
    ],
)
def test_bad_sleeps_are_refused_at_definition(declare: Any, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        declare()


# ---------------------------------------------------------------------------- deadlines


def test_past_its_deadline_a_run_starts_no_step_and_rolls_back() -> None:
    class Advancing(Step):
        def run(self) -> None:
            clock.advance(minutes=10)  # the step took long: the deadline passes meanwhile
            ledger("run", self.context.step)

        def undo(self, result: Any) -> None:
            ledger("undo", self.context.step)

    class Late(Reactor):
        a = step(Advancing)
        b = step(Advancing, wait_for=["a"])

    clock, journal = Clock(), MemoryJournal()
    deadline = T0 + dt.timedelta(minutes=5)
    outcome = executor(Late, journal, clock, deadline=deadline).run()
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.kind == ErrorKind.DEADLINE
    assert outcome.error.step == "b"
    assert f"deadline ({deadline.isoformat()}) passed before step 'b'" in outcome.error.message
    assert ledger.calls == [("run", "a"), ("undo", "a")]
    assert trace(journal) == [("run", "a"), ("deadline", "b"), ("undo", "a")]


def test_a_deadline_may_halt_instead() -> None:
    class Halts(Reactor):
        a = step(lambda: ledger("run", "a"))
        b = step(lambda: ledger("run", "b"), wait_for=["a"])

        class Meta:
            on_deadline = "halt"

    clock, journal = Clock(), MemoryJournal()
    outcome = executor(Halts, journal, clock, deadline=T0).run()
    assert outcome.status == ExecutionStatus.HALTED
    assert outcome.step == "a"
    assert ledger.calls == []


def test_a_run_parked_wakes_by_its_deadline_at_the_latest() -> None:
    clock, journal = Clock(), MemoryJournal()
    deadline = T0 + dt.timedelta(hours=1)
    outcome = executor(ReturnWindow, journal, clock, deadline=deadline).run()
    assert isinstance(outcome, Rescheduled)
    assert outcome.delay == 3600.0  # not three days: the deadline comes first
    clock.advance(hours=1)
    outcome = executor(
        ReturnWindow, journal, clock, state=resumed(journal), deadline=deadline
    ).run()
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.kind == ErrorKind.DEADLINE
    assert ("run", "payout") not in ledger.calls


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({"deadline": dt.timedelta(seconds=-1)}, "Meta.deadline must be longer than zero"),
        ({"deadline": "1h"}, "Meta.deadline must be a timedelta or a number of seconds"),
        ({"on_deadline": "wait"}, 'Meta.on_deadline must be "rollback"'),
    ],
)
def test_bad_deadlines_are_refused_at_definition(meta: dict[str, Any], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        type("Refused", (Reactor,), {"a": step(lambda: None), "Meta": type("Meta", (), meta)})


# ---------------------------------------------------------------------------- timeouts


RELEASE = threading.Event()


class Hangs(Step):
    """Blocks until the test releases it (an attempt the watch abandons)."""

    retry = Retry(attempts=2, delay=0)

    def run(self) -> str:
        if self.context.attempt == 1:
            RELEASE.wait(30)
            return "too late"
        return "second attempt"


def test_an_attempt_past_its_timeout_fails_and_the_retry_policy_decides() -> None:
    RELEASE.clear()

    class TimesOut(Reactor):
        hang = step(Hangs, timeout=0.2)

    clock, journal = Clock(), MemoryJournal()
    try:
        outcome = executor(TimesOut, journal, clock).run()
    finally:
        RELEASE.set()  # the abandoned body returns; its result is thrown away
    assert outcome.ok
    assert outcome.value == {"hang": "second attempt"}
    retries = [e.data for e in journal.events if e.kind == EventKind.RETRY]
    assert retries[0]["exception_class"] == "django_reactor.exceptions.StepTimedOut"
    assert "ran longer than its timeout (0.2 s)" in retries[0]["error"]


def test_a_step_that_stops_beating_counts_as_lost() -> None:
    started = threading.Event()

    class Beats(Step):
        def run(self) -> str:
            for _ in range(3):
                self.context.heartbeat({"done": _})
            started.set()
            while not self.context.should_stop():  # silent from here on
                RELEASE.wait(0.05)
            return "stopped"

    class Silent(Reactor):
        beats = step(Beats, heartbeat_timeout=0.3)

    RELEASE.clear()
    clock, journal = Clock(), MemoryJournal()
    outcome = executor(Silent, journal, clock).run()
    assert started.is_set()
    assert outcome.status == ExecutionStatus.FAILED
    assert "sent no heartbeat for" in outcome.error.message
    assert journal.heartbeats[:3] == [
        ("beats", {"done": 0}),
        ("beats", {"done": 1}),
        ("beats", {"done": 2}),
    ]


def test_a_default_timeout_applies_to_steps_without_one() -> None:
    RELEASE.clear()

    class Defaults(Reactor):
        hang = step(Hangs)

    clock, journal = Clock(), MemoryJournal()
    try:
        outcome = executor(Defaults, journal, clock, step_timeout=0.2).run()
    finally:
        RELEASE.set()
    assert outcome.ok
    assert [e.kind for e in journal.events if e.step == "hang"] == [EventKind.RETRY, EventKind.RUN]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": 0}, "timeout must be longer than zero"),
        ({"timeout": "1m"}, "timeout must be a timedelta or a number of seconds"),
        ({"heartbeat_timeout": -1}, "heartbeat_timeout must be longer than zero"),
        ({"timeout": 5, "atomic": True}, "an atomic step is bounded by"),
    ],
)
def test_bad_timeouts_are_refused_at_definition(options: dict[str, Any], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        type("Refused", (Reactor,), {"a": step(Hangs, **options)})


def test_an_interrupt_takes_no_step_timeout() -> None:
    with pytest.raises(TypeError):
        interrupt(after=["a"], heartbeat_timeout=5)  # type: ignore[call-arg]
