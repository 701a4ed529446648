"""Interrupts inside composed children: the root pauses, the interrupt is resumed by its path
through the root, and rollback goes through the child first."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_reactor import Completed, Dispatched, Failed, InProgress, Paused, services
from django_reactor.exceptions import (
    AlreadyResumed,
    IdempotencyKeyReused,
    InterruptClosed,
    InvalidPayload,
    InvalidTransition,
    UnknownInterrupt,
)
from django_reactor.models import (
    Dispatch,
    Execution,
    ExecutionEvent,
    Interrupt,
    Message,
    StepRecord,
)
from django_reactor.states import ExecutionStatus, InterruptStatus, StepStatus
from tests.integration.nested_reactors import (
    FiresNestedOrder,
    NestedContract,
    NestedOrder,
    NestedOrderInBackground,
    NestedOrderSideBySide,
    NestedOrderWithDefault,
    NestedOrderWithReview,
    NestedSubscribe,
)
from tests.integration.reactors import ledger

pytestmark = pytest.mark.django_db(transaction=True)

APPROVED = {"approved": True}


def trace_of(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace]


def child_of(parent_id: Any, step: str) -> Execution:
    return Execution.objects.get(parent_id=parent_id, parent_step=step)


def rollback_order(*execution_ids: Any) -> list[tuple[str, str]]:
    """The undo and compensate entries of several runs' traces, in the order they were written."""
    kinds = ("undo", "undo_skipped", "compensate", "compensate_skipped")
    return list(
        ExecutionEvent.objects.filter(execution_id__in=execution_ids, kind__in=kinds)
        .order_by("at", "id")
        .values_list("kind", "step")
    )


# ---------------------------------------------------------------------------- pausing


def test_a_child_at_its_interrupt_pauses_the_root_and_stays_paused_under_it() -> None:
    outcome = NestedOrder.run({"order": "7"})

    assert isinstance(outcome, Paused)
    assert [i.step for i in outcome.interrupts] == ["checkout.approval"]
    assert outcome.step == "checkout.approval"
    assert outcome.interrupts[0].path == ("checkout", "approval")
    assert outcome.correlation_id == "checkout-7"
    assert outcome.expires_at is not None
    assert outcome.expires_at > timezone.now() + dt.timedelta(minutes=59)
    root = Execution.objects.get(pk=outcome.execution_id)
    child = child_of(root.pk, "checkout")
    assert (root.status, child.status) == (ExecutionStatus.PAUSED, ExecutionStatus.PAUSED)
    assert StepRecord.objects.get(execution=root, step="checkout").status == StepStatus.WAITING
    assert trace_of(root.pk) == [
        ("start", ""),
        ("run", "reserve"),
        ("interrupt", "checkout.approval"),
        ("pause", ""),
    ]
    assert trace_of(child.pk) == [
        ("start", ""),
        ("run", "charge"),
        ("interrupt", "approval"),
        ("pause", ""),
    ]
    handle = NestedOrder.find(root.pk)
    assert [(i.step, i.correlation_id) for i in handle.interrupts] == [
        ("checkout.approval", "checkout-7")
    ]
    assert handle.outcome.interrupts == handle.interrupts  # type: ignore[attr-defined]
    assert ledger.calls == [("run", "reserve"), ("run", "charge")]


@override_settings(REACTOR={"RESUME_TOKENS": True})
def test_the_paused_outcome_carries_the_nested_interrupts_token() -> None:
    outcome = NestedOrder.run({"order": "8"})

    assert isinstance(outcome, Paused)
    assert outcome.token is not None
    finished = services.resume_interrupt(token=outcome.token, payload=APPROVED)
    assert isinstance(finished, Completed)
    assert finished.execution_id == outcome.execution_id


def test_a_root_runs_its_other_steps_and_waits_at_its_own_and_its_childs_interrupts() -> None:
    outcome = NestedOrderWithReview.run({"order": "9"})

    assert isinstance(outcome, Paused)
    assert sorted(i.step for i in outcome.interrupts) == ["checkout.approval", "review"]
    assert trace_of(outcome.execution_id) == [
        ("start", ""),
        ("run", "reserve"),
        ("interrupt", "checkout.approval"),
        ("interrupt", "review"),
        ("run", "audit"),
        ("pause", ""),
    ]
    with pytest.raises(Exception, match=r"several interrupts \(checkout.approval, review\)"):
        services.resume_interrupt(outcome.execution_id, payload=APPROVED)

    again = services.resume_interrupt(outcome.execution_id, step="review", payload={"ok": True})
    assert isinstance(again, Paused)
    assert [i.step for i in again.interrupts] == ["checkout.approval"]
    done = services.resume_interrupt(
        outcome.execution_id, step="checkout.approval", payload=APPROVED
    )
    assert isinstance(done, Completed)
    assert trace_of(outcome.execution_id)[-7:] == [
        ("payload", "review"),
        ("pause", ""),
        ("steer", ""),
        ("payload", "checkout.approval"),
        ("run", "checkout"),
        ("run", "receipt"),
        ("complete", ""),
    ]


# ---------------------------------------------------------------------------- resuming


@pytest.mark.parametrize("path", ["checkout.approval", ("checkout", "approval")])
def test_resume_by_path_continues_the_child_then_the_root(path: Any) -> None:
    paused = NestedOrder.run({"order": "10"})

    outcome = NestedOrder.find(paused.execution_id).resume(path, {"approved": True, "note": "ok"})

    assert isinstance(outcome, Completed)
    assert outcome.execution_id == paused.execution_id
    assert outcome.value["receipt"]["shipped"] is True
    root = Execution.objects.get(pk=paused.execution_id)
    child = child_of(root.pk, "checkout")
    assert (root.status, child.status) == (ExecutionStatus.COMPLETED, ExecutionStatus.COMPLETED)
    assert Interrupt.objects.get(execution=child).payload == {"approved": True, "note": "ok"}
    assert trace_of(root.pk)[3:] == [
        ("pause", ""),
        ("steer", ""),  # on the run that paused (the root): who delivered it
        ("payload", "checkout.approval"),
        ("run", "checkout"),
        ("run", "receipt"),
        ("complete", ""),
    ]
    assert trace_of(child.pk)[3:] == [
        ("pause", ""),
        ("payload", "approval"),
        ("run", "ship"),
        ("complete", ""),
    ]
    assert ledger.calls == [
        ("run", "reserve"),
        ("run", "charge"),
        ("run", "ship"),
        ("run", "receipt"),
    ]


def test_resume_without_a_step_finds_the_one_nested_interrupt_waiting() -> None:
    paused = NestedOrder.run({"order": "11"})

    outcome = services.resume_interrupt(paused.execution_id, payload=APPROVED)

    assert isinstance(outcome, Completed)


def test_resume_by_correlation_id_finds_the_nested_interrupt_and_resumes_the_root() -> None:
    paused = NestedOrder.run({"order": "12"})

    handle = NestedOrder.find_by_correlation_id("checkout-12")
    assert handle.id == paused.execution_id
    outcome = services.resume_interrupt(correlation_id="checkout-12", payload=APPROVED)

    assert isinstance(outcome, Completed)
    assert outcome.execution_id == paused.execution_id
    with pytest.raises(AlreadyResumed, match=rf"'checkout.approval' of execution {handle.id}"):
        services.resume_interrupt(
            correlation_id="checkout-12",
            reactor="tests.nested.NestedOrder",
            payload=APPROVED,
        )


def test_resuming_the_child_execution_directly_is_refused_naming_the_root_and_the_path() -> None:
    paused = NestedOrder.run({"order": "13"})
    child = child_of(paused.execution_id, "checkout")

    expected = (
        rf"cannot resume execution {child.pk} directly: it is the composed child run by step "
        rf"'checkout' of execution {paused.execution_id}.*resumed through execution "
        rf"{paused.execution_id}; resume that execution with step='checkout.approval'"
    )
    with pytest.raises(InvalidTransition, match=expected):
        services.resume_interrupt(child.pk, payload=APPROVED)
    with pytest.raises(InvalidTransition, match=expected):
        services.find(child.pk).resume("approval", APPROVED)
    with pytest.raises(InvalidTransition, match=expected):
        services.issue_resume_token(child.pk, "approval")

    assert Interrupt.objects.get(execution=child).status == InterruptStatus.WAITING
    assert isinstance(services.resume_interrupt(paused.execution_id, payload=APPROVED), Completed)


@pytest.mark.parametrize("path", ["checkout.aproval", "chekout.approval", "checkout", "approval"])
def test_a_path_that_does_not_exist_is_refused_with_the_valid_paths(path: str) -> None:
    paused = NestedOrder.run({"order": "14"})

    with pytest.raises(UnknownInterrupt) as refused:
        services.resume_interrupt(paused.execution_id, step=path, payload=APPROVED)

    assert refused.value.paths == ("checkout.approval",)
    assert f"{path!r} is not an interrupt of tests.nested.NestedOrder" in str(refused.value)
    assert "(its interrupts: checkout.approval)" in str(refused.value)
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.PAUSED


def test_a_path_the_run_has_not_reached_yet_is_kept_for_it() -> None:
    outcome = NestedOrderWithReview.run({"order": "15"})
    Interrupt.objects.filter(step="approval").delete()  # as if the child had not paused yet
    Execution.objects.filter(parent_id=outcome.execution_id).delete()

    kept = services.resume_interrupt(
        outcome.execution_id, step="checkout.approval", payload=APPROVED
    )
    assert isinstance(kept, InProgress)
    assert list(Message.objects.values_list("kind", "topic")) == [("delivery", "checkout.approval")]
    with pytest.raises(AlreadyResumed, match="already has a payload"):
        services.resume_interrupt(outcome.execution_id, step="checkout.approval", payload=APPROVED)


def test_an_invalid_payload_is_validated_by_the_childs_serializer_and_counted_on_the_root() -> None:
    paused = NestedOrder.run({"order": "16"})

    with pytest.raises(InvalidPayload, match=r"interrupt 'checkout\.approval' is invalid") as bad:
        services.resume_interrupt(
            paused.execution_id, step="checkout.approval", payload={"approved": "maybe"}
        )
    assert bad.value.errors == {"approved": ["Must be a valid boolean."]}
    assert bad.value.attempts == 1
    assert trace_of(paused.execution_id)[-1] == ("invalid_payload", "checkout.approval")
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.PAUSED


def test_the_last_invalid_payload_allowed_undoes_the_child_then_the_root_and_fails_it() -> None:
    paused = NestedOrder.run({"order": "17"})
    root_id = paused.execution_id
    child = child_of(root_id, "checkout")

    attempts = []
    for _ in range(3):
        with pytest.raises(InvalidPayload) as bad:
            services.resume_interrupt(root_id, step="checkout.approval", payload={})
        attempts.append((bad.value.attempts, bad.value.run_failed))
    assert attempts == [(1, False), (2, False), (3, True)]

    root = Execution.objects.get(pk=root_id)
    assert root.status == ExecutionStatus.FAILED
    assert root.failure["kind"] == "invalid_payload"
    assert root.failure["step"] == "checkout.approval"
    assert Execution.objects.get(pk=child.pk).status == ExecutionStatus.CANCELLED
    assert Interrupt.objects.get(execution=child).status == InterruptStatus.FAILED
    assert ledger.calls[-2:] == [("undo", "charge"), ("undo", "reserve")]
    assert rollback_order(root_id, child.pk) == [
        ("undo", "charge"),
        ("undo", "checkout"),
        ("undo", "reserve"),
    ]


def test_a_repeated_delivery_with_the_same_key_is_accepted_once() -> None:
    paused = NestedOrder.run({"order": "18"})

    first = services.resume_interrupt(
        paused.execution_id, step="checkout.approval", payload=APPROVED, idempotency_key="k1"
    )
    again = services.resume_interrupt(
        paused.execution_id, step="checkout.approval", payload=APPROVED, idempotency_key="k1"
    )

    assert isinstance(first, Completed)
    assert not first.idempotent_replay
    assert isinstance(again, Completed)
    assert again.idempotent_replay
    assert again.execution_id == paused.execution_id
    assert ledger.calls.count(("run", "ship")) == 1
    with pytest.raises(IdempotencyKeyReused):
        services.resume_interrupt(
            paused.execution_id,
            step="checkout.approval",
            payload={"approved": False},
            idempotency_key="k1",
        )


def test_a_background_nested_interrupt_hands_the_root_to_a_worker() -> None:
    paused = NestedOrderInBackground.run({})

    outcome = services.resume_interrupt(
        paused.execution_id, step="checkout.approval", payload=APPROVED
    )

    assert isinstance(outcome, Dispatched)
    assert outcome.execution_id == paused.execution_id
    root = Execution.objects.get(pk=paused.execution_id)
    child = child_of(root.pk, "checkout")
    assert (root.status, child.status) == (ExecutionStatus.PENDING, ExecutionStatus.PAUSED)
    assert Dispatch.objects.filter(execution=root, reason="resume").count() == 1
    assert StepRecord.objects.get(execution=child, step="approval").status == StepStatus.RESUMED

    finished = services.resume(root.pk)  # what the worker's task does

    assert isinstance(finished, Completed)
    assert Execution.objects.get(pk=child.pk).status == ExecutionStatus.COMPLETED
    assert ledger.calls[-2:] == [("run", "ship"), ("run", "receipt")]


# ---------------------------------------------------------------------------- rolling back


def test_undo_of_the_paused_root_rolls_back_the_child_then_the_root() -> None:
    paused = NestedOrder.run({"order": "19"})
    root_id = paused.execution_id
    child = child_of(root_id, "checkout")

    handle = NestedOrder.find(root_id).undo()

    assert handle.status == ExecutionStatus.CANCELLED
    assert Execution.objects.get(pk=child.pk).status == ExecutionStatus.CANCELLED
    assert Interrupt.objects.get(execution=child).status == InterruptStatus.CANCELLED
    assert ledger.calls[-2:] == [("undo", "charge"), ("undo", "reserve")]
    assert trace_of(root_id)[4:] == [
        ("rollback", ""),
        ("undo", "checkout"),
        ("undo", "reserve"),
        ("cancel", ""),
    ]
    assert trace_of(child.pk)[4:] == [("rollback", ""), ("undo", "charge"), ("cancel", "")]
    # Event by event, across both runs: the child's step, then the parent's, newest first.
    assert rollback_order(root_id, child.pk) == [
        ("undo", "charge"),
        ("undo", "checkout"),
        ("undo", "reserve"),
    ]
    with pytest.raises(InterruptClosed, match="cancelled"):
        services.resume_interrupt(correlation_id="checkout-19", payload=APPROVED)


def test_cancel_of_the_paused_root_closes_the_child_and_a_later_undo_rolls_both_back() -> None:
    paused = NestedOrder.run({"order": "20"})
    root_id = paused.execution_id
    child = child_of(root_id, "checkout")

    services.cancel(root_id, reason="customer left")

    assert Execution.objects.get(pk=child.pk).status == ExecutionStatus.CANCELLED
    assert Interrupt.objects.get(execution=child).status == InterruptStatus.CANCELLED
    assert ledger.calls == [("run", "reserve"), ("run", "charge")]  # cancel rolls nothing back
    with pytest.raises(InterruptClosed):
        services.resume_interrupt(root_id, step="checkout.approval", payload=APPROVED)

    services.undo(root_id)

    assert ledger.calls[-2:] == [("undo", "charge"), ("undo", "reserve")]
    assert rollback_order(root_id, child.pk) == [
        ("undo", "charge"),
        ("undo", "checkout"),
        ("undo", "reserve"),
    ]


def test_an_expired_nested_interrupt_fails_the_root_after_undoing_the_child_then_the_root() -> None:
    paused = NestedOrder.run({"order": "21"})
    root_id = paused.execution_id
    child = child_of(root_id, "checkout")
    Interrupt.objects.filter(execution=child).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )

    assert services.expire_interrupts() == 1

    root = Execution.objects.get(pk=root_id)
    assert root.status == ExecutionStatus.FAILED
    assert root.failure["kind"] == "interrupt_timeout"
    assert "interrupt 'checkout.approval' expired" in root.failure["message"]
    assert Interrupt.objects.get(execution=child).status == InterruptStatus.EXPIRED
    assert ledger.calls[-2:] == [("undo", "charge"), ("undo", "reserve")]
    assert ("expire", "") in trace_of(root_id)
    assert rollback_order(root_id, child.pk) == [
        ("undo", "charge"),
        ("undo", "checkout"),
        ("undo", "reserve"),
    ]


def test_a_later_root_step_failing_while_the_child_waits_rolls_the_child_back_first() -> None:
    from tests.integration.reactors import FAIL_AT

    FAIL_AT.add("audit")
    outcome = NestedOrderWithReview.run({"order": "22"})

    assert isinstance(outcome, Failed)
    child = child_of(outcome.execution_id, "checkout")
    assert Execution.objects.get(pk=child.pk).status == ExecutionStatus.CANCELLED
    assert Interrupt.objects.get(execution=child).status == InterruptStatus.CANCELLED
    assert ledger.calls == [
        ("run", "reserve"),
        ("run", "charge"),
        ("run", "audit"),
        ("compensate", "audit"),
        ("undo", "charge"),
        ("undo", "reserve"),
    ]


# ---------------------------------------------------------------------------- two levels


def test_two_levels_pause_the_root_and_resume_by_the_full_path() -> None:
    paused = NestedSubscribe.run({"order": "30"})

    assert isinstance(paused, Paused)
    assert [i.step for i in paused.interrupts] == ["fulfil.checkout.approval"]
    assert paused.correlation_id == "checkout-30"
    root_id = paused.execution_id
    middle = child_of(root_id, "fulfil")
    leaf = child_of(middle.pk, "checkout")
    assert {e.status for e in Execution.objects.filter(pk__in=[root_id, middle.pk, leaf.pk])} == {
        ExecutionStatus.PAUSED
    }
    assert trace_of(root_id)[-2:] == [("interrupt", "fulfil.checkout.approval"), ("pause", "")]
    assert trace_of(middle.pk)[-2:] == [("interrupt", "checkout.approval"), ("pause", "")]
    with pytest.raises(InvalidTransition, match=rf"through execution {root_id}.*"):
        services.resume_interrupt(middle.pk, payload=APPROVED)
    with pytest.raises(UnknownInterrupt) as refused:
        services.resume_interrupt(root_id, step="checkout.approval", payload=APPROVED)
    assert refused.value.paths == ("fulfil.checkout.approval",)

    outcome = NestedSubscribe.find(root_id).resume(("fulfil", "checkout", "approval"), APPROVED)

    assert isinstance(outcome, Completed)
    assert ledger.calls == [
        ("run", "enrol"),
        ("run", "pick"),
        ("run", "charge"),
        ("run", "ship"),
        ("run", "pack"),
        ("run", "confirm"),
    ]
    assert trace_of(middle.pk)[-4:] == [
        ("payload", "checkout.approval"),
        ("run", "checkout"),
        ("run", "pack"),
        ("complete", ""),
    ]


def test_two_levels_undo_rolls_back_the_grandchild_then_the_child_then_the_root() -> None:
    paused = NestedSubscribe.run({"order": "31"})
    root_id = paused.execution_id
    middle = child_of(root_id, "fulfil")
    leaf = child_of(middle.pk, "checkout")

    services.undo(root_id)

    assert ledger.calls[-3:] == [("undo", "charge"), ("undo", "pick"), ("undo", "enrol")]
    assert rollback_order(root_id, middle.pk, leaf.pk) == [
        ("undo", "charge"),  # the grandchild's
        ("undo", "checkout"),  # the child's step that ran it
        ("undo", "pick"),  # the child's
        ("undo", "fulfil"),  # the root's step that ran the child
        ("undo", "enrol"),  # the root's
    ]
    assert trace_of(root_id)[-4:] == [
        ("rollback", ""),
        ("undo", "fulfil"),
        ("undo", "enrol"),
        ("cancel", ""),
    ]
    statuses = {e.status for e in Execution.objects.filter(pk__in=[root_id, middle.pk, leaf.pk])}
    assert statuses == {ExecutionStatus.CANCELLED}


def test_a_child_that_waits_twice_pauses_the_root_twice() -> None:
    paused = NestedContract.run({})
    assert [i.step for i in paused.interrupts] == ["approvals.first"]

    again = services.resume_interrupt(paused.execution_id, payload=APPROVED)

    assert isinstance(again, Paused)
    assert [i.step for i in again.interrupts] == ["approvals.second"]
    done = services.resume_interrupt(paused.execution_id, step="approvals.second", payload=APPROVED)
    assert isinstance(done, Completed)
    assert trace_of(paused.execution_id) == [
        ("start", ""),
        ("run", "prepare"),
        ("interrupt", "approvals.first"),
        ("pause", ""),
        ("steer", ""),
        ("payload", "approvals.first"),
        ("interrupt", "approvals.second"),
        ("pause", ""),
        ("steer", ""),
        ("payload", "approvals.second"),
        ("run", "approvals"),
        ("run", "archive"),
        ("complete", ""),
    ]
    pauses = ExecutionEvent.objects.filter(execution_id=paused.execution_id, kind="pause")
    assert [e.data["waiting_for"] for e in pauses.order_by("seq")] == [
        ["approvals.first"],
        ["approvals.second"],
    ]


def test_an_expired_nested_interrupt_with_a_default_goes_on_with_it_on_a_worker() -> None:
    paused = NestedOrderWithDefault.run({})
    child = child_of(paused.execution_id, "checkout")
    Interrupt.objects.filter(execution=child).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )

    assert services.expire_interrupts() == 1
    root = Execution.objects.get(pk=paused.execution_id)
    assert root.status == ExecutionStatus.PENDING
    assert Dispatch.objects.filter(execution=root, reason="resume").count() == 1

    finished = services.resume(root.pk)  # what the worker's task does

    assert isinstance(finished, Completed)
    assert Interrupt.objects.get(execution=child).status == InterruptStatus.EXPIRED
    assert ledger.calls[-1] == ("run", "ship")
    assert services.find(child.pk).steps[-1].result["approved"] is False


def test_a_payload_accepted_while_the_root_is_moving_is_taken_up_when_it_pauses() -> None:
    paused = NestedOrder.run({"order": "23"})
    root_id = paused.execution_id
    # As if the root were still running its other steps when the payload came.
    Execution.objects.filter(pk=root_id).update(status=ExecutionStatus.RUNNING)

    accepted = services.resume_interrupt(root_id, step="checkout.approval", payload=APPROVED)

    assert accepted.status == ExecutionStatus.RUNNING
    assert accepted.execution_id == root_id
    Execution.objects.filter(pk=root_id).update(status=ExecutionStatus.PAUSED)  # it pauses
    handed = services.after_pause(Paused(execution_id=root_id))
    assert isinstance(handed, Dispatched)
    assert isinstance(services.resume(root_id), Completed)
    assert ledger.calls[-2:] == [("run", "ship"), ("run", "receipt")]


def test_in_an_async_unit_the_unit_pauses_for_its_child_and_is_resumed_by_its_own_id() -> None:
    outcome = FiresNestedOrder.run({"order": "24"})
    assert isinstance(outcome, Completed)  # nobody reads the unit
    unit = child_of(outcome.execution_id, "unit")

    paused = services.resume(unit.pk)  # a worker runs the unit

    assert isinstance(paused, Paused)
    assert [i.step for i in paused.interrupts] == ["checkout.approval"]
    assert Execution.objects.get(pk=unit.pk).status == ExecutionStatus.PAUSED
    assert services.find(outcome.execution_id).interrupts == ()  # the parent is not paused
    done = services.resume_interrupt(correlation_id="checkout-24", payload=APPROVED)
    assert isinstance(done, Completed)
    assert done.execution_id == unit.pk


def test_with_steps_side_by_side_the_child_pauses_the_root_after_the_others_ran() -> None:
    paused = NestedOrderSideBySide.run({"order": "25"})

    assert isinstance(paused, Paused)
    assert [i.step for i in paused.interrupts] == ["checkout.approval"]
    assert sorted(ledger.calls) == [
        ("run", "audit"),
        ("run", "charge"),
        ("run", "notify"),
        ("run", "reserve"),
    ]
    done = services.resume_interrupt(paused.execution_id, payload=APPROVED)
    assert isinstance(done, Completed)
    assert ledger.calls[-2:] == [("run", "ship"), ("run", "receipt")]


def test_with_steps_side_by_side_undo_still_goes_through_the_child_in_its_place() -> None:
    paused = NestedOrderSideBySide.run({"order": "26"})
    child = child_of(paused.execution_id, "checkout")
    # The child ran alone and paused; then audit and notify ran side by side.
    ran = [step for kind, step in trace_of(paused.execution_id) if kind == "run"]
    assert ran[0] == "reserve"
    assert sorted(ran[1:]) == ["audit", "notify"]

    services.undo(paused.execution_id)

    # Newest first: the two side-by-side steps (in reverse order of completion), then the
    # waiting child in its place (its own step, then the compose step), then reserve.
    assert rollback_order(paused.execution_id, child.pk) == [
        ("undo", ran[2]),
        ("undo", ran[1]),
        ("undo", "charge"),
        ("undo", "checkout"),
        ("undo", "reserve"),
    ]
