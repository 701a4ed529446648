"""Interrupts: pausing, validated payloads, one winner per interrupt, timeouts, closing."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connections
from rest_framework import serializers

from django_reactor import (
    Completed,
    ContinueWith,
    Dispatched,
    Failed,
    InProgress,
    Paused,
    Reactor,
    arg,
    interrupt,
    services,
    step,
    store,
)
from django_reactor.exceptions import (
    AlreadyResumed,
    CorrelationIdTaken,
    DefinitionError,
    InterruptClosed,
    InterruptNotFound,
    InvalidPayload,
    UnknownInterrupt,
)
from django_reactor.models import Dispatch, Execution, Interrupt, Message, StepRecord
from django_reactor.states import ExecutionStatus, InterruptStatus
from tests.integration.reactors import FAIL_AT, Tracked, ledger

pytestmark = pytest.mark.django_db(transaction=True)


class Approval(serializers.Serializer):
    approved = serializers.BooleanField()
    note = serializers.CharField(max_length=20, required=False, default="")


class Refund(Reactor):
    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    request = step(Tracked, order=arg.input("order"))
    approval = interrupt(
        after=["request"],
        payload=Approval,
        correlation_id=lambda run: f"refund-{run.inputs['order']}",
        max_attempts=2,
    )
    refund = step(Tracked, approved=arg.result("approval", "approved"))


class RefundInBackground(Reactor):
    request = step(Tracked)
    approval = interrupt(after="request", payload=Approval, resume="background")
    refund = step(Tracked, approved=arg.result("approval", "approved"))


class DatedApproval(serializers.Serializer):
    on = serializers.DateField()


class Dated(Reactor):
    request = step(Tracked)
    approval = interrupt(after="request", payload=DatedApproval)
    refund = step(Tracked, on=arg.result("approval", "on"))


class DatedInBackground(Reactor):
    request = step(Tracked)
    approval = interrupt(after="request", payload=DatedApproval, resume="background")
    refund = step(Tracked, on=arg.result("approval", "on"))


class TwoApprovals(Reactor):
    request = step(Tracked)
    finance = interrupt(after="request", payload=Approval)
    legal = interrupt(after="request", payload=Approval)
    pay = step(Tracked, wait_for=["finance", "legal"])


class Expiring(Reactor):
    request = step(Tracked)
    approval = interrupt(after="request", payload=Approval, timeout=60)
    refund = step(Tracked, wait_for=["approval"])


class ExpiringWithDefault(Reactor):
    request = step(Tracked)
    approval = interrupt(
        after="request", payload=Approval, timeout=60, on_timeout=ContinueWith({"approved": False})
    )
    refund = step(Tracked, approved=arg.result("approval", "approved"))


def trace(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in store.event_rows(execution_id)]


def test_a_run_pauses_at_its_interrupt_and_resumes_with_the_payload() -> None:
    paused = Refund.run({"order": "A1"})

    assert isinstance(paused, Paused)
    assert (paused.step, paused.correlation_id, paused.expires_at) == (
        "approval",
        "refund-A1",
        None,
    )
    row = Execution.objects.get(pk=paused.execution_id)
    assert (row.status, row.lease_owner, row.current_step) == ("paused", None, "approval")
    assert services.find(row.id).outcome == paused.__class__(
        execution_id=row.id, interrupts=paused.interrupts
    )

    outcome = services.resume_interrupt(row.id, step="approval", payload={"approved": True})

    assert isinstance(outcome, Completed)
    assert outcome.value["approval"] == {"approved": True, "note": ""}
    assert outcome.value["refund"] == {"step": "refund", "approved": True}
    assert trace(row.id) == [
        ("start", ""),
        ("run", "request"),
        ("interrupt", "approval"),
        ("pause", ""),
        ("steer", ""),  # who delivered it, when (the steering history has it too)
        ("payload", "approval"),
        ("run", "refund"),
        ("complete", ""),
    ]
    assert Interrupt.objects.get(execution_id=row.id).status == InterruptStatus.RESUMED


def test_resume_by_correlation_id_without_naming_the_step() -> None:
    paused = Refund.run({"order": "B2"})
    outcome = services.resume_interrupt(correlation_id="refund-B2", payload={"approved": False})
    assert isinstance(outcome, Completed)
    assert outcome.execution_id == paused.execution_id
    assert outcome.value["refund"]["approved"] is False


def test_a_second_delivery_is_refused_and_changes_nothing() -> None:
    paused = Refund.run({"order": "C3"})
    services.resume_interrupt(paused.execution_id, payload={"approved": True})
    with pytest.raises(AlreadyResumed, match="already accepted a payload"):
        services.resume_interrupt(paused.execution_id, payload={"approved": False})
    assert ledger.calls == [("run", "request"), ("run", "refund")]


def test_a_delivery_that_lost_the_race_to_a_finished_run_is_already_resumed() -> None:
    from django_reactor import store

    paused = Refund.run({"order": "C4"})
    seen = Interrupt.objects.get(execution_id=paused.execution_id)  # read before the winner
    assert services.resume_interrupt(paused.execution_id, payload={"approved": True}).ok
    with pytest.raises(AlreadyResumed, match="already accepted a payload"):
        store.interrupts.claim(seen, {"approved": False}, inline_owner="late:1")
    assert Interrupt.objects.get(pk=seen.pk).payload == {"approved": True, "note": ""}


def test_an_invalid_payload_is_counted_and_the_last_allowed_one_fails_the_run() -> None:
    paused = Refund.run({"order": "D4"})

    with pytest.raises(InvalidPayload) as first:
        services.resume_interrupt(paused.execution_id, payload={"approved": "perhaps"})
    assert (first.value.attempts, first.value.run_failed) == (1, False)
    assert "approved" in first.value.errors
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.PAUSED

    with pytest.raises(InvalidPayload) as second:
        services.resume_interrupt(paused.execution_id, payload={"note": "x" * 50})
    assert (second.value.attempts, second.value.run_failed) == (2, True)

    row = Execution.objects.get(pk=paused.execution_id)
    assert row.status == ExecutionStatus.FAILED
    assert row.failure["kind"] == "invalid_payload"
    assert set(row.failure["field_errors"]) == {"approved", "note"}
    assert ledger.calls == [("run", "request"), ("undo", "request")]
    assert [k for k, _ in trace(row.id)][-5:] == [
        "invalid_payload",
        "invalid_payload",
        "rollback",
        "undo",
        "fail",
    ]
    assert Interrupt.objects.get(execution_id=row.id).status == InterruptStatus.FAILED
    with pytest.raises(InterruptClosed) as late:
        services.resume_interrupt(row.id, payload={"approved": True})
    assert late.value.reason == "failed"


def test_without_max_attempts_invalid_payloads_leave_the_run_paused() -> None:
    paused = TwoApprovals.run({})
    for attempt in range(1, 4):
        with pytest.raises(InvalidPayload) as refused:
            services.resume_interrupt(paused.execution_id, step="legal", payload=[1, 2])
        assert refused.value.attempts == attempt
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.PAUSED


def test_several_interrupts_wait_at_once_and_the_run_goes_on_after_the_last() -> None:
    paused = TwoApprovals.run({})
    assert [i.step for i in paused.interrupts] == ["finance", "legal"]
    with pytest.raises(InterruptNotFound, match="several interrupts"):
        services.resume_interrupt(paused.execution_id, payload={"approved": True})

    first = services.resume_interrupt(paused.execution_id, step="legal", payload={"approved": True})
    assert isinstance(first, Paused)
    assert [i.step for i in first.interrupts] == ["finance"]

    second = services.resume_interrupt(
        paused.execution_id, step="finance", payload={"approved": True}
    )
    assert isinstance(second, Completed)
    assert ledger.calls == [("run", "request"), ("run", "pay")]


def test_background_resume_validates_and_claims_here_and_dispatches_the_rest() -> None:
    paused = RefundInBackground.run({})
    outcome = services.resume_interrupt(paused.execution_id, payload={"approved": True})
    assert isinstance(outcome, Dispatched)
    row = Execution.objects.get(pk=paused.execution_id)
    assert row.status == ExecutionStatus.PENDING
    assert Dispatch.objects.filter(execution=row, reason="resume").count() == 1
    assert StepRecord.objects.get(execution=row, step="approval").status == "resumed"
    assert ledger.calls == [("run", "request")]

    finished = services.resume(row.id)  # what the worker's task does

    assert isinstance(finished, Completed)
    assert finished.value["refund"]["approved"] is True
    assert ledger.calls == [("run", "request"), ("run", "refund")]


@pytest.mark.parametrize("reactor", [Dated, DatedInBackground])
def test_a_payload_holding_a_date_is_recorded_as_stored_when_the_run_goes_on(
    reactor: type[Reactor],
) -> None:
    """The accepted payload is stored encoded; the run that goes on records it so again (it
    once wrote the decoded date, which JSON cannot hold)."""
    paused = reactor.run({})
    outcome = services.resume_interrupt(paused.execution_id, payload={"on": "2024-05-01"})
    if isinstance(outcome, Dispatched):
        outcome = services.resume(paused.execution_id)  # what the worker's task does
    assert isinstance(outcome, Completed), outcome
    assert outcome.value["refund"]["on"] == dt.date(2024, 5, 1)
    record = StepRecord.objects.get(execution_id=paused.execution_id, step="approval")
    assert record.result == {"on": {"__reactor_type__": "date", "v": "2024-05-01"}}


@pytest.mark.postgres
@pytest.mark.mariadb
def test_concurrent_deliveries_resume_the_interrupt_once() -> None:
    paused = RefundInBackground.run({})
    barrier = threading.Barrier(4, timeout=10)
    results: list[Any] = []

    def deliver(approved: bool) -> None:
        try:
            barrier.wait()
            results.append(
                services.resume_interrupt(paused.execution_id, payload={"approved": approved})
            )
        except Exception as exc:
            results.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deliver, args=(i % 2 == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)

    assert sum(isinstance(r, Dispatched) for r in results) == 1, results
    assert sum(isinstance(r, AlreadyResumed) for r in results) == 3, results
    assert Dispatch.objects.filter(execution_id=paused.execution_id, reason="resume").count() == 1


def test_a_payload_before_the_run_reaches_its_interrupt_is_kept_by_execution_id_only() -> None:
    paused = Refund.run({"order": "E5"})
    other = Execution.objects.create(reactor=Refund.definition.name, definition_hash="x")
    kept = services.resume_interrupt(other.id, payload={"approved": True})
    assert kept == InProgress(execution_id=other.id, status=other.status)
    assert list(Message.objects.values_list("kind", "topic", "status", "payload")) == [
        ("delivery", "approval", "unread", {"approved": True, "note": ""})
    ]
    with pytest.raises(InvalidPayload, match="nothing was kept"):
        services.resume_interrupt(other.id, step="approval", payload={"approved": "maybe"})
    with pytest.raises(UnknownInterrupt):
        services.resume_interrupt(other.id, step="request", payload={"approved": True})
    # A correlation id names no run until the run reaches its interrupt.
    with pytest.raises(InterruptNotFound, match="deliver the payload again later"):
        services.resume_interrupt(correlation_id="refund-unknown", payload={"approved": True})
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.PAUSED


def test_a_correlation_id_held_by_a_waiting_run_fails_the_run_that_would_reuse_it() -> None:
    Refund.run({"order": "F6"})
    clash = Refund.run({"order": "F6"})
    assert isinstance(clash, Failed)
    assert clash.error.kind == "correlation"
    assert "already used by execution" in clash.error.message
    assert ledger.calls == [("run", "request"), ("run", "request"), ("undo", "request")]


def test_a_correlation_callable_that_raises_fails_the_run_with_its_reason() -> None:
    class Broken(Reactor):
        request = step(Tracked)
        approval = interrupt(after="request", correlation_id=lambda run: 1 / 0)

    outcome = Broken.run({})
    assert isinstance(outcome, Failed)
    assert outcome.error.message == (
        "interrupt 'approval': correlation_id raised ZeroDivisionError: division by zero"
    )
    assert ledger.calls == [("run", "request"), ("undo", "request")]


def expire_now(execution_id: Any) -> None:
    Interrupt.objects.filter(execution_id=execution_id).update(
        expires_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    )


def test_an_expired_interrupt_fails_and_undoes_the_run_and_refuses_late_payloads() -> None:
    paused = Expiring.run({})
    assert paused.expires_at is not None
    expire_now(paused.execution_id)
    with pytest.raises(InterruptClosed) as early:
        services.resume_interrupt(paused.execution_id, payload={"approved": True})
    assert early.value.reason == "expired"

    assert services.sweep().expired == 1

    row = Execution.objects.get(pk=paused.execution_id)
    assert (row.status, row.failure["kind"]) == ("failed", "interrupt_timeout")
    assert ledger.calls == [("run", "request"), ("undo", "request")]
    with pytest.raises(InterruptClosed):
        services.resume_interrupt(row.id, payload={"approved": True})


def test_an_expired_interrupt_with_a_default_payload_continues_in_the_background() -> None:
    paused = ExpiringWithDefault.run({})
    expire_now(paused.execution_id)
    assert services.sweep().expired == 1
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.PENDING
    finished = services.resume(paused.execution_id)
    assert isinstance(finished, Completed)
    assert finished.value["refund"]["approved"] is False


def test_cancelling_or_undoing_a_paused_run_closes_its_interrupts() -> None:
    cancelled = Refund.run({"order": "G7"})
    services.cancel(cancelled.execution_id)
    with pytest.raises(InterruptClosed) as refused:
        services.resume_interrupt(cancelled.execution_id, payload={"approved": True})
    assert refused.value.reason == "cancelled"

    undone = Refund.run({"order": "G7"})  # the correlation id is free again
    assert isinstance(undone, Paused)
    services.undo(undone.execution_id)
    assert Execution.objects.get(pk=undone.execution_id).status == ExecutionStatus.CANCELLED
    assert Interrupt.objects.get(execution_id=undone.execution_id).status == "cancelled"
    assert ("undo", "request") in ledger.calls


def test_a_resume_token_resumes_once_and_only_its_interrupt() -> None:
    paused = Refund.run({"order": "H8"})
    token = services.issue_resume_token(paused.execution_id, "approval")
    assert len(token) >= 43
    stored = Interrupt.objects.get(execution_id=paused.execution_id).token_hash
    assert stored is not None
    assert token not in stored

    with pytest.raises(InterruptNotFound):
        services.resume_interrupt(token=token[:-2] + "xx", payload={"approved": True})
    outcome = services.resume_interrupt(token=token, payload={"approved": True})
    assert isinstance(outcome, Completed)
    with pytest.raises(InterruptNotFound):
        services.resume_interrupt(token=token, payload={"approved": True})


def test_a_failing_step_after_the_interrupt_undoes_everything_before_it() -> None:
    paused = Refund.run({"order": "J9"})
    FAIL_AT.add("refund")
    outcome = services.resume_interrupt(paused.execution_id, payload={"approved": True})
    assert isinstance(outcome, Failed)
    assert ledger.calls == [
        ("run", "request"),
        ("run", "refund"),
        ("compensate", "refund"),
        ("undo", "request"),
    ]


def test_interrupt_declarations_are_checked_when_the_class_is_defined() -> None:
    with pytest.raises(DefinitionError, match="must be a DRF serializer class"):
        interrupt(payload=dict)
    with pytest.raises(DefinitionError, match='must be "inline" or "background"'):
        interrupt(resume="later")
    with pytest.raises(DefinitionError, match="must be longer than zero"):
        interrupt(timeout=0)
    with pytest.raises(DefinitionError, match='"fail" or ContinueWith'):
        interrupt(on_timeout="continue")
    with pytest.raises(DefinitionError, match="positive integer"):
        interrupt(max_attempts=0)
    with pytest.raises(DefinitionError, match="does not declare"):

        class Dangling(Reactor):
            approval = interrupt(after=["missing"])


def test_a_correlation_id_taken_error_names_the_holder() -> None:
    first = Refund.run({"order": "K1"})
    assert isinstance(first, Paused)
    error = CorrelationIdTaken("taken", correlation_id="refund-K1", execution_id=first.execution_id)
    assert error.execution_id == first.execution_id


def test_with_resume_tokens_on_the_paused_outcome_carries_a_token(settings: Any) -> None:
    settings.REACTOR = {"RESUME_TOKENS": True}
    paused = Refund.run({"order": "L2"})
    assert isinstance(paused, Paused)
    assert paused.token is not None
    assert paused.token not in repr(paused)
    outcome = services.resume_interrupt(token=paused.token, payload={"approved": True})
    assert isinstance(outcome, Completed)


def test_a_keyed_resume_repeats_without_effect_and_refuses_another_payload() -> None:
    paused = Refund.run({"order": "M3"})
    handle = Refund.find_by_correlation_id("refund-M3")
    assert handle.id == paused.execution_id
    assert [i.step for i in handle.interrupts] == ["approval"]

    first = handle.resume("approval", {"approved": True}, idempotency_key="delivery-1")
    again = handle.resume("approval", {"approved": True}, idempotency_key="delivery-1")

    assert isinstance(first, Completed)
    assert isinstance(again, Completed)
    assert (first.idempotent_replay, again.idempotent_replay) == (False, True)
    assert ledger.calls == [("run", "request"), ("run", "refund")]
    from django_reactor.exceptions import IdempotencyKeyReused

    with pytest.raises(IdempotencyKeyReused):
        handle.resume("approval", {"approved": False}, idempotency_key="delivery-1")


class ApprovalBesideACheck(Reactor):
    request = step(Tracked)
    approval = interrupt(after="request", payload=Approval, correlation_id=arg.value("beside"))
    check = step(Tracked, wait_for=["request"])


def test_a_run_that_fails_while_an_interrupt_waits_closes_it() -> None:
    FAIL_AT.add("check")
    outcome = ApprovalBesideACheck.run({})
    assert isinstance(outcome, Failed)
    assert Interrupt.objects.get(execution_id=outcome.execution_id).status == "cancelled"
    with pytest.raises(InterruptClosed):
        services.resume_interrupt(outcome.execution_id, payload={"approved": True})
    # The correlation id is free for the next run.
    FAIL_AT.clear()
    assert isinstance(ApprovalBesideACheck.run({}), Paused)


class ExpiringBesideASlowStep(Reactor):
    request = step(Tracked)
    approval = interrupt(after="request", payload=Approval, timeout=60)
    slow = step(Tracked, wait_for=["request"])


def test_an_interrupt_that_expires_while_its_run_moves_is_applied_once_it_pauses() -> None:
    paused = ExpiringBesideASlowStep.run({})
    Execution.objects.filter(pk=paused.execution_id).update(status=ExecutionStatus.RUNNING)
    expire_now(paused.execution_id)
    assert services.sweep().expired == 0  # the run is moving: left for a later sweep
    assert Interrupt.objects.get(execution_id=paused.execution_id).status == "waiting"
    Execution.objects.filter(pk=paused.execution_id).update(status=ExecutionStatus.PAUSED)
    assert services.sweep().expired == 1
    row = Execution.objects.get(pk=paused.execution_id)
    assert (row.status, row.failure["kind"]) == ("failed", "interrupt_timeout")
    assert Interrupt.objects.get(execution_id=row.id).status == "expired"
    kinds = [k for k, _ in trace(row.id)]
    assert kinds[-5:] == ["expire", "rollback", "undo", "undo", "fail"]


def test_undoing_a_paused_run_with_nothing_to_roll_back_cancels_it() -> None:
    class ApprovalFirst(Reactor):
        approval = interrupt(payload=Approval)
        after = step(Tracked, wait_for=["approval"])

    paused = ApprovalFirst.run({})
    assert isinstance(paused, Paused)
    services.undo(paused.execution_id)
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.CANCELLED
    assert Interrupt.objects.get(execution_id=paused.execution_id).status == "cancelled"


def test_a_step_that_is_not_an_interrupt_is_refused_as_not_found() -> None:
    paused = Refund.run({"order": "N4"})
    with pytest.raises(InterruptNotFound, match=r"'refnud' is not an interrupt of .*approval"):
        services.resume_interrupt(paused.execution_id, step="refnud", payload={"approved": True})
    with pytest.raises(InterruptNotFound, match="not an interrupt"):
        services.issue_resume_token(paused.execution_id, "request")


def test_a_paused_outcome_after_a_resume_lists_every_waiting_interrupt_in_full() -> None:
    class Correlated(Reactor):
        request = step(Tracked)
        finance = interrupt(after="request", correlation_id=arg.value("fin-1"), timeout=60)
        legal = interrupt(after="request", correlation_id=arg.value("leg-1"))

    paused = Correlated.run({})
    again = services.resume_interrupt(paused.execution_id, step="legal", payload={})
    assert isinstance(again, Paused)
    (finance,) = again.interrupts
    assert (finance.step, finance.correlation_id) == ("finance", "fin-1")
    assert finance.expires_at is not None


def test_the_execution_row_carries_the_latest_correlation_id() -> None:
    paused = Refund.run({"order": "P5"})
    assert Execution.objects.get(pk=paused.execution_id).correlation_id == "refund-P5"
