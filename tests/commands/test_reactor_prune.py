"""reactor_prune: deleting old finished runs in batches."""

from __future__ import annotations

import datetime as dt
import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_reactor import Reactor, compose, services, step
from django_reactor.exceptions import ReactorError
from django_reactor.models import Execution, ExecutionEvent, StepRecord
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import FAIL_AT, Tracked, Transfer

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
