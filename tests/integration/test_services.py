"""undo, cancel and retry: the operations admin, API and commands share."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import Reactor, Step, acting_as, arg, services, step
from django_reactor.engine.serialization import decode
from django_reactor.exceptions import (
    AlreadyRetried,
    ExecutionBusy,
    InvalidTransition,
    ReactorNotRegistered,
)
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus, RollbackStatus
from tests.integration.reactors import FAIL_AT, Fragile, Transfer, ledger
from tests.shapes import give_shape

pytestmark = pytest.mark.django_db

INPUTS = {"account": "acc-1", "amount": 25, "pin": "1234"}


def kinds(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace]


# ---------------------------------------------------------------------------- undo


def test_undo_rolls_back_a_completed_run_newest_first_then_cancels() -> None:
    outcome = Transfer.run(INPUTS)
    ledger.clear()
    handle = services.undo(outcome.execution_id)
    assert handle.status == ExecutionStatus.CANCELLED
    assert ledger.calls == [("undo", "notify"), ("undo", "credit"), ("undo", "debit")]
    assert kinds(outcome.execution_id)[-5:] == [
        ("rollback", ""),
        ("undo", "notify"),
        ("undo", "credit"),
        ("undo", "debit"),
        ("cancel", ""),
    ]
    assert all(s.rollback == RollbackStatus.UNDONE for s in handle.steps)


def test_second_undo_changes_nothing() -> None:
    outcome = Transfer.run(INPUTS)
    services.undo(outcome.execution_id)
    ledger.clear()
    before = kinds(outcome.execution_id)
    handle = services.undo(outcome.execution_id)
    assert handle.status == ExecutionStatus.CANCELLED
    assert ledger.calls == []
    assert kinds(outcome.execution_id) == before


def test_undo_refuses_failed_and_running_runs() -> None:
    FAIL_AT.add("credit")
    failed = Transfer.run(INPUTS)
    with pytest.raises(InvalidTransition, match="it is failed; undo works on"):
        services.undo(failed.execution_id)


def test_undo_of_a_halted_run() -> None:
    from django_reactor import Halt

    class Halts(Reactor):
        a = step(_Tracked)

        @step(wait_for=["a"])
        def stop() -> Any:
            return Halt("enough")

    outcome = Halts.run({})
    assert outcome.status == ExecutionStatus.HALTED
    handle = services.undo(outcome.execution_id)
    assert handle.status == ExecutionStatus.CANCELLED
    assert ("undo", "a") in ledger.calls


class _Tracked(Step):
    def run(self) -> str:
        ledger("run", self.context.step)
        return "ok"

    def undo(self, result: Any) -> None:
        ledger("undo", self.context.step)


class Interrupted(Reactor):
    class Inputs(serializers.Serializer):
        how = serializers.CharField()

    a = step(_Tracked)

    @step(how=arg.input("how"), wait_for=["a"])
    def b(how: str) -> None:
        ledger("run", "b")
        raise {"ctrl-c": KeyboardInterrupt, "exit": SystemExit}[how]()

    @b.compensate
    def clean_b(error: Any, how: str) -> None:
        ledger("compensate", "b")


@pytest.mark.parametrize("how", ["ctrl-c", "exit"])
def test_interrupted_run_is_aborted_then_undo_compensates_and_undoes(how: str) -> None:
    exc = {"ctrl-c": KeyboardInterrupt, "exit": SystemExit}[how]
    with pytest.raises(exc):
        Interrupted.run({"how": how})
    row = Execution.objects.get()
    assert row.status == ExecutionStatus.ABORTED
    assert row.lease_owner is None
    assert ledger.calls == [("run", "a"), ("run", "b")]
    ledger.clear()
    handle = services.undo(row.id)
    assert ledger.calls == [("compensate", "b"), ("undo", "a")]
    assert handle.status == ExecutionStatus.CANCELLED
    assert kinds(row.id)[:4] == [("start", ""), ("run", "a"), ("fail", "b"), ("abort", "")]


def test_failed_rollback_needs_attention_and_undo_retries_only_what_failed() -> None:
    FAIL_AT.update({"second", "undo"})
    outcome = Fragile.run({})
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    assert [f.step for f in outcome.rollback_failures] == ["first"]
    assert services.find(outcome.execution_id).step("first").rollback == RollbackStatus.FAILED

    FAIL_AT.discard("undo")
    ledger.clear()
    handle = services.undo(outcome.execution_id)
    assert ledger.calls == [("undo", "first")]  # second was compensated already
    assert handle.status == ExecutionStatus.FAILED
    assert handle.step("first").rollback == RollbackStatus.UNDONE


def test_undo_refuses_a_run_owned_by_a_live_process() -> None:
    outcome = Transfer.run(INPUTS)
    Execution.objects.filter(pk=outcome.execution_id).update(
        lease_owner="elsewhere:1", lease_expires_at="2999-01-01T00:00:00Z"
    )
    with pytest.raises(ExecutionBusy, match="elsewhere:1 is working on it"):
        services.undo(outcome.execution_id)


# ---------------------------------------------------------------------------- cancel


def test_cancel_an_aborted_run_without_rollback() -> None:
    with pytest.raises(KeyboardInterrupt):
        Interrupted.run({"how": "ctrl-c"})
    row = Execution.objects.get()
    ledger.clear()
    with acting_as("ops desk"):
        handle = services.cancel(row.id, reason="operator gave up")
    assert handle.status == ExecutionStatus.CANCELLED
    assert ledger.calls == []
    assert handle.trace[-1].kind == "cancel"
    assert handle.trace[-1].data == {
        "reason": "operator gave up",
        "previous_status": "aborted",
        "by": "ops desk",
        "via": "python",
    }
    # undo still rolls back what the cancelled run left behind
    services.undo(row.id)
    assert ledger.calls == [("compensate", "b"), ("undo", "a")]


def test_cancel_refuses_finished_runs() -> None:
    outcome = Transfer.run(INPUTS)
    with pytest.raises(InvalidTransition, match="it is completed; cancel works on"):
        services.cancel(outcome.execution_id)


def test_cancel_of_a_running_run_is_a_request_honoured_at_the_next_checkpoint() -> None:
    holder: dict[str, Any] = {}

    class AsksToCancel(Step):
        def run(self) -> str:
            holder["handle"] = services.cancel(self.context.execution_id, reason="stop")
            return "first done"

    class Long(Reactor):
        first = step(AsksToCancel)
        second = step(_Tracked, wait_for=["first"])

    outcome = Long.run({})
    assert holder["handle"].status == ExecutionStatus.RUNNING  # only requested
    assert outcome.status == ExecutionStatus.CANCELLED
    assert ("run", "second") not in ledger.calls
    assert kinds(outcome.execution_id)[-1] == ("cancel", "")


# ---------------------------------------------------------------------------- retry


def test_retry_runs_a_failed_execution_again_as_a_new_linked_one() -> None:
    FAIL_AT.add("credit")
    failed = Transfer.run(INPUTS)
    FAIL_AT.clear()
    ledger.clear()
    outcome = services.retry(failed.execution_id)
    assert outcome.ok
    assert outcome.execution_id != failed.execution_id
    new = services.find(outcome.execution_id)
    assert new.retry_of == failed.execution_id
    assert new.inputs["pin"] == "[REDACTED]"
    # The retry seals its inputs again, with a token of its own; the steps got the real pin.
    stored = Execution.objects.get(pk=outcome.execution_id).inputs["pin"]
    assert stored != Execution.objects.get(pk=failed.execution_id).inputs["pin"]
    assert decode(stored) == "1234"
    assert ledger.calls == [("run", "debit"), ("run", "credit"), ("run", "notify")]
    assert kinds(failed.execution_id)[-1] == ("rerun", "")


def test_a_failed_run_is_retried_once() -> None:
    FAIL_AT.add("credit")
    failed = Transfer.run(INPUTS)
    first = services.retry(failed.execution_id)
    with pytest.raises(AlreadyRetried, match=f"already retried as {first.execution_id}"):
        services.retry(failed.execution_id)
    # the retry failed too: it can be retried in turn
    FAIL_AT.clear()
    assert services.retry(first.execution_id).ok


def test_retry_refuses_other_statuses_and_invalid_inputs() -> None:
    done = Transfer.run(INPUTS)
    with pytest.raises(InvalidTransition, match="it is completed; only failed runs"):
        services.retry(done.execution_id)
    invalid = Transfer.run({"amount": "x"})
    with pytest.raises(InvalidTransition, match="its inputs were invalid"):
        services.retry(invalid.execution_id)


def test_undo_takes_over_a_run_whose_process_died() -> None:
    outcome = Transfer.run(INPUTS)
    Execution.objects.filter(pk=outcome.execution_id).update(
        status=ExecutionStatus.RUNNING, lease_owner="dead:1", lease_expires_at="2000-01-01T00:00Z"
    )
    ledger.clear()
    handle = services.undo(outcome.execution_id)
    assert ledger.calls == [("undo", "notify"), ("undo", "credit"), ("undo", "debit")]
    assert handle.status == ExecutionStatus.CANCELLED


def test_cancel_abandons_a_run_whose_process_died_and_fences_it_out() -> None:
    outcome = Transfer.run(INPUTS)
    Execution.objects.filter(pk=outcome.execution_id).update(
        status=ExecutionStatus.RUNNING, lease_owner="dead:1", lease_expires_at="2000-01-01T00:00Z"
    )
    fence = Execution.objects.get(pk=outcome.execution_id).fence
    handle = services.cancel(outcome.execution_id, reason="worker lost")
    assert handle.status == ExecutionStatus.CANCELLED
    assert Execution.objects.get(pk=outcome.execution_id).fence == fence + 1


class InterruptedUndo(Step):
    def run(self) -> str:
        ledger("run", self.context.step)
        return "ok"

    def undo(self, result: Any) -> None:
        ledger("undo", self.context.step)
        if "interrupt-undo" in FAIL_AT:
            FAIL_AT.discard("interrupt-undo")
            raise KeyboardInterrupt


class RollbackInterrupted(Reactor):
    a = step(_Tracked)
    b = step(InterruptedUndo, wait_for=["a"])

    @step(wait_for=["b"])
    def c() -> None:
        raise RuntimeError("c failed")


def test_a_rollback_cut_off_by_an_interruption_is_finished_by_undo_and_ends_failed() -> None:
    FAIL_AT.add("interrupt-undo")
    with pytest.raises(KeyboardInterrupt):
        RollbackInterrupted.run({})
    row = Execution.objects.get()
    assert row.status == ExecutionStatus.ABORTED
    ledger.clear()
    handle = services.undo(row.id)
    assert ledger.calls == [("undo", "b"), ("undo", "a")]
    assert handle.status == ExecutionStatus.FAILED
    assert handle.error is not None
    assert (handle.error.step, handle.error.message) == ("c", "c failed")
    assert handle.outcome.status == ExecutionStatus.FAILED
    assert [(e.kind, e.step) for e in handle.trace if e.step] == [
        ("run", "a"),
        ("run", "b"),
        ("fail", "c"),
        ("compensate_skipped", "c"),
        ("undo", "b"),
        ("undo", "a"),
    ]


def test_cancel_reason_reaches_the_trace_and_the_outcome() -> None:
    class AsksToCancel(Step):
        def run(self) -> str:
            services.cancel(self.context.execution_id, reason="customer called")
            return "done"

    class Long(Reactor):
        first = step(AsksToCancel)
        second = step(_Tracked, wait_for=["first"])

    with acting_as("support tool"):
        outcome = Long.run({})
    assert outcome.reason == "customer called"
    # The run wrote its own entry when it stopped; who asked comes from the steering history.
    assert services.find(outcome.execution_id).trace[-1].data == {
        "reason": "customer called",
        "by": "support tool",
        "via": "python",
    }
    assert services.find(outcome.execution_id).outcome.reason == "customer called"


def test_fixing_a_failed_rollback_clears_it_from_the_failure() -> None:
    FAIL_AT.update({"second", "undo"})
    outcome = Fragile.run({})
    assert len(outcome.rollback_failures) == 1
    FAIL_AT.discard("undo")
    handle = services.undo(outcome.execution_id)
    assert handle.status == ExecutionStatus.FAILED
    assert handle.error is not None
    assert handle.error.step == "second"
    assert handle.error.rollback_failures == ()


def test_a_failed_undo_of_a_completed_run_is_described() -> None:
    outcome = Fragile.run({})
    FAIL_AT.add("undo")
    handle = services.undo(outcome.execution_id)
    assert handle.status == ExecutionStatus.NEEDS_ATTENTION
    assert handle.error is not None
    assert handle.error.kind == "rollback"
    assert [f.step for f in handle.error.rollback_failures] == ["first"]
    assert handle.trace[-1].kind == "fail"
    assert handle.trace[-1].data["status"] == ExecutionStatus.NEEDS_ATTENTION
    FAIL_AT.discard("undo")
    fixed = services.undo(outcome.execution_id)
    assert fixed.status == ExecutionStatus.CANCELLED
    assert fixed.error is None
    assert fixed.trace[-1].kind == "cancel"


def test_undo_after_cancelling_a_dead_run_compensates_the_step_in_flight() -> None:
    from django_reactor.models import ExecutionEvent, StepRecord

    outcome = Transfer.run(INPUTS)
    # The database as a process leaves it when it dies inside "notify": no record of that step.
    StepRecord.objects.filter(execution_id=outcome.execution_id, step="notify").delete()
    ExecutionEvent.objects.filter(execution_id=outcome.execution_id, seq__gte=5).delete()
    Execution.objects.filter(pk=outcome.execution_id).update(
        status=ExecutionStatus.RUNNING,
        current_step="notify",
        lease_owner="dead:1",
        lease_expires_at="2000-01-01T00:00Z",
        finished_at=None,
    )
    services.cancel(outcome.execution_id, reason="worker lost")
    ledger.clear()
    handle = services.undo(outcome.execution_id)
    assert ledger.calls == [("compensate", "notify"), ("undo", "credit"), ("undo", "debit")]
    assert handle.status == ExecutionStatus.CANCELLED


def test_a_cancel_request_during_the_last_step_lets_the_run_complete() -> None:
    class LastAsks(Step):
        def run(self) -> str:
            services.cancel(self.context.execution_id, reason="too late")
            return "done"

    class Short(Reactor):
        first = step(_Tracked)
        last = step(LastAsks, wait_for=["first"])

    assert Short.run({}).ok


def test_undo_refuses_a_run_whose_steps_changed_since() -> None:
    from django_reactor.exceptions import DefinitionChanged

    outcome = Transfer.run(INPUTS)
    give_shape(outcome.execution_id, {"debit": {"impl": "elsewhere.Debit", "depends_on": []}})
    with pytest.raises(DefinitionChanged, match="step 'debit' ran but its implementation"):
        services.undo(outcome.execution_id)
    assert ledger.calls[-1] == ("run", "notify")  # nothing was undone


# ---------------------------------------------------------------------------- by name


class NamedLookup(Reactor):
    """Registered under a name of its own, not its dotted path."""

    class Inputs(serializers.Serializer):
        amount = serializers.IntegerField()

    @step(amount=arg.input("amount"))
    def double(amount: int) -> int:
        return amount * 2

    class Meta:
        name = "tests.services.NamedLookup"
        returns = "double"


@pytest.mark.parametrize(
    "name",
    [
        "tests.services.NamedLookup",  # the registered name
        "tests.integration.test_services.NamedLookup",  # the class's dotted path
        "NamedLookup",  # the class name of one registered reactor
    ],
)
def test_run_takes_a_reactor_by_name_as_the_commands_do(name: str) -> None:
    outcome = services.run(name, {"amount": 21})
    assert outcome.status == ExecutionStatus.COMPLETED, outcome
    assert outcome.value == 42
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.reactor == "tests.services.NamedLookup"
    assert [(e.kind, e.step) for e in services.find(row.pk).trace] == [
        ("start", ""),
        ("run", "double"),
        ("complete", ""),
    ]


def test_run_in_background_takes_a_reactor_by_name() -> None:
    outcome = services.run_in_background("NamedLookup", {"amount": 1})
    assert outcome.status == ExecutionStatus.PENDING
    assert Execution.objects.get(pk=outcome.execution_id).reactor == "tests.services.NamedLookup"


def test_a_misspelt_reactor_name_is_refused_with_the_close_names_and_starts_nothing() -> None:
    before = Execution.objects.count()
    with pytest.raises(ReactorNotRegistered, match=r"did you mean 'tests\.services\.NamedLookup'"):
        services.run("NamedLokup", {"amount": 1})
    with pytest.raises(ReactorNotRegistered) as refused:
        services.run("tests.services.NamedLookp", {"amount": 1})
    assert refused.value.suggestions[0] == "tests.services.NamedLookup"
    with pytest.raises(ReactorNotRegistered, match="an async step's unit, not a reactor"):
        services.run("tests.services.NamedLookup:double", {"amount": 1})
    assert Execution.objects.count() == before
