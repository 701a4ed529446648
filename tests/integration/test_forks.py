"""Forking a run from a step (``services.fork``, ``fork_plan``, ``handle.fork``)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers

from django_reactor import Reactor, Step, Success, acting_as, arg, services, step
from django_reactor.engine.outcomes import Completed, Dispatched
from django_reactor.exceptions import (
    AlreadyRetried,
    ForkNeedsUndo,
    InvalidFork,
    InvalidInputs,
    InvalidTransition,
)
from django_reactor.models import Execution, Pause, StepRecord
from django_reactor.states import EventKind, ExecutionStatus, RollbackStatus
from tests.integration.reactors import FAIL_AT, Tracked, ledger

pytestmark = pytest.mark.django_db


class Reads(Step):
    """A step without an undo (it reads, or its effect needs none): its effect stands."""

    def run(self, **arguments: Any) -> Any:
        ledger("run", self.context.step)
        if self.context.step in FAIL_AT:
            raise RuntimeError(f"{self.context.step} exploded")
        return Success({"step": self.context.step, "n": arguments.get("n")})


class Pipeline(Reactor):
    """Eight steps in a line: four that need no undo, then four that do."""

    class Inputs(serializers.Serializer):
        n = serializers.IntegerField()

    s1 = step(Reads, n=arg.input("n"))
    s2 = step(Reads, wait_for=["s1"])
    s3 = step(Reads, wait_for=["s2"])
    s4 = step(Reads, wait_for=["s3"])
    s5 = step(Tracked, wait_for=["s4"])
    s6 = step(Tracked, wait_for=["s5"])
    s7 = step(Tracked, wait_for=["s6"])
    s8 = step(Tracked, wait_for=["s7"])

    class Meta:
        name = "tests.forks.Pipeline"


class Undone(Reactor):
    """a and c undo; b (no undo) uses a's result."""

    a = step(Tracked)
    b = step(Reads, n=arg.result("a", "step"))
    c = step(Tracked, wait_for=["b"])

    class Meta:
        name = "tests.forks.Undone"


class Queued(Reactor):
    one = step(Reads)
    two = step(Tracked, wait_for=["one"])

    class Meta:
        background = "all"
        name = "tests.forks.Queued"


def runs_of(step_name: str) -> int:
    return Counter(ledger.calls)[("run", step_name)]


def kinds(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace]


def failed_at(step_name: str) -> Any:
    FAIL_AT.add(step_name)
    outcome = Pipeline.run({"n": 7})
    FAIL_AT.discard(step_name)
    assert outcome.status == ExecutionStatus.FAILED
    ledger.clear()
    return outcome.execution_id


# ---------------------------------------------------------------------------- failed runs


def test_a_run_failed_at_step_five_is_forked_and_runs_five_to_eight_only() -> None:
    original = failed_at("s5")
    plan = services.fork_plan(original, "s5")
    assert (plan.carried, plan.undo, plan.again) == (("s1", "s2", "s3", "s4"), (), ())

    with acting_as("ops on call"):
        outcome = services.fork(original, "s5", reason="tax bug fixed")
    assert isinstance(outcome, Completed)
    # The fix is deployed (s5 no longer fails): steps 1-4's bodies did not run again.
    assert [runs_of(f"s{i}") for i in range(1, 9)] == [0, 0, 0, 0, 1, 1, 1, 1]
    fork = services.find(outcome.execution_id)
    assert (fork.retry_of, fork.fork_step) == (original, "s5")
    assert kinds(fork.id) == [
        ("start", ""),
        ("run", "s5"),
        ("run", "s6"),
        ("run", "s7"),
        ("run", "s8"),
        ("complete", ""),
    ]
    start = fork.trace[0]
    assert start.data == {
        "forked_from": str(original),
        "fork_step": "s5",
        "carried": ["s1", "s2", "s3", "s4"],
        "by": "ops on call",
        "via": "python",
        "reason": "tax bug fixed",
    }
    # The carried results are the original's, as its steps recorded them.
    assert fork.steps[0].result == {"step": "s1", "n": 7}
    assert [s.name for s in fork.steps] == [f"s{i}" for i in range(1, 9)]
    # The original's carried records are the fork's now; its trace says so.
    carried = StepRecord.objects.filter(execution_id=original, rollback=RollbackStatus.CARRIED)
    assert sorted(carried.values_list("step", flat=True)) == ["s1", "s2", "s3", "s4"]
    forked = services.find(original).trace[-1]
    assert (forked.kind, forked.data["forked_as"]) == (EventKind.FORK, str(fork.id))
    # Who forked it is in the steering history, with the plan.
    (entry,) = services.audit.of_run(original)
    assert (entry.action, entry.who, entry.reason) == ("fork", "ops on call", "tax bug fixed")
    assert entry.detail["carried"] == ["s1", "s2", "s3", "s4"]


def test_the_forks_rollback_undoes_the_carried_steps_too() -> None:
    original = failed_at("s5")
    FAIL_AT.add("s7")
    outcome = services.fork(original, "s5")
    assert outcome.status == ExecutionStatus.FAILED
    # Newest first, across the two runs' steps: s6 and s5 undone, s4..s1 have no undo.
    assert kinds(outcome.execution_id)[-8:] == [
        ("compensate", "s7"),
        ("undo", "s6"),
        ("undo", "s5"),
        ("undo_skipped", "s4"),
        ("undo_skipped", "s3"),
        ("undo_skipped", "s2"),
        ("undo_skipped", "s1"),
        ("fail", ""),
    ]


def test_steps_undone_when_the_run_failed_run_again_and_their_dependents_too() -> None:
    FAIL_AT.add("c")
    original = Undone.run({}).execution_id
    FAIL_AT.discard("c")
    ledger.clear()
    plan = services.fork_plan(original, "c")
    # a was undone by the failure's rollback: it runs again, and b (which used a's result,
    # and has no undo) with it.
    assert (plan.carried, plan.undo, plan.again) == ((), (), ("a", "b"))
    assert plan.warnings == (
        "b declares no undo, so its effect from the original stands; the fork runs it again "
        "(with an idempotency key of its own)",
    )
    outcome = services.fork(original, "c")
    assert outcome.ok
    assert ledger.calls == [("run", "a"), ("run", "b"), ("run", "c")]


# ---------------------------------------------------------------------------- abandoned branch


def test_forking_a_completed_run_undoes_the_abandoned_branch_newest_first_first() -> None:
    original = Pipeline.run({"n": 1}).execution_id
    ledger.clear()
    with pytest.raises(ForkNeedsUndo) as refused:
        services.fork(original, "s3")
    plan = refused.value.plan
    assert plan.undo == ("s8", "s7", "s6", "s5", "s4", "s3")
    assert plan.carried == ("s1", "s2")
    assert "s8, s7, s6, s5, s4, s3" in str(refused.value)
    # Refused: nothing written.
    assert Execution.objects.count() == 1
    assert not StepRecord.objects.filter(rollback=RollbackStatus.CARRIED).exists()

    outcome = services.fork(original, "s3", undo_abandoned=True)
    assert outcome.ok
    assert ledger.calls == [
        ("undo", "s8"),
        ("undo", "s7"),
        ("undo", "s6"),
        ("undo", "s5"),
        *[("run", f"s{i}") for i in range(3, 9)],
    ]
    row = Execution.objects.get(pk=original)
    assert row.status == ExecutionStatus.CANCELLED
    assert kinds(original)[-9:] == [
        ("fork", ""),
        ("rollback", ""),
        ("undo", "s8"),
        ("undo", "s7"),
        ("undo", "s6"),
        ("undo", "s5"),
        ("undo_skipped", "s4"),
        ("undo_skipped", "s3"),
        ("cancel", ""),
    ]
    fork = services.find(outcome.execution_id)
    # It waited, suspended, for the undo, then ran.
    assert [k for k, _ in kinds(fork.id)][:3] == ["start", "suspend", "run"]
    assert not Pause.objects.exists()
    # Undoing the original again undoes nothing: s1 and s2 are the fork's.
    ledger.clear()
    services.undo(original)
    assert ledger.calls == []


def test_a_crash_between_the_undo_and_the_fork_is_finished_by_workers_and_the_sweeper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_reactor.services import forks

    original = Pipeline.run({"n": 1}).execution_id

    def crash(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # the process stops after the fork's transaction

    monkeypatch.setattr(forks, "_undo_abandoned", crash)
    with pytest.raises(KeyboardInterrupt):
        services.fork(original, "s5", undo_abandoned=True)
    fork_row = Execution.objects.get(retry_of=original)
    assert fork_row.status == ExecutionStatus.SUSPENDED
    with pytest.raises(InvalidTransition, match="still doing"):
        services.unpause(fork_row.id)
    # The fork waits while the original rolls back; its lease runs out, a worker finishes the
    # undo, then the sweeper releases the fork.
    assert forks.release_waiting_forks(10) == 0
    Execution.objects.filter(pk=original).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    ledger.clear()
    services.resume(original)
    assert Execution.objects.get(pk=original).status == ExecutionStatus.CANCELLED
    assert ledger.calls == [("undo", "s8"), ("undo", "s7"), ("undo", "s6"), ("undo", "s5")]
    assert forks.release_waiting_forks(10) == 1
    assert Execution.objects.get(pk=fork_row.id).status == ExecutionStatus.PENDING
    ledger.clear()
    finished = services.resume(fork_row.id)
    assert finished is not None
    assert finished.ok
    assert ledger.calls == [("run", f"s{i}") for i in range(5, 9)]


# ---------------------------------------------------------------------------- on workers


def test_a_background_reactors_fork_goes_to_a_worker() -> None:
    FAIL_AT.add("two")
    original = Queued.run({}).execution_id
    services.resume(original)
    FAIL_AT.discard("two")
    ledger.clear()
    outcome = services.fork(original, "two")
    assert isinstance(outcome, Dispatched)
    assert ledger.calls == []
    finished = services.resume(outcome.execution_id)
    assert finished is not None
    assert finished.ok
    assert ledger.calls == [("run", "two")]


# ---------------------------------------------------------------------------- refusals


def test_a_run_is_re_run_once_and_the_fork_can_be_forked() -> None:
    original = failed_at("s5")
    fork = services.fork(original, "s5").execution_id
    with pytest.raises(AlreadyRetried, match="re-run already"):
        services.fork(original, "s6")
    with pytest.raises(AlreadyRetried):
        services.retry(original)
    ledger.clear()
    again = services.fork(fork, "s8", undo_abandoned=True)
    assert again.ok
    assert ledger.calls == [("undo", "s8"), ("run", "s8")]


def test_forks_are_refused_with_reasons() -> None:
    original = failed_at("s5")
    with pytest.raises(InvalidFork, match="has no step 'nope' to fork from; its steps: s1, s2"):
        services.fork(original, "nope")
    with pytest.raises(InvalidInputs):
        services.fork(original, "s5", inputs={"n": "many"})
    running = Queued.run({}).execution_id
    with pytest.raises(InvalidTransition, match="it is pending; fork works on runs that ended"):
        services.fork(running, "two")
    assert Execution.objects.filter(retry_of__isnull=False).count() == 0


def test_new_inputs_go_to_the_fork() -> None:
    original = failed_at("s1")
    outcome = services.fork(original, "s1", inputs={"n": 9})
    assert outcome.ok
    assert services.find(outcome.execution_id).inputs == {"n": 9}
    assert services.find(outcome.execution_id).steps[0].result == {"step": "s1", "n": 9}
