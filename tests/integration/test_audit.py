"""The audit trail: every steering action says who (and via which face), when and why, on the
run's trace and in the steering history (``AuditEntry``), written with the change it records;
a refused action records nothing."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from rest_framework import serializers

import django_reactor
from django_reactor import (
    Actor,
    Dispatched,
    Reactor,
    acting_as,
    arg,
    interrupt,
    on_event,
    services,
    sleep,
    step,
    store,
)
from django_reactor.coordination import get_backend
from django_reactor.engine.actors import current_actor
from django_reactor.exceptions import (
    AlreadyResumed,
    AlreadyRetried,
    InvalidPayload,
    InvalidTransition,
    ReactorError,
)
from django_reactor.models import AuditEntry, Execution
from django_reactor.states import ExecutionStatus
from tests.integration.nested_reactors import NestedOrder
from tests.integration.reactors import FAIL_AT, Tracked, Transfer
from tests.schedules.reactors import NightlyReport

pytestmark = pytest.mark.django_db(transaction=True)

INPUTS = {"account": "acc-1", "amount": 25, "pin": "1234"}


class Approval(serializers.Serializer):
    approved = serializers.BooleanField()


class Approve(Reactor):
    request = step(Tracked)
    approval = interrupt(after="request", payload=Approval)
    refund = step(Tracked, wait_for=["approval"])


class Nap(Reactor):
    first = step(Tracked)
    nap = sleep(dt.timedelta(days=1), after=["first"])
    last = step(Tracked, wait_for=["nap"])


class Voidable(Reactor):
    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    request = step(Tracked)
    approval = interrupt(after="request", payload=Approval)

    class Meta:
        cancel_on = [on_event("audit.voided", match=arg.input("order"))]


def history(**filters: Any) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(**filters).order_by("at", "id"))


def trace(execution_id: Any) -> list[Any]:
    return list(services.find(execution_id).trace)


# ---------------------------------------------------------------------------- the actor


def test_nobody_named_is_this_process_via_python() -> None:
    actor = current_actor()
    assert actor.via == "python"
    assert f"pid {__import__('os').getpid()}" in actor.who
    with acting_as("support desk") as chosen:
        assert current_actor() == chosen == Actor("support desk", "python")
        with acting_as(Actor("deploy", "command")):
            assert current_actor().via == "command"
        assert current_actor() == chosen
    assert current_actor().via == "python"


@pytest.mark.parametrize(
    ("who", "via", "problem"),
    [
        ("", "python", "who must be a non-empty string"),
        ("x" * 256, "python", "at most 255 characters"),
        ("nul\x00", "python", "storable text"),
        ("alice", "email", "via must be one of admin, api, command, python, system"),
    ],
)
def test_an_actor_that_cannot_be_recorded_is_refused(who: str, via: str, problem: str) -> None:
    with pytest.raises(ReactorError, match=problem):
        Actor(who, via)


# ---------------------------------------------------------------------------- runs


def test_cancel_records_who_and_why_on_its_trace_entry_and_in_the_history() -> None:
    paused = Approve.run({})
    with acting_as("alice (support)"):
        handle = services.cancel(paused.execution_id, reason="duplicate order")
    assert handle.status == ExecutionStatus.CANCELLED
    entry = trace(paused.execution_id)[-1]
    assert (entry.kind, entry.data) == (
        "cancel",
        {
            "by": "alice (support)",
            "via": "python",
            "reason": "duplicate order",
            "previous_status": "paused",
        },
    )
    [recorded] = history()
    assert (recorded.action, recorded.execution_id, recorded.reactor) == (
        "cancel",
        paused.execution_id,
        Approve.definition.name,
    )
    assert (recorded.who, recorded.via, recorded.reason) == (
        "alice (support)",
        "python",
        "duplicate order",
    )
    assert recorded.detail == {"previous_status": "paused"}
    assert recorded.at >= entry.at


def test_a_refused_action_records_nothing() -> None:
    completed = Transfer.run(INPUTS)
    with pytest.raises(InvalidTransition):
        services.cancel(completed.execution_id)
    with pytest.raises(InvalidTransition):
        services.retry(completed.execution_id)
    with pytest.raises(InvalidTransition, match="waits for no time"):
        services.wake(completed.execution_id)
    with pytest.raises(ReactorError, match="cannot cancel with the reason"):
        services.cancel(completed.execution_id, reason="nul\x00")
    with pytest.raises(ReactorError, match="cannot undo with the reason"):
        services.undo(completed.execution_id, reason=7)  # type: ignore[arg-type]
    assert history() == []


def test_a_cancel_request_to_a_live_run_names_who_asked_on_the_entry_the_run_writes() -> None:
    class AsksToCancel(Tracked):
        def run(self, **arguments: Any) -> Any:
            with acting_as(Actor("bob (user 2)", "admin")):
                services.cancel(self.context.execution_id, reason="stop it")
                # A second request changes nothing and records nothing.
                services.cancel(self.context.execution_id, reason="again")
            return "done"

    class Long(Reactor):
        first = step(AsksToCancel)
        second = step(Tracked, wait_for=["first"])

    outcome = Long.run({})
    assert outcome.status == ExecutionStatus.CANCELLED
    assert trace(outcome.execution_id)[-1].data == {
        "by": "bob (user 2)",
        "via": "admin",
        "reason": "stop it",
    }
    [recorded] = history()
    assert recorded.detail == {"previous_status": "running", "requested": True}
    assert (recorded.who, recorded.via, recorded.reason) == ("bob (user 2)", "admin", "stop it")


def test_undo_names_who_on_its_rollback_entry_and_an_undo_that_changes_nothing_is_not_kept() -> (
    None
):
    outcome = Transfer.run(INPUTS)
    with acting_as("carol"):
        services.undo(outcome.execution_id, reason="customer refunded")
    rollback = next(e for e in trace(outcome.execution_id) if e.kind == "rollback")
    assert rollback.data == {"by": "carol", "via": "python", "reason": "customer refunded"}
    services.undo(outcome.execution_id)  # nothing left to undo
    [recorded] = history()
    assert (recorded.action, recorded.who) == ("undo", "carol")
    assert recorded.reason == "customer refunded"


def test_undoing_a_paused_run_with_nothing_to_roll_back_is_recorded_as_an_undo() -> None:
    class PausesFirst(Reactor):
        approval = interrupt(payload=Approval)

    paused = PausesFirst.run({})
    services.undo(paused.execution_id)
    [recorded] = history()
    assert recorded.action == "undo"
    assert trace(paused.execution_id)[-1].data["reason"] == (
        "undone while paused (nothing to roll back)"
    )


def test_retry_names_who_on_both_runs_and_in_the_history_with_the_new_run() -> None:
    FAIL_AT.add("credit")
    failed = Transfer.run(INPUTS)
    FAIL_AT.clear()
    with acting_as("dave"):
        retried = services.retry(failed.execution_id, reason="bank is back")
    rerun = trace(failed.execution_id)[-1]
    assert (rerun.kind, rerun.data) == (
        "rerun",
        {
            "retried_as": str(retried.execution_id),
            "by": "dave",
            "via": "python",
            "reason": "bank is back",
        },
    )
    start = trace(retried.execution_id)[0]
    assert start.data == {
        "retry_of": str(failed.execution_id),
        "by": "dave",
        "via": "python",
        "reason": "bank is back",
    }
    [recorded] = history()
    assert (recorded.action, recorded.execution_id) == ("retry", failed.execution_id)
    assert recorded.detail == {"new_execution_id": str(retried.execution_id)}
    with pytest.raises(AlreadyRetried):
        services.retry(failed.execution_id)
    assert len(history()) == 1


def test_a_composed_child_stops_with_its_parent_whose_entry_says_who() -> None:
    paused = NestedOrder.run({"order": "a-1"})
    with acting_as("erin"):
        services.cancel(paused.execution_id, reason="fraud")
    child = Execution.objects.get(parent_id=paused.execution_id)
    assert child.status == ExecutionStatus.CANCELLED
    # The child is part of its parent's run (it cannot be steered on its own): one act.
    assert [(e.execution_id, e.who) for e in history()] == [(paused.execution_id, "erin")]
    assert trace(child.pk)[-1].data == {"reason": "its parent run stopped"}


# ---------------------------------------------------------------------------- payloads


def test_a_payload_delivered_to_a_paused_run_is_a_steer_entry_and_in_the_history() -> None:
    paused = Approve.run({})
    with acting_as(Actor("frank (user 9)", "admin")):
        services.resume_interrupt(
            paused.execution_id, step="approval", payload={"approved": True}, reason="checked"
        )
    kinds = [(e.kind, e.step) for e in trace(paused.execution_id)]
    assert kinds[3:6] == [("pause", ""), ("steer", ""), ("payload", "approval")]
    steer = trace(paused.execution_id)[4]
    assert steer.data == {
        "action": "resume",
        "step": "approval",
        "by": "frank (user 9)",
        "via": "admin",
        "reason": "checked",
    }
    [recorded] = history()
    assert (recorded.action, recorded.detail, recorded.via) == (
        "resume",
        {"step": "approval"},
        "admin",
    )
    with pytest.raises(AlreadyResumed):
        services.resume_interrupt(paused.execution_id, step="approval", payload={"approved": 1})
    assert len(history()) == 1


def test_an_invalid_payload_records_nothing() -> None:
    paused = Approve.run({})
    with pytest.raises(InvalidPayload):
        services.resume_interrupt(paused.execution_id, payload={"approved": "maybe?"})
    assert history() == []


def test_a_payload_kept_for_a_run_not_there_yet_is_in_the_history() -> None:
    pending = services.run_in_background(Approve, {})
    assert isinstance(pending, Dispatched)
    with acting_as("grace"):
        services.resume_interrupt(
            pending.execution_id, step="approval", payload={"approved": True}, reason="early"
        )
    [recorded] = history()
    assert (recorded.action, recorded.who, recorded.reason) == ("resume", "grace", "early")
    assert recorded.detail == {"step": "approval", "kept": True}


# ---------------------------------------------------------------------------- wake


def test_wake_is_a_steer_entry_before_the_sleep_ends() -> None:
    asleep = Nap.run({})
    with acting_as("heidi"):
        services.wake(asleep.execution_id, reason="customer waiting")
    entries = trace(asleep.execution_id)
    steer = next(e for e in entries if e.kind == "steer")
    assert steer.data == {
        "action": "wake",
        "by": "heidi",
        "via": "python",
        "reason": "customer waiting",
    }
    # Who woke it, then the sleep's end (written with the wake, in its transaction).
    assert [(e.kind, e.step) for e in entries][-3:] == [
        ("sleep", "nap"),
        ("steer", ""),
        ("run", "nap"),
    ]
    [recorded] = history()
    assert (recorded.action, recorded.execution_id) == ("wake", asleep.execution_id)


# ---------------------------------------------------------------------------- the rest


def test_schedule_pause_resume_and_run_now_are_in_the_history() -> None:
    schedule = services.schedules.create(NightlyReport, every=3600, inputs={"region": "eu"})
    with acting_as("ivan"):
        services.schedules.pause(schedule.id, reason="maintenance")
        services.schedules.pause(schedule.id)  # paused already: nothing changes
        services.schedules.resume(schedule.id)
        services.schedules.resume(schedule.id)  # running already
        fire = services.schedules.run_now(schedule.id, reason="report asked for")
    entries = history()
    assert [(e.action, e.reason) for e in entries] == [
        ("schedule_pause", "maintenance"),
        ("schedule_resume", ""),
        ("schedule_run_now", "report asked for"),
    ]
    assert {e.target for e in entries} == {f"schedule {schedule.name}"}
    assert entries[0].execution_id is None
    assert entries[2].execution_id == fire.execution_id is not None
    assert entries[2].detail == {
        "schedule": schedule.id,
        "fire": fire.id,
        "outcome": fire.outcome,
    }


def test_forgetting_a_subject_is_in_the_history_once() -> None:
    store.subject_keys.live_key("customer-7")
    with acting_as("judy (DPO)"):
        services.forget_subject("customer-7", reason="erasure request 42")
        services.forget_subject("customer-7")  # forgotten already: nothing changes
    [recorded] = history()
    assert (recorded.action, recorded.target, recorded.reason) == (
        "forget_subject",
        "subject customer-7",
        "erasure request 42",
    )
    assert recorded.execution_id is None
    assert recorded.detail == {"keys_erased": 1}


def test_ordered_lock_skips_and_resets_are_in_the_history() -> None:
    reactor = {
        **settings.REACTOR,
        "COORDINATION_BACKEND": "django_reactor.coordination.backends.database.DatabaseBackend",
    }
    with override_settings(REACTOR=reactor):
        backend = get_backend()
        first, second = uuid.uuid4(), uuid.uuid4()
        backend.enqueue_ordered("ordered:acct-1", str(first))
        backend.enqueue_ordered("ordered:acct-1", str(second))
        with acting_as("ken"):
            assert services.skip_ordered_run("acct-1", first, reason="stuck") is True
            assert services.skip_ordered_run("acct-1", uuid.uuid4()) is False  # not queued
            assert services.reset_ordered_lock("acct-1") == 1
    entries = history()
    assert [(e.action, e.execution_id, e.target) for e in entries] == [
        ("lock_skip", first, "ordered lock acct-1"),
        ("lock_reset", None, "ordered lock acct-1"),
    ]
    assert entries[1].detail == {"removed": 1}


def test_an_event_that_cancels_a_run_is_the_system() -> None:
    paused = Voidable.run({"order": "o-5"})
    emitted = django_reactor.emit("audit.voided", {}, key="o-5", event_id="evt-void-5")
    assert emitted.cancelled == (paused.execution_id,)
    [recorded] = history()
    assert (recorded.action, recorded.via) == ("cancel", "system")
    assert recorded.who == "event audit.voided"
    assert recorded.detail == {"event": "audit.voided", "event_id": "evt-void-5", "rollback": True}
    cancel = next(e for e in trace(paused.execution_id) if e.kind == "cancel")
    assert (cancel.data["by"], cancel.data["via"]) == ("event audit.voided", "system")


# ---------------------------------------------------------------------------- one transaction


def test_a_history_that_cannot_be_written_stops_the_action() -> None:
    paused = Approve.run({})
    with (
        mock.patch("django_reactor.store.audit.write", side_effect=RuntimeError("disk full")),
        pytest.raises(RuntimeError, match="disk full"),
    ):
        services.cancel(paused.execution_id)
    assert store.status_of(paused.execution_id) == ExecutionStatus.PAUSED
    assert [e.kind for e in trace(paused.execution_id)][-1] == "pause"


def test_an_action_whose_change_rolls_back_leaves_no_entry() -> None:
    asleep = Nap.run({})
    # The wake's last write (its task's outbox row) fails: the change rolls back, and the
    # entry written before it in the same transaction with it.
    with (
        mock.patch(
            "django_reactor.store.executions.queue_dispatch", side_effect=RuntimeError("no outbox")
        ),
        pytest.raises(RuntimeError, match="no outbox"),
    ):
        services.wake(asleep.execution_id)
    assert history() == []
    assert [e.kind for e in trace(asleep.execution_id)].count("steer") == 0
    assert Execution.objects.get(pk=asleep.execution_id).wake_at > timezone.now()


# ---------------------------------------------------------------------------- pruning


def test_the_history_outlives_pruned_runs_until_its_retention() -> None:
    outcome = Transfer.run(INPUTS)
    services.undo(outcome.execution_id)
    old = Transfer.run(INPUTS)
    services.undo(old.execution_id)
    AuditEntry.objects.filter(execution_id=old.execution_id).update(
        at=timezone.now() - dt.timedelta(days=400)
    )
    Execution.objects.update(finished_at=timezone.now() - dt.timedelta(days=30))
    assert services.prune(older_than_days=7) == 2
    assert not Execution.objects.exists()
    # The runs are gone; the entry within AUDIT_RETENTION (a year by default) stays.
    assert [e.execution_id for e in history()] == [outcome.execution_id]
    with override_settings(REACTOR={**settings.REACTOR, "AUDIT_RETENTION": None}):
        AuditEntry.objects.update(at=timezone.now() - dt.timedelta(days=4000))
        services.prune(older_than_days=7)
    assert len(history()) == 1
