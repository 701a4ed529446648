"""Bulk operations: preview, durable application, at most once per run, stopping."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers

from django_reactor import Reactor, arg, interrupt, services, step, store
from django_reactor.exceptions import ExecutionNotFound, ReactorError
from django_reactor.models import BulkItem, BulkOperation, Execution, Pause
from django_reactor.services import RunFilter
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import FAIL_AT, Tracked, ledger

pytestmark = pytest.mark.django_db


class Order(Reactor):
    reserve = step(Tracked)
    charge = step(Tracked, wait_for=["reserve"])

    class Meta:
        name = "tests.bulk.Order"


class Approval(Reactor):
    ask = step(Tracked)
    approval = interrupt(after=["ask"])
    done = step(Tracked, wait_for=["approval"])

    class Meta:
        name = "tests.bulk.Approval"


def failed_orders(count: int) -> list[Any]:
    FAIL_AT.add("charge")
    ids = [Order.run({}).execution_id for _ in range(count)]
    FAIL_AT.discard("charge")
    ledger.clear()
    return ids


FAILED = RunFilter.parse({"reactor": "tests.bulk.Order", "status": "failed"})


def test_a_preview_counts_samples_and_writes_nothing() -> None:
    failed_orders(3)
    completed = Order.run({}).execution_id
    preview = services.preview_bulk("retry", FAILED)
    assert (preview.count, preview.by_status) == (3, {"failed": 3})
    assert len(preview.sample) == 3
    assert preview.as_dict()["filter"] == {"reactor": "tests.bulk.Order", "status": ["failed"]}
    undo = services.preview_bulk(
        "undo", RunFilter.parse({"reactor": "tests.bulk.Order", "status": "completed"})
    )
    assert [(s.execution_id, s.undo) for s in undo.sample] == [(completed, ("charge", "reserve"))]
    assert not BulkOperation.objects.exists()
    assert Execution.objects.count() == 4


def test_every_matching_run_is_retried_once() -> None:
    failed = failed_orders(5)
    progress = services.start_bulk("retry", FAILED, background=False, reason="gateway fixed")
    assert (progress.total, progress.status) == (5, "pending")
    done = services.run_bulk(progress.id)
    assert done is not None
    assert (done.status, done.done, done.skipped, done.failed) == ("done", 5, 0, 0)
    retries = Execution.objects.filter(retry_of__in=failed)
    assert sorted(retries.values_list("retry_of", flat=True)) == sorted(failed)
    assert all(r.status == ExecutionStatus.COMPLETED for r in retries)
    notes = list(BulkItem.objects.values_list("note", flat=True))
    assert all(note.startswith("retried as ") for note in notes)
    # Once done, it does nothing more.
    assert services.run_bulk(progress.id) is None


def test_a_process_killed_mid_way_leaves_the_rest_to_the_next_and_no_run_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failed = failed_orders(12)
    progress = services.start_bulk("retry", FAILED, background=False)
    recorded = store.bulk.record_item
    calls = {"n": 0}

    def dies_after_the_seventh_action(item: Any, status: str, note: str) -> None:
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt  # killed after the run's retry, before its item says so
        recorded(item, status, note)

    monkeypatch.setattr(store.bulk, "record_item", dies_after_the_seventh_action)
    with pytest.raises(KeyboardInterrupt):
        services.run_bulk(progress.id)
    monkeypatch.setattr(store.bulk, "record_item", recorded)
    # Its lease is still the dead process's: nobody else takes it until it expires.
    assert services.run_bulk(progress.id) is None
    BulkOperation.objects.filter(pk=progress.id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    done = services.run_bulk(progress.id)
    assert done is not None
    # The seventh run was retried before the crash: applied again, it is refused (skipped).
    assert (done.status, done.done, done.skipped, done.failed) == ("done", 11, 1, 0)
    skipped = BulkItem.objects.get(status="skipped")
    assert "re-run already" in skipped.note or "already retried" in skipped.note
    retried = list(Execution.objects.filter(retry_of__in=failed).values_list("retry_of", flat=True))
    assert sorted(retried) == sorted(failed)  # each exactly once


def test_the_sweeper_hands_an_operation_nobody_holds_to_a_worker_again() -> None:
    from django_reactor.testing.results import _TaskQueue

    failed_orders(2)
    progress = services.start_bulk("retry", FAILED, background=False)
    BulkOperation.objects.filter(pk=progress.id).update(
        created_at=timezone.now() - dt.timedelta(hours=1)
    )
    sent: list[Any] = []

    class Capture(_TaskQueue):
        def publish_operation(self, operation_id: Any) -> bool:
            sent.append(operation_id)
            return True

    with Capture().capturing():
        services.sweep()
    assert sent == [progress.id]


def test_a_stopped_operation_leaves_the_rest_alone() -> None:
    failed_orders(3)
    progress = services.start_bulk("cancel", FAILED, background=False)
    stopped = services.stop_bulk(progress.id)
    assert stopped.status == "stopped"
    assert services.run_bulk(progress.id) is None
    assert BulkItem.objects.filter(status="pending").count() == 3


def test_each_action_applies_with_its_parameters() -> None:
    waiting = [Approval.run({}).execution_id for _ in range(2)]
    in_flight = RunFilter.parse({"reactor": "tests.bulk.Approval", "status": "paused"})
    paused = services.start_bulk("pause", in_flight, reason="audit", background=False)
    services.run_bulk(paused.id)
    assert Pause.objects.filter(execution_id__in=waiting, reason="audit").count() == 2
    unpaused = services.start_bulk("unpause", in_flight, background=False)
    services.run_bulk(unpaused.id)
    assert not Pause.objects.exists()
    resumed = services.start_bulk(
        "resume", in_flight, {"step": "approval", "payload": {"ok": True}}, background=False
    )
    progress = services.run_bulk(resumed.id)
    assert progress is not None
    assert progress.done == 2
    assert set(Execution.objects.filter(pk__in=waiting).values_list("status", flat=True)) == {
        ExecutionStatus.COMPLETED
    }

    failed = failed_orders(2)
    forked = services.start_bulk("fork", FAILED, {"from_step": "charge"}, background=False)
    services.run_bulk(forked.id)
    assert ledger.calls == [("run", "reserve"), ("run", "charge")] * 2  # reserve was undone
    assert Execution.objects.filter(retry_of__in=failed, fork_step="charge").count() == 2


def test_bad_requests_are_refused_before_anything_is_written() -> None:
    cases = [
        (lambda: RunFilter.parse({}), "never takes every run"),
        (lambda: RunFilter.parse({"colour": "red"}), "has no key 'colour'"),
        (lambda: RunFilter.parse({"status": "lost"}), "status lost is no status"),
        (lambda: RunFilter.parse({"id": "x"}), "not a run id"),
        (lambda: RunFilter.parse({"created_after": "yesterday"}), "not an ISO 8601"),
        (lambda: services.preview_bulk("explode", FAILED), "no bulk action 'explode'"),
        (lambda: services.start_bulk("fork", FAILED), "fork needs from_step"),
        (lambda: services.start_bulk("retry", FAILED, {"x": 1}), "retry takes nothing"),
        (lambda: services.start_bulk("cancel", FAILED, reason="\x00"), "reason"),
    ]
    for call, message in cases:
        with pytest.raises(ReactorError, match=message):
            call()
    with pytest.raises(ExecutionNotFound):
        services.bulk_progress("not-an-id")
    assert not BulkOperation.objects.exists()


def test_the_operation_and_each_runs_action_are_recorded_as_its_starters() -> None:
    from django_reactor import acting_as
    from django_reactor.models import AuditEntry

    failed = failed_orders(2)
    with acting_as("ops (user 3)", via="admin"):
        progress = services.start_bulk("retry", FAILED, background=False, reason="fixed")
    services.run_bulk(progress.id)  # on a worker: acting as nobody in particular
    started = AuditEntry.objects.get(action="bulk")
    assert (started.who, started.via, started.reason, started.detail["total"]) == (
        "ops (user 3)",
        "admin",
        "fixed",
        2,
    )
    for run in failed:
        (entry,) = services.audit.of_run(run)
        assert (entry.action, entry.who, entry.via, entry.reason) == (
            "retry",
            f"ops (user 3) (bulk operation {str(progress.id)[:8]})",
            "admin",
            "fixed",
        )


class Tenanted(Reactor):
    class Inputs(serializers.Serializer):
        tenant = serializers.CharField()

    one = step(Tracked)

    class Meta:
        name = "tests.bulk.Tenanted"
        attributes = {"tenant": arg.input("tenant")}


def test_a_filter_by_business_attribute_takes_that_tenants_runs_only() -> None:
    acme = [Tenanted.run({"tenant": "acme"}).execution_id for _ in range(2)]
    Tenanted.run({"tenant": "globex"})
    by_tenant = RunFilter.parse({"attr.tenant": "acme", "status": "completed"})
    preview = services.preview_bulk("undo", by_tenant)
    assert preview.count == 2
    assert {s.execution_id for s in preview.sample} == set(acme)
    assert preview.as_dict()["filter"] == {"status": ["completed"], "attr.tenant": "acme"}
