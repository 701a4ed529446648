"""Pausing and unpausing runs and reactors (``services.pause``, ``pause_reactor``, ...)."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from django_reactor import Reactor, Step, Success, services, step, store
from django_reactor.engine.outcomes import Suspended
from django_reactor.exceptions import InvalidTransition, ReactorError
from django_reactor.models import Dispatch, Execution, Pause
from django_reactor.states import EventKind, ExecutionStatus
from tests.integration.reactors import Tracked, ledger

pytestmark = pytest.mark.django_db


def kinds(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace]


@pytest.fixture(params=["sql", "orm"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each way the store writes checkpoints and claims: PostgreSQL's one statement, and the
    generic ORM path every other database takes."""
    if request.param == "sql" and not store.dialect().one_statement_checkpoint:
        pytest.skip("PostgreSQL's one-statement path needs PostgreSQL")
    chosen = (
        contextlib.nullcontext()
        if request.param == "sql"
        else store.dialects.forced(store.dialects.generic())
    )
    with chosen:
        yield request.param


class Queued(Reactor):
    one = step(Tracked)
    two = step(Tracked, wait_for=["one"])

    class Meta:
        background = "all"
        name = "tests.pausing.Queued"


#: Set by a test: the step ``one`` of ``PausesItself`` pauses its own run (an operator's pause
#: arriving while a live process runs it).
PAUSE_FROM: dict[str, Any] = {}


class PausingStep(Step):
    def run(self) -> Any:
        ledger("run", "one")
        action = PAUSE_FROM.get("action")
        if action is not None:
            action(self.context.execution_id)
        return Success(1)


class PausesItself(Reactor):
    one = step(PausingStep)
    two = step(Tracked, wait_for=["one"])
    three = step(Tracked, wait_for=["two"])

    class Meta:
        name = "tests.pausing.PausesItself"


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    PAUSE_FROM.clear()
    yield
    PAUSE_FROM.clear()


# ---------------------------------------------------------------------------- one run


def test_a_pending_run_is_suspended_at_once_and_goes_on_when_unpaused(path: str) -> None:
    outcome = Queued.run({})
    handle = services.pause(outcome.execution_id, reason="partner outage")
    assert handle.status == ExecutionStatus.SUSPENDED
    assert handle.outcome == Suspended(execution_id=handle.id, reason="partner outage")
    # Its queued task finds nothing to do: a suspended run is no worker's.
    assert not Dispatch.objects.filter(execution_id=handle.id, sent_at__isnull=True).exists()
    assert services.resume(handle.id) is None
    assert ledger.calls == []

    handle = services.unpause(handle.id)
    assert handle.status == ExecutionStatus.PENDING
    assert Dispatch.objects.filter(execution_id=handle.id, reason="unpause").exists()
    assert not Pause.objects.exists()
    result = services.resume(handle.id)
    assert result is not None
    assert result.ok
    assert ledger.calls == [("run", "one"), ("run", "two")]
    assert kinds(handle.id) == [
        ("start", ""),
        ("suspend", ""),
        ("unpause", ""),
        ("resume", ""),
        ("run", "one"),
        ("run", "two"),
        ("complete", ""),
    ]
    suspend = next(e for e in services.find(handle.id).trace if e.kind == EventKind.SUSPEND)
    assert suspend.data["reason"] == "partner outage"
    assert suspend.data["previous_status"] == ExecutionStatus.PENDING


def test_a_running_run_stops_at_its_next_step_boundary(path: str) -> None:
    PAUSE_FROM["action"] = lambda run_id: services.pause(run_id, reason="look first")
    outcome = PausesItself.run({})
    assert isinstance(outcome, Suspended)
    assert outcome.reason == "look first"
    assert ledger.calls == [("run", "one")]  # step two never started
    row = Execution.objects.get(pk=outcome.execution_id)
    assert (row.status, row.lease_owner, row.current_step) == (
        ExecutionStatus.SUSPENDED,
        None,
        "two",
    )
    assert kinds(row.id)[-2:] == [("run", "one"), ("suspend", "")]

    PAUSE_FROM.clear()
    services.unpause(row.id)
    result = services.resume(row.id)
    assert result is not None
    assert result.ok
    # The step that completed is not run again; the rest run once.
    assert ledger.calls == [("run", "one"), ("run", "two"), ("run", "three")]


def test_pausing_twice_keeps_the_first_pause_and_unpausing_an_unpaused_run_is_refused() -> None:
    outcome = Queued.run({})
    services.pause(outcome.execution_id, reason="first")
    services.pause(outcome.execution_id, reason="second")
    assert list(Pause.objects.values_list("reason", flat=True)) == ["first"]
    services.unpause(outcome.execution_id)
    with pytest.raises(InvalidTransition, match="it is pending and not paused"):
        services.unpause(outcome.execution_id)


def test_pause_refuses_ended_runs_children_and_bad_reasons() -> None:
    done = PausesItself.run({})
    with pytest.raises(InvalidTransition, match="it is completed; only runs that will go on"):
        services.pause(done.execution_id)
    with pytest.raises(ReactorError, match="cannot pause with the reason"):
        services.pause(done.execution_id, reason="nul\x00")
    assert not Pause.objects.exists()


def test_a_suspended_run_can_be_cancelled_and_its_pause_goes_with_it() -> None:
    outcome = Queued.run({})
    services.pause(outcome.execution_id)
    handle = services.cancel(outcome.execution_id, reason="not needed")
    assert handle.status == ExecutionStatus.CANCELLED
    assert not Pause.objects.exists()


def test_a_suspended_run_is_undone_newest_first() -> None:
    PAUSE_FROM["action"] = lambda run_id: services.pause(run_id)
    outcome = PausesItself.run({})
    ledger.clear()
    handle = services.undo(outcome.execution_id)
    assert handle.status == ExecutionStatus.CANCELLED
    assert kinds(handle.id)[-3:] == [("rollback", ""), ("undo_skipped", "one"), ("cancel", "")]


def test_a_suspended_run_past_its_deadline_is_stopped_by_the_sweeper() -> None:
    outcome = Queued.run({})
    services.pause(outcome.execution_id)
    Execution.objects.filter(pk=outcome.execution_id).update(
        deadline_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert services.expire_deadlines() == 1
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status in (ExecutionStatus.CANCELLED, ExecutionStatus.FAILED)
    assert ("deadline", "") in kinds(row.id)
    assert not Pause.objects.exists()


# ---------------------------------------------------------------------------- a reactor


def test_a_paused_reactor_stores_new_runs_without_starting_them(path: str) -> None:
    paused = services.pause_reactor(PausesItself, reason="deploying a fix")
    assert (paused.reactor, paused.reason, paused.new) == (
        "tests.pausing.PausesItself",
        "deploying a fix",
        True,
    )
    outcome = PausesItself.run({})
    assert isinstance(outcome, Suspended)
    assert ledger.calls == []
    assert kinds(outcome.execution_id) == [("start", ""), ("suspend", "")]
    assert [p.reactor for p in services.paused_reactors()] == ["tests.pausing.PausesItself"]

    done = services.unpause_reactor("tests.pausing.PausesItself")
    assert (done.was_paused, done.released) == (True, 1)
    result = services.resume(outcome.execution_id)
    assert result is not None
    assert result.ok
    assert ledger.calls == [("run", "one"), ("run", "two"), ("run", "three")]


def test_a_worker_suspends_a_queued_run_of_a_paused_reactor_instead_of_running_it(
    path: str,
) -> None:
    outcome = Queued.run({})
    services.pause_reactor(Queued)
    assert services.resume(outcome.execution_id) is not None
    row = Execution.objects.get(pk=outcome.execution_id)
    assert (row.status, row.lease_owner) == (ExecutionStatus.SUSPENDED, None)
    assert ledger.calls == []
    assert kinds(row.id) == [("start", ""), ("resume", ""), ("suspend", "")]
    suspend = services.find(row.id).trace[-1]
    assert suspend.data["reactor_paused"] is True

    with pytest.raises(InvalidTransition, match="unpause the reactor"):
        services.unpause(row.id)


def test_a_running_run_of_a_paused_reactor_stops_after_its_step(path: str) -> None:
    PAUSE_FROM["action"] = lambda run_id: services.pause_reactor(PausesItself)
    outcome = PausesItself.run({})
    assert isinstance(outcome, Suspended)
    assert ledger.calls == [("run", "one")]


def test_unpausing_a_reactor_releases_its_runs_oldest_first_at_the_rate() -> None:
    services.pause_reactor(PausesItself)
    runs = [PausesItself.run({}).execution_id for _ in range(5)]
    # One of them was paused on its own: the reactor's unpause leaves it suspended.
    services.pause(runs[-1], reason="keep this one")
    before = timezone.now()
    with override_settings(REACTOR={**_settings(), "UNPAUSE_RATE": 2}):
        done = services.unpause_reactor(PausesItself)
    assert done.released == 4
    rows = {r.id: r for r in Execution.objects.filter(pk__in=runs)}
    assert rows[runs[-1]].status == ExecutionStatus.SUSPENDED
    released = [rows[r] for r in runs[:-1]]
    assert all(r.status == ExecutionStatus.PENDING for r in released)
    # Two a second: the first two at once (dispatched), the next two a second later (woken
    # by the sweeper).
    assert [r.wake_at is None for r in released] == [True, True, False, False]
    assert set(
        Dispatch.objects.filter(reason="unpause").values_list("execution_id", flat=True)
    ) == {
        runs[0],
        runs[1],
    }
    for row in released[2:]:
        assert row.wake_at is not None
        assert 0.5 <= (row.wake_at - before).total_seconds() <= 3


def test_pausing_a_paused_reactor_keeps_the_first_pause() -> None:
    services.pause_reactor(PausesItself, reason="first")
    again = services.pause_reactor(PausesItself, reason="second")
    assert (again.new, again.reason) == (False, "first")
    assert services.unpause_reactor(PausesItself).was_paused
    assert not services.unpause_reactor(PausesItself).was_paused


@pytest.mark.postgres
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_pausing_a_reactor_races_runs_starting() -> None:
    """A pause and runs starting at the same instant, on real threads: a run either stops at
    a step boundary (and no step starts after its suspend entry) or ran whole; never two
    steps past the pause."""
    for _ in range(5):
        barrier = threading.Barrier(3)
        outcomes: list[Any] = []

        def start(barrier: threading.Barrier = barrier, outcomes: list[Any] = outcomes) -> None:
            try:
                barrier.wait(timeout=10)
                outcomes.append(PausesItself.run({}))
            finally:
                connections.close_all()

        threads = [threading.Thread(target=start) for _ in range(2)]
        for thread in threads:
            thread.start()
        barrier.wait(timeout=10)
        services.pause_reactor(PausesItself)
        for thread in threads:
            thread.join(timeout=30)
        assert len(outcomes) == 2
        for outcome in outcomes:
            assert outcome.status in (ExecutionStatus.SUSPENDED, ExecutionStatus.COMPLETED)
            trace = kinds(outcome.execution_id)
            if outcome.status == ExecutionStatus.SUSPENDED:
                after = trace[trace.index(("suspend", "")) :]
                assert [k for k, _ in after if k == "run"] == []
        services.unpause_reactor(PausesItself)


def _settings() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.REACTOR)


def test_who_paused_and_why_is_on_the_trace_and_in_the_history() -> None:
    from django_reactor import acting_as

    outcome = Queued.run({})
    with acting_as("alice (support)"):
        services.pause(outcome.execution_id, reason="fraud check")
        services.unpause(outcome.execution_id, reason="cleared")
        services.pause_reactor(Queued, reason="gateway down")
        services.unpause_reactor(Queued)
    suspend = next(
        e for e in services.find(outcome.execution_id).trace if e.kind == EventKind.SUSPEND
    )
    assert (suspend.data["by"], suspend.data["reason"]) == ("alice (support)", "fraud check")
    history = [(e.action, e.who, e.reason) for e in services.audit.of_run(outcome.execution_id)]
    assert history == [
        ("pause", "alice (support)", "fraud check"),
        ("unpause", "alice (support)", "cleared"),
    ]
    from django_reactor.models import AuditEntry

    reactor_entries = AuditEntry.objects.filter(target="reactor tests.pausing.Queued")
    assert list(reactor_entries.order_by("id").values_list("action", "reason")) == [
        ("pause_reactor", "gateway down"),
        ("unpause_reactor", ""),
    ]
    # A refused pause records nothing.
    done = PausesItself.run({})
    with pytest.raises(InvalidTransition):
        services.pause(done.execution_id)
    assert not services.audit.of_run(done.execution_id)
