"""Patches on a real database: a run's decision recorded at once (``PatchDecision``), kept
across crashes and takeovers, agreed on by threads deciding at once; a run on a removed old
branch parked for a person; a fork given the decisions of the steps it carries.

A deploy is simulated by switching ``CODE["version"]`` (the step's class stays the same, as its
body changes in a deploy); a worker that dies mid-step by a probe that stops the process after
the body's external work, and its lease left to another process.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from django_reactor import Reactor, Step, services, step, store
from django_reactor.engine import probes
from django_reactor.models import Execution, PatchDecision
from django_reactor.states import EventKind, ExecutionStatus

pytestmark = [pytest.mark.postgres, pytest.mark.mariadb, pytest.mark.django_db(transaction=True)]

#: The external side effects the steps made, in order: (run id, what, branch).
LEDGER: list[tuple[str, str, str]] = []
#: Which code is deployed: "old" (before the patch), "new" (patched), "deprecated".
CODE = {"version": "old"}


class Crash(BaseException):
    """The worker's process stops (nothing in the engine catches it)."""


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    LEDGER.clear()
    CODE["version"] = "old"
    monkeypatch.setattr(probes, "active", None)


class Charge(Step):
    def run(self) -> str:
        version = CODE["version"]
        if version == "old":
            branch = "old"
        elif version == "deprecated":
            self.context.deprecated_patch("tax-v2")
            branch = "new"
        else:
            branch = "new" if self.context.patched("tax-v2") else "old"
        LEDGER.append((str(self.context.execution_id), "charge", branch))
        return branch

    def undo(self, result: str) -> None:
        branch = "new" if self.context.patched("tax-v2") else "old"
        LEDGER.append((str(self.context.execution_id), "refund", branch))


class Reserve(Step):
    def run(self) -> str:
        LEDGER.append((str(self.context.execution_id), "reserve", "-"))
        return "reserved"

    def undo(self, result: str) -> None:
        LEDGER.append((str(self.context.execution_id), "release", "-"))


class Receipt(Step):
    def run(self) -> str:
        branch = "new" if self.context.patched("tax-v2") else "old"
        LEDGER.append((str(self.context.execution_id), "receipt", branch))
        return branch


class PatchedOrder(Reactor):
    reserve = step(Reserve)
    charge = step(Charge, wait_for=["reserve"])
    receipt = step(Receipt, wait_for=["charge"])

    class Meta:
        name = "tests.patches.PatchedOrder"
        background = "all"


def crash_after_body(monkeypatch: pytest.MonkeyPatch, step_name: str) -> None:
    """The worker dies once ``step_name``'s body did its work, before its checkpoint."""

    def probe(point: str, name: str) -> None:
        if point == "before_step_commit" and name == step_name:
            raise Crash

    monkeypatch.setattr(probes, "active", probe)


def worker_takes(run_id: uuid.UUID) -> Any:
    """A worker's delivery of the run."""
    return services.resume(run_id)


def worker_dies(run_id: uuid.UUID) -> None:
    """A worker delivering the run dies inside it; its lease lapses (it was another process)."""
    with pytest.raises(Crash):
        services.resume(run_id)
    connections["default"].close()
    Execution.objects.filter(pk=run_id).update(
        lease_owner="dead-worker:1", lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )


def decisions(run_id: uuid.UUID) -> list[tuple[str, bool, str]]:
    return list(
        PatchDecision.objects.filter(execution_id=run_id).values_list("name", "taken", "step")
    )


def of(run_id: uuid.UUID) -> list[tuple[str, str]]:
    return [(what, branch) for run, what, branch in LEDGER if run == str(run_id)]


def test_runs_on_either_side_of_a_deploy_replay_their_own_branch_after_crashes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before the deploy: a run's worker dies in "charge" after charging the old way.
    before = PatchedOrder.run({}).execution_id
    crash_after_body(monkeypatch, "charge")
    worker_dies(before)
    assert of(before) == [("reserve", "-"), ("charge", "old")]
    assert decisions(before) == []

    # The deploy: the new code asks patched("tax-v2"). A new run's worker dies after asking.
    CODE["version"] = "new"
    after = PatchedOrder.run({}).execution_id
    worker_dies(after)
    assert of(after) == [("reserve", "-"), ("charge", "new")]
    assert decisions(after) == [("tax-v2", True, "charge")]  # recorded before the crash

    # Both taken over, and dying again, twice: each stays on its branch.
    for _ in range(2):
        worker_dies(before)
        worker_dies(after)
    monkeypatch.setattr(probes, "active", None)
    assert worker_takes(before).ok
    assert worker_takes(after).ok

    assert of(before) == [("reserve", "-")] + [("charge", "old")] * 4 + [("receipt", "old")]
    assert of(after) == [("reserve", "-")] + [("charge", "new")] * 4 + [("receipt", "new")]
    assert decisions(before) == [("tax-v2", False, "charge")]
    assert decisions(after) == [("tax-v2", True, "charge")]
    assert Execution.objects.get(pk=before).recovery_attempts == 3


def test_a_run_taken_over_before_the_patched_step_takes_the_new_branch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id = PatchedOrder.run({}).execution_id
    crash_after_body(monkeypatch, "reserve")
    worker_dies(run_id)
    CODE["version"] = "new"
    monkeypatch.setattr(probes, "active", None)

    assert worker_takes(run_id).ok
    assert of(run_id) == [("reserve", "-"), ("reserve", "-"), ("charge", "new"), ("receipt", "new")]
    assert decisions(run_id) == [("tax-v2", True, "charge")]


def test_two_threads_deciding_one_patch_at_once_agree() -> None:
    run_id = PatchedOrder.run({}).execution_id
    barrier = threading.Barrier(2, timeout=20)
    answers: dict[bool, bool] = {}
    errors: list[BaseException] = []

    def decide(taken: bool) -> None:
        try:
            barrier.wait()
            answers[taken] = store.patches.decide(run_id, "tax-v2", taken, f"lane-{taken}")
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)
        finally:
            connections["default"].close()

    threads = [threading.Thread(target=decide, args=(taken,)) for taken in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()

    assert errors == []
    assert len(answers) == 2
    assert answers[True] == answers[False]
    assert [(name, taken) for name, taken, _ in decisions(run_id)] == [("tax-v2", answers[True])]


def test_deprecated_patch_parks_a_run_on_the_old_branch_and_rolls_nothing_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    CODE["version"] = "new"
    run_id = PatchedOrder.run({}).execution_id
    crash_after_body(monkeypatch, "reserve")
    worker_dies(run_id)
    PatchDecision.objects.create(execution_id=run_id, name="tax-v2", taken=False, step="charge")
    monkeypatch.setattr(probes, "active", None)

    CODE["version"] = "deprecated"
    outcome = worker_takes(run_id)

    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    row = Execution.objects.get(pk=run_id)
    assert row.status == ExecutionStatus.NEEDS_ATTENTION
    assert row.failure["kind"] == "patch_removed"
    assert row.failure["step"] == "charge"
    assert "took the old branch of patch 'tax-v2'" in row.failure["message"]
    assert "Deploy code that still has patched('tax-v2')" in row.failure["message"]
    events = list(row.events.order_by("seq").values_list("kind", "step", "data"))
    kinds = [(kind, step) for kind, step, _ in events]
    assert (EventKind.FAIL, "charge") not in kinds
    assert EventKind.ROLLBACK not in [kind for kind, _ in kinds]
    attention = [data for kind, _, data in events if kind == EventKind.ATTENTION]
    assert attention[-1]["kind"] == "patch_removed"
    assert attention[-1]["patch"] == "tax-v2"
    assert attention[-1]["branch"] == "old"
    # Nothing rolled back: the reservation stands, for the code that finishes the run.
    assert of(run_id) == [("reserve", "-"), ("reserve", "-")]
    assert worker_takes(run_id) is None  # parked: not taken again

    # The code with the old branch deployed again: the run moves back and finishes on it.
    CODE["version"] = "new"
    (moved,) = services.migrating.migrate_parked(PatchedOrder, reason="finish on tax-v1")
    assert moved.moved, moved.reason
    assert worker_takes(run_id).ok
    assert of(run_id)[2:] == [("charge", "old"), ("receipt", "old")]


def test_deprecated_patch_records_the_new_branch_for_a_run_without_a_decision() -> None:
    CODE["version"] = "deprecated"
    run_id = PatchedOrder.run({}).execution_id
    assert worker_takes(run_id).ok
    assert decisions(run_id) == [("tax-v2", True, "charge")]
    assert of(run_id)[-1] == ("receipt", "new")


def test_undo_of_a_run_refunds_on_the_branch_it_charged_on() -> None:
    CODE["version"] = "new"
    run_id = PatchedOrder.run({}).execution_id
    PatchDecision.objects.create(execution_id=run_id, name="tax-v2", taken=False, step="charge")
    assert worker_takes(run_id).ok

    services.undo(run_id)

    assert of(run_id)[-3:] == [("receipt", "old"), ("refund", "old"), ("release", "-")]


def test_a_fork_keeps_the_decisions_of_the_steps_it_carries() -> None:
    CODE["version"] = "new"
    run_id = PatchedOrder.run({}).execution_id
    PatchDecision.objects.create(execution_id=run_id, name="early", taken=False, step="reserve")
    assert worker_takes(run_id).ok

    forked = services.fork(run_id, "charge", undo_abandoned=True)

    fork_id = forked.execution_id
    assert ("early", False, "reserve") in decisions(fork_id)
    assert "tax-v2" not in [name for name, _, _ in decisions(fork_id)]


def test_prune_deletes_a_runs_decisions_with_it() -> None:
    CODE["version"] = "new"
    run_id = PatchedOrder.run({}).execution_id
    assert worker_takes(run_id).ok
    Execution.objects.filter(pk=run_id).update(finished_at=timezone.now() - dt.timedelta(days=9))

    services.prune(older_than_days=1)

    assert not PatchDecision.objects.filter(execution_id=run_id).exists()
