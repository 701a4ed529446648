"""Continue-as-new on the database: a loop of 1,000 generations, each a run with a trace of its
own; the lineage both ways; the successor written with its predecessor's final checkpoint or
not at all; inputs the reactor refuses."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework import serializers

from django_reactor import (
    Completed,
    ContinueAsNew,
    Dispatched,
    Failed,
    Reactor,
    Step,
    arg,
    services,
    step,
    store,
)
from django_reactor.api.serializers import ExecutionDetailSerializer
from django_reactor.engine.outcomes import ErrorKind
from django_reactor.models import Dispatch, Execution, ExecutionEvent, StepRecord
from django_reactor.states import EventKind, ExecutionStatus, StepStatus
from django_reactor.testing.results import _TaskQueue
from tests.helpers import ledger

pytestmark = [pytest.mark.django_db, pytest.mark.postgres, pytest.mark.mariadb]

GENERATIONS = 1_000


class Months(serializers.Serializer[dict[str, Any]]):
    month = serializers.IntegerField(min_value=0)
    last = serializers.IntegerField(min_value=0)


class Charge(Step):
    def run(self, month: int) -> Any:
        return {"charged": month}


class Renew(Step):
    """Continues the subscription as a new run until its last month."""

    def run(self, month: int, last: int) -> Any:
        ledger("run", f"renew-{month}")
        if month >= last:
            return {"ended_at": month}
        return ContinueAsNew({"month": month + 1, "last": last})


class Subscription(Reactor):
    class Inputs(Months):
        pass

    charge = step(Charge, month=arg.input("month"))
    renew = step(Renew, month=arg.input("month"), last=arg.input("last"), wait_for=["charge"])

    class Meta:
        background = "all"


class InlineSubscription(Reactor):
    class Inputs(Months):
        pass

    charge = step(Charge, month=arg.input("month"))
    renew = step(Renew, month=arg.input("month"), last=arg.input("last"), wait_for=["charge"])


@pytest.fixture
def tasks() -> Iterator[_TaskQueue]:
    """The tasks runs would send to workers, kept here (workers are this test)."""
    queue = _TaskQueue()
    with queue.capturing():
        yield queue


def drain(queue: _TaskQueue, limit: int) -> int:
    """Run the captured tasks as a worker would, oldest first; how many ran."""
    ran = 0
    while queue.pending:
        assert ran < limit, f"still {len(queue.pending)} task(s) queued after {limit}"
        _kind, target = queue.pending.pop(0)
        services.resume(target)
        ran += 1
    return ran


def kinds(execution_id: uuid.UUID) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace]


def test_a_thousand_generations_each_complete_with_a_trace_of_the_same_size(
    tasks: _TaskQueue,
) -> None:
    started = time.monotonic()
    first = Subscription.run({"month": 0, "last": GENERATIONS})
    assert isinstance(first, Dispatched)
    drain(tasks, limit=2 * (GENERATIONS + 1))
    elapsed = time.monotonic() - started

    runs = list(
        Execution.objects.filter(reactor=Subscription.definition.name).values(
            "id", "status", "generation", "continued_from_id", "inputs"
        )
    )
    assert len(runs) == GENERATIONS + 1
    assert {r["status"] for r in runs} == {ExecutionStatus.COMPLETED}
    by_generation = {r["generation"]: r for r in runs}
    assert sorted(by_generation) == list(range(GENERATIONS + 1))
    assert all(r["inputs"]["month"] == r["generation"] for r in runs)
    assert by_generation[0]["continued_from_id"] is None
    for generation in range(1, GENERATIONS + 1):
        previous = by_generation[generation - 1]["id"]
        assert by_generation[generation]["continued_from_id"] == previous

    # Every run's trace is the same size: the loop's history does not pile up in one run.
    ids = [r["id"] for r in runs]
    events = Counter(
        ExecutionEvent.objects.filter(execution_id__in=ids).values_list("execution_id", flat=True)
    )
    records = Counter(
        StepRecord.objects.filter(execution_id__in=ids).values_list("execution_id", flat=True)
    )
    continuing = {by_generation[g]["id"] for g in range(GENERATIONS)}
    assert len({events[i] for i in continuing}) == 1
    assert {records[i] for i in ids} == {2}
    last = by_generation[GENERATIONS]["id"]
    assert events[last] == events[by_generation[0]["id"]] - 1  # no ``continue`` entry

    # The lineage, walked forward from the first run and back from the last.
    forward = [by_generation[0]["id"]]
    while (after := services.find(forward[-1]).continued_as) is not None:
        forward.append(after)
    assert forward == [by_generation[g]["id"] for g in range(GENERATIONS + 1)]
    backward = [last]
    while (before := services.find(backward[-1]).continued_from) is not None:
        backward.append(before)
    assert backward == forward[::-1]

    # Entry by entry, a run in the middle of the loop and the last.
    middle = by_generation[500]["id"]
    assert kinds(middle) == [
        (EventKind.START, ""),
        (EventKind.RESUME, ""),
        (EventKind.RUN, "charge"),
        (EventKind.RUN, "renew"),
        (EventKind.CONTINUE, ""),
        (EventKind.COMPLETE, ""),
    ]
    trace = services.find(middle).trace
    assert trace[0].data["continued_from"] == str(by_generation[499]["id"])
    assert trace[0].data["generation"] == 500
    assert trace[4].data == {"continued_as": str(by_generation[501]["id"]), "step": "renew"}
    assert kinds(last)[-2:] == [(EventKind.RUN, "renew"), (EventKind.COMPLETE, "")]
    assert services.find(last).outcome == Completed(
        execution_id=last, value={"charge": {"charged": 1000}, "renew": {"ended_at": 1000}}
    )
    assert len(ledger.calls) == GENERATIONS + 1
    # Timed for the log, not asserted (the machine is shared): about 17 s on PostgreSQL.
    print(f"\n{GENERATIONS} generations of continue-as-new in {elapsed:.1f} s")


def test_the_successor_keeps_the_route_and_the_idempotency_lineage(tasks: _TaskQueue) -> None:
    first = services.run_in_background(
        Subscription, {"month": 0, "last": 2}, idempotency_key="sub-7", queue="renewals", priority=7
    )
    drain(tasks, limit=10)
    rows = sorted(
        Execution.objects.filter(reactor=Subscription.definition.name), key=lambda r: r.generation
    )
    assert [r.idempotency_key for r in rows] == ["sub-7", "sub-7~continued~1", "sub-7~continued~2"]
    assert {(r.queue, r.priority) for r in rows} == {("renewals", 7)}
    # The first run's key replays the first run, which names its successor.
    replay = services.run_in_background(
        Subscription, {"month": 0, "last": 2}, idempotency_key="sub-7"
    )
    assert replay.execution_id == first.execution_id
    assert replay.idempotent_replay
    assert isinstance(replay, Completed)
    assert replay.continued_as == rows[1].id
    handle = services.find(rows[1].id)
    assert (handle.continued_from, handle.continued_as, handle.generation) == (
        rows[0].id,
        rows[2].id,
        1,
    )
    detail = ExecutionDetailSerializer(rows[1]).data
    assert detail["continued_from"] == rows[0].id
    assert detail["continued_as"] == str(rows[2].id)
    assert detail["generation"] == 1


def test_an_inline_runs_successor_is_started_on_a_worker(tasks: _TaskQueue) -> None:
    outcome = InlineSubscription.run({"month": 0, "last": 1})
    assert isinstance(outcome, Completed)
    assert outcome.continued_as is not None
    successor = Execution.objects.get(pk=outcome.continued_as)
    assert (successor.status, successor.generation, successor.lease_owner) == (
        ExecutionStatus.PENDING,
        1,
        None,
    )
    assert Dispatch.objects.get(execution=successor).reason == Dispatch.Reason.START
    assert tasks.pending == [("resume", successor.id)]
    assert ledger.calls == [("run", "renew-0")]
    drain(tasks, limit=5)
    assert services.find(successor.id).status == ExecutionStatus.COMPLETED
    assert ledger.calls == [("run", "renew-0"), ("run", "renew-1")]


def test_the_successor_commits_with_the_final_checkpoint_or_not_at_all(
    tasks: _TaskQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = Subscription.run({"month": 0, "last": 1})
    tasks.pending.clear()
    real = store.continuation.create_successor
    written: list[uuid.UUID] = []

    def insert_then_die(predecessor_id: uuid.UUID, successor: Any) -> None:
        real(predecessor_id, successor)
        written.append(successor.execution_id)
        raise SystemExit("the worker process stopped between the insert and the commit")

    monkeypatch.setattr("django_reactor.store.checkpoint.create_successor", insert_then_die)
    with pytest.raises(SystemExit):
        services.resume(first.execution_id)
    monkeypatch.undo()

    # The successor was inserted, then rolled back with the checkpoint that would complete the
    # predecessor: neither persists, and the predecessor is not completed.
    assert len(written) == 1
    assert not Execution.objects.filter(pk=written[0]).exists()
    assert Execution.objects.filter(continued_from_id=first.execution_id).count() == 0
    row = Execution.objects.get(pk=first.execution_id)
    assert not row.events.filter(kind=EventKind.CONTINUE).exists()
    assert not StepRecord.objects.filter(execution_id=row.id, step="renew").exists()

    assert row.status == ExecutionStatus.RUNNING  # its worker's lease still holds it

    # Once the dead worker's lease has run out, another worker takes the run over: it runs
    # the last step again and writes exactly one successor.
    Execution.objects.filter(pk=row.id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    tasks.pending.clear()
    recovered = services.resume(first.execution_id)
    assert isinstance(recovered, Completed)
    assert recovered.continued_as is not None
    assert recovered.continued_as != written[0]
    assert Execution.objects.filter(continued_from_id=first.execution_id).count() == 1
    assert services.resume(first.execution_id) is None  # completed: not taken again
    drain(tasks, limit=5)
    assert Execution.objects.filter(reactor=Subscription.definition.name).count() == 2
    assert ledger.calls == [("run", "renew-0"), ("run", "renew-0"), ("run", "renew-1")]

    # The database refuses a second successor of the same run, whatever asks for it (this
    # run has no idempotency key: the one-to-one ``continued_from`` refuses it).
    definition = Subscription.definition
    second = store.continuation.SuccessorWrite(
        execution_id=uuid.uuid4(),
        inputs={"month": 1, "last": 1},
        secret_paths=(),
        subject="",
        has_secrets=False,
        attributes={},
        cancel_keys=(),
        first_step="charge",
        definition_hash=definition.definition_hash,
        definition_shape=definition.shape,
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        store.continuation.create_successor(first.execution_id, second)
    assert Execution.objects.filter(continued_from_id=first.execution_id).count() == 1


def test_inputs_the_reactor_refuses_fail_the_run_and_start_nothing(tasks: _TaskQueue) -> None:
    class Refused(Step):
        def run(self, month: int) -> Any:
            return ContinueAsNew({"month": -1})

    class BadSubscription(Reactor):
        class Inputs(Months):
            pass

        charge = step(Charge, month=arg.input("month"))
        renew = step(Refused, month=arg.input("month"), wait_for=["charge"])

    outcome = BadSubscription.run({"month": 0, "last": 1})
    assert isinstance(outcome, Failed)
    assert outcome.error.kind == ErrorKind.CONTINUATION
    assert "BadSubscription.Inputs refuses" in outcome.error.message
    assert set(outcome.error.field_errors) == {"month", "last"}
    assert Execution.objects.filter(reactor=BadSubscription.definition.name).count() == 1
    handle = services.find(outcome.execution_id)
    assert [s.status for s in handle.steps if s.name == "renew"] == [StepStatus.FAILED]
    # A failed step like any other: compensated, what completed undone; no ``continue``.
    assert kinds(outcome.execution_id) == [
        (EventKind.START, ""),
        (EventKind.RUN, "charge"),
        (EventKind.FAIL, "renew"),
        (EventKind.COMPENSATE_SKIPPED, "renew"),
        (EventKind.UNDO_SKIPPED, "charge"),
        (EventKind.FAIL, ""),
    ]
    assert tasks.pending == []


def test_pruning_a_run_leaves_its_successor_without_a_predecessor(tasks: _TaskQueue) -> None:
    first = InlineSubscription.run({"month": 0, "last": 1})
    assert isinstance(first, Completed)
    pruned = list(
        store.prune_finished(
            timezone.now() + dt.timedelta(seconds=1), [ExecutionStatus.COMPLETED], 10
        )
    )
    assert sum(pruned) == 1
    successor = Execution.objects.get(pk=first.continued_as)
    assert (successor.continued_from_id, successor.generation) == (None, 1)
    assert not Execution.objects.filter(pk=first.execution_id).exists()
