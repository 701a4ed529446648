"""reactor_prune: deleting old finished runs in batches."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
from collections.abc import Iterator
from io import StringIO
from typing import Any
from unittest import mock

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.models import signals
from django.utils import timezone

from django_reactor import Reactor, compose, services, step, store
from django_reactor.exceptions import ReactorError
from django_reactor.models import (
    BatchItem,
    Dispatch,
    Execution,
    ExecutionAttribute,
    ExecutionEvent,
    Interrupt,
    MapChunk,
    MapResult,
    MapRun,
    Message,
    Schedule,
    ScheduleFire,
    StepRecord,
)
from django_reactor.states import ExecutionStatus
from django_reactor.store.dialects import generic
from django_reactor.store.prune import one_statement_covers
from tests.integration.reactors import FAIL_AT, Tracked, Transfer
from tests.schedules.reactors import NightlyReport

pytestmark = pytest.mark.django_db(transaction=True)


class PruneChild(Reactor):
    inner = step(Tracked)


class PruneParent(Reactor):
    nested = compose(PruneChild)


def prune(*args: Any, **options: Any) -> str:
    out = StringIO()
    call_command("reactor_prune", *args, stdout=out, no_color=True, **options)
    return out.getvalue()


def rows(count: int, *, days_ago: float | None = 40, status: str = "completed") -> list[Any]:
    finished = timezone.now() - dt.timedelta(days=days_ago) if days_ago is not None else None
    made = Execution.objects.bulk_create(
        Execution(reactor="x.Old", definition_hash="x", status=status, finished_at=finished)
        for _ in range(count)
    )
    return [r.pk for r in made]


def age(execution_id: Any, days: float) -> None:
    """Test setup: move a run's finish time into the past."""
    Execution.objects.filter(pk=execution_id).update(
        finished_at=timezone.now() - dt.timedelta(days=days)
    )


def test_batches_print_progress_and_spare_recent_and_unfinished_runs() -> None:
    old = rows(25)
    recent = rows(3, days_ago=5)
    unfinished = rows(2, days_ago=None, status=ExecutionStatus.RUNNING)
    paused = rows(2, days_ago=None, status=ExecutionStatus.PAUSED)
    needs = rows(1, days_ago=40, status=ExecutionStatus.NEEDS_ATTENTION)
    aborted = rows(1, days_ago=40, status=ExecutionStatus.ABORTED)
    text = prune(older_than=30, batch_size=10)
    assert text.splitlines() == [
        "pruned 10 (total 10)",
        "pruned 10 (total 20)",
        "pruned 5 (total 25)",
        "pruned 25 run(s) in cancelled, completed, failed, halted that finished more than "
        "30 day(s) ago",
    ]
    assert not Execution.objects.filter(pk__in=old).exists()
    kept = recent + unfinished + paused + needs + aborted
    assert Execution.objects.filter(pk__in=kept).count() == len(kept)


def test_default_batch_size_of_1000() -> None:
    rows(1001, status=ExecutionStatus.FAILED)
    data = json.loads(prune(older_than=30, json=True))
    assert data["pruned"] == 1001
    assert data["batches"] == [1000, 1]
    assert Execution.objects.count() == 0


def test_dry_run_deletes_nothing() -> None:
    rows(7)
    rows(2, days_ago=1)
    text = prune(older_than=30, dry_run=True)
    assert "would prune 7 run(s)" in text
    assert "nothing deleted" in text
    data = json.loads(prune(older_than=30, dry_run=True, json=True))
    assert data["would_prune"] == 7
    assert data["dry_run"] is True
    assert Execution.objects.count() == 9
    assert services.prune(30, dry_run=True) == 7


def test_status_filter_only_prunes_the_statuses_given() -> None:
    done = rows(3, status=ExecutionStatus.COMPLETED)
    failed = rows(2, status=ExecutionStatus.FAILED)
    data = json.loads(prune(older_than=30, status="failed", json=True))
    assert data["pruned"] == 2
    assert data["statuses"] == ["failed"]
    assert Execution.objects.filter(pk__in=done).count() == 3
    assert not Execution.objects.filter(pk__in=failed).exists()


def test_real_runs_go_with_their_steps_and_trace() -> None:
    outcome = Transfer.run({"account": "a", "amount": 1, "pin": "1"})
    age(outcome.execution_id, 60)
    assert StepRecord.objects.filter(execution_id=outcome.execution_id).exists()
    assert prune(older_than=30).startswith("pruned 1 (total 1)")
    assert not StepRecord.objects.filter(execution_id=outcome.execution_id).exists()
    assert not ExecutionEvent.objects.filter(execution_id=outcome.execution_id).exists()


def test_children_go_with_their_root_and_an_unfinished_child_keeps_it() -> None:
    outcome = PruneParent.run({})
    child = Execution.objects.get(parent_id=outcome.execution_id)
    age(outcome.execution_id, 60)
    age(child.id, 60)
    # A child whose parent is not pruned is never pruned on its own.
    Execution.objects.filter(pk=outcome.execution_id).update(status=ExecutionStatus.RUNNING)
    assert json.loads(prune(older_than=30, json=True))["pruned"] == 0
    assert Execution.objects.filter(pk=child.id).exists()
    # A finished root with an unfinished descendant is kept.
    Execution.objects.filter(pk=outcome.execution_id).update(status=ExecutionStatus.COMPLETED)
    Execution.objects.filter(pk=child.id).update(status=ExecutionStatus.RUNNING)
    assert json.loads(prune(older_than=30, json=True))["pruned"] == 0
    # Once the whole tree has finished, the root goes and its child with it.
    Execution.objects.filter(pk=child.id).update(status=ExecutionStatus.COMPLETED)
    assert json.loads(prune(older_than=30, json=True))["pruned"] == 1
    assert not Execution.objects.filter(pk__in=[outcome.execution_id, child.id]).exists()


def test_a_retried_run_can_be_pruned_without_its_retry() -> None:
    FAIL_AT.add("credit")
    first = Transfer.run({"account": "a", "amount": 1, "pin": "1"})
    FAIL_AT.clear()
    second = services.retry(first.execution_id)
    age(first.execution_id, 60)
    assert json.loads(prune(older_than=30, json=True))["pruned"] == 1
    assert Execution.objects.get(pk=second.execution_id).retry_of_id is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"older_than": 30, "status": "running"}, "prune deletes only finished runs"),
        ({"older_than": 30, "status": "completed,paused"}, "--status paused"),
        ({"older_than": 30, "status": "aborted"}, "may still move"),
        ({"older_than": 30, "status": "finished"}, "'finished' is not a status"),
    ],
)
def test_option_errors(options: dict[str, Any], message: str) -> None:
    rows(2)
    with pytest.raises(CommandError, match=message):
        prune(**options)
    assert Execution.objects.count() == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--older-than"),
        (["--older-than", "-1"], "0 or more"),
        (["--older-than", "ten"], "not a whole number"),
        (["--older-than", "3", "--batch-size", "0"], "1 or more"),
    ],
)
def test_argument_errors(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        prune(*args)


def test_service_refuses_bad_arguments() -> None:
    with pytest.raises(ReactorError, match="0 or more"):
        services.prune(-1)
    with pytest.raises(ReactorError, match="only finished runs"):
        services.prune(1, statuses=["paused"])
    with pytest.raises(ReactorError, match="batch_size"):
        services.prune(1, batch_size=0)
    for pause in (-1, float("nan"), float("inf"), True):
        with pytest.raises(ReactorError, match="pause"):
            services.prune(1, pause=pause)


def test_pause_waits_between_batches_outside_any_transaction() -> None:
    rows(5)
    waits: list[tuple[float, bool]] = []

    def sleep(seconds: float) -> None:
        waits.append((seconds, connection.in_atomic_block))

    with mock.patch("django_reactor.services.maintenance.time.sleep", sleep):
        data = json.loads(prune(older_than=30, batch_size=2, pause=0.25, json=True))
    assert data["batches"] == [2, 2, 1]
    assert waits == [(0.25, False)] * 3
    with pytest.raises(CommandError, match="pause must be"):
        prune(older_than=30, pause=-1)


# ---------------------------------------------------------------------------- the batches


@pytest.fixture(params=["statement", "collector"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each batch as one statement (PostgreSQL's dialect) or through Django's collector."""
    if request.param == "statement":
        if connection.vendor != "postgresql":
            pytest.skip("the one-statement batch is PostgreSQL's")
        # It covers every table of the package (a model it missed sends batches to the
        # collector, silently).
        assert one_statement_covers()
    with (
        contextlib.nullcontext()
        if request.param == "statement"
        else store.dialects.forced(generic())
    ):
        yield request.param


def everything_of(root: Any, *, days_ago: float = 40) -> dict[str, Any]:
    """Test setup: an old finished run with a child, step records, trace, an interrupt, a map
    (chunk, elements, its dispatch) and a dispatch; another run retrying it, a schedule whose
    last run and a fire that point at it."""
    finished = timezone.now() - dt.timedelta(days=days_ago)
    child = Execution.objects.create(
        reactor="x.Child",
        definition_hash="x",
        status="completed",
        finished_at=finished,
        parent_id=root,
        root_id=root,
        parent_step="nested",
    )
    for run in (root, child.pk):
        StepRecord.objects.create(execution_id=run, step="s", seq=1, status="completed")
        ExecutionEvent.objects.create(execution_id=run, seq=1, kind="run", step="s", at=finished)
        ExecutionAttribute.objects.create(
            execution_id=run, key="customer_id", value="42", run_created_at=finished
        )
    Interrupt.objects.create(execution_id=root, reactor="x.Old", step="approval", status="resumed")
    Message.objects.create(execution_id=root, topic="payment", payload={"amount": 1})
    BatchItem.objects.create(
        reactor="x.Old", idempotency_key="event:line:1", inputs_digest="d", execution_id=root
    )
    mapped = MapRun.objects.create(execution_id=child.pk, step="m", batch_size=1, chunk_size=1)
    MapChunk.objects.create(map_run=mapped, first=0, size=1, items=[1])
    MapResult.objects.create(map_run=mapped, index=0, status="succeeded", item=1, value=1)
    Dispatch.objects.create(execution_id=child.pk, map_run=mapped, reason="map")
    Dispatch.objects.create(execution_id=root, reason="start", sent_at=finished)
    retry = Execution.objects.create(
        reactor="x.Old", definition_hash="x", status="completed", retry_of_id=root
    )
    schedule = services.schedules.create(NightlyReport, every="1h", inputs={"region": "eu"})
    Schedule.objects.filter(pk=schedule.id).update(last_execution_id=root)
    fire = ScheduleFire.objects.create(
        schedule_id=schedule.id, fire_at=finished, outcome="started", execution_id=root
    )
    return {"child": child.pk, "map": mapped.pk, "retry": retry.pk, "schedule": schedule.id,
            "fire": fire.pk}  # fmt: skip


def test_a_batch_deletes_the_whole_tree_and_unhooks_what_points_at_it(path: str) -> None:
    old = rows(2)
    kept = rows(1, days_ago=5)
    made = everything_of(old[0])
    StepRecord.objects.create(execution_id=kept[0], step="s", seq=1, status="completed")
    assert json.loads(prune(older_than=30, json=True))["batches"] == [2]
    tree = [*old, made["child"]]
    assert not Execution.objects.filter(pk__in=tree).exists()
    for model in (
        StepRecord,
        ExecutionEvent,
        ExecutionAttribute,
        Interrupt,
        Message,
        BatchItem,
        Dispatch,
        MapRun,
    ):
        assert not model.objects.filter(execution_id__in=tree).exists(), model
    for model in (MapChunk, MapResult):
        assert not model.objects.filter(map_run_id=made["map"]).exists(), model
    assert Execution.objects.get(pk=made["retry"]).retry_of_id is None
    assert Schedule.objects.get(pk=made["schedule"]).last_execution_id is None
    assert ScheduleFire.objects.get(pk=made["fire"]).execution_id is None
    # What was not pruned is all there.
    assert set(Execution.objects.values_list("pk", flat=True)) == {kept[0], made["retry"]}
    assert StepRecord.objects.filter(execution_id=kept[0]).count() == 1


def test_batches_go_oldest_first_and_pass_over_a_run_another_process_holds(path: str) -> None:
    runs = rows(5)
    for days, run in enumerate(runs):
        age(run, 100 - days)  # runs[0] is the oldest
    held, taken, release = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Execution.objects.select_for_update().get(pk=runs[1])
                taken.set()
                release.wait(10)
        finally:
            connection.close()
            held.set()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(10)
        order: list[set[Any]] = []
        left = set(runs)

        def batch(count: int) -> None:
            now = set(Execution.objects.filter(pk__in=runs).values_list("pk", flat=True))
            order.append(left - now)
            left.intersection_update(now)

        assert services.prune(30, batch_size=2, on_batch=batch) == 4
    finally:
        release.set()
        holder.join(10)
    assert held.is_set()
    # Oldest first, and the held run (the second oldest) is left, not waited for.
    assert order == [{runs[0], runs[2]}, {runs[3], runs[4]}]
    assert list(Execution.objects.values_list("pk", flat=True)) == [runs[1]]
    assert services.prune(30) == 1


def test_a_listener_to_deletions_gets_every_deleted_row() -> None:
    old = rows(3)
    made = everything_of(old[0])
    deleted: list[tuple[str, Any]] = []

    def listener(sender: Any, instance: Any, **kwargs: Any) -> None:
        deleted.append((sender.__name__, instance.pk))

    signals.post_delete.connect(listener, sender=Execution)
    try:
        assert services.prune(30) == 3
    finally:
        signals.post_delete.disconnect(listener, sender=Execution)
    assert sorted(deleted) == sorted(("Execution", pk) for pk in [*old, made["child"]])
