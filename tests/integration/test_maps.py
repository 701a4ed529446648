"""map_over(): elements inline, their slots, failure policies, collect and rollback order."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import (
    Completed,
    Failed,
    Halt,
    Halted,
    Reactor,
    Step,
    arg,
    map_over,
    services,
    step,
)
from django_reactor.exceptions import DefinitionError
from django_reactor.models import MapResult, MapRun
from django_reactor.runtime.maps import MapResults
from django_reactor.states import ElementStatus, ExecutionStatus
from tests.integration.reactors import FAIL_AT, ledger

pytestmark = pytest.mark.django_db


class Charge(Step):
    """An element step that records what it does and fails for items in FAIL_AT."""

    def run(self, item: int, order_id: int) -> Any:
        ledger("run", f"charge-{item}")
        if f"item-{item}" in FAIL_AT:
            raise RuntimeError(f"card declined for {item}")
        if f"halt-{item}" in FAIL_AT:
            return Halt(f"item {item} needs review")
        return {"item": item, "charged": item * 10}

    def undo(self, result: Any, item: int, order_id: int) -> None:
        ledger("undo", f"charge-{item}")
        if f"undo-{item}" in FAIL_AT:
            raise RuntimeError(f"refund failed for {item}")


class Line(Reactor):
    class Inputs(serializers.Serializer):
        item = serializers.IntegerField(min_value=0)
        order_id = serializers.IntegerField()

    charge = step(Charge)

    class Meta:
        returns = "charge"


class Basket(Reactor):
    class Inputs(serializers.Serializer):
        order_id = serializers.IntegerField()
        items = serializers.ListField(child=serializers.IntegerField())

    @step(order_id=arg.input("order_id"))
    def reserve(order_id: int) -> Any:
        ledger("run", "reserve")
        return {"order": order_id}

    @reserve.undo
    def release(result: Any, order_id: int) -> None:
        ledger("undo", "reserve")

    lines = map_over(
        arg.input("items"),
        Line,
        item=arg.element(),
        order_id=arg.input("order_id"),
        wait_for=["reserve"],
        batch_size=4,
    )

    @step(lines=arg.result("lines"))
    def total(lines: Any) -> Any:
        ledger("run", "total")
        if "total" in FAIL_AT:
            raise RuntimeError("ledger closed")
        return sum(line["charged"] for line in lines)

    class Meta:
        returns = "total"


def test_every_element_runs_and_the_next_step_reads_the_lazy_results() -> None:
    outcome = Basket.run({"order_id": 1, "items": [1, 2, 3, 4, 5, 6, 7]})
    assert isinstance(outcome, Completed), outcome
    assert outcome.value == 280
    assert ledger.calls == [
        ("run", "reserve"),
        *[("run", f"charge-{i}") for i in range(1, 8)],
        ("run", "total"),
    ]
    run = MapRun.objects.get(execution_id=outcome.execution_id)
    assert (run.size, run.settled, run.succeeded, run.failed) == (7, 7, 7, 0)
    assert list(MapResult.objects.filter(map_run=run).values_list("index", "status")) == [
        (i, ElementStatus.SUCCEEDED) for i in range(7)
    ]
    results = services.find(outcome.execution_id).step_result("lines")
    assert isinstance(results, MapResults)
    assert [r["item"] for r in results] == [1, 2, 3, 4, 5, 6, 7]


def test_an_atomic_map_stops_at_the_first_failure_and_undoes_highest_index_first() -> None:
    FAIL_AT.add("item-4")
    outcome = Basket.run({"order_id": 1, "items": [1, 2, 3, 4, 5, 6]})
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.step == "lines"
    assert "map element 3 (of 6) failed" in outcome.error.message
    assert "card declined for 4" in outcome.error.message
    assert ledger.calls == [
        ("run", "reserve"),
        ("run", "charge-1"),
        ("run", "charge-2"),
        ("run", "charge-3"),
        ("run", "charge-4"),
        ("undo", "charge-3"),
        ("undo", "charge-2"),
        ("undo", "charge-1"),
        ("undo", "reserve"),
    ]
    statuses = dict(
        MapResult.objects.filter(map_run__execution_id=outcome.execution_id).values_list(
            "index", "status"
        )
    )
    assert statuses == {
        0: ElementStatus.UNDONE,
        1: ElementStatus.UNDONE,
        2: ElementStatus.UNDONE,
        3: ElementStatus.FAILED,
        4: ElementStatus.NOT_STARTED,
        5: ElementStatus.NOT_STARTED,
    }


def test_a_later_failure_undoes_every_element_once() -> None:
    FAIL_AT.add("total")
    outcome = Basket.run({"order_id": 1, "items": [1, 2, 3]})
    assert isinstance(outcome, Failed)
    undos = [entry for entry in ledger.calls if entry[0] == "undo"]
    assert undos == [
        ("undo", "charge-3"),
        ("undo", "charge-2"),
        ("undo", "charge-1"),
        ("undo", "reserve"),
    ]
    events = [(e.kind, e.step) for e in services.find(outcome.execution_id).trace if e.step]
    assert ("undo", "lines") in events


def test_an_element_whose_undo_fails_is_reported_with_its_index() -> None:
    FAIL_AT.update({"total", "undo-2"})
    outcome = Basket.run({"order_id": 1, "items": [1, 2, 3]})
    assert isinstance(outcome, Failed)
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    (failure,) = outcome.error.rollback_failures
    assert failure.index == 1
    assert failure.step == "lines[1].charge"
    assert "refund failed for 2" in failure.message
    # The others were still undone.
    assert ("undo", "charge-1") in ledger.calls
    assert ("undo", "reserve") in ledger.calls


def test_an_invalid_element_fails_with_field_errors() -> None:
    outcome = Basket.run({"order_id": 1, "items": [1, -5, 3]})
    assert isinstance(outcome, Failed)
    assert outcome.error.field_errors == {
        "item": ["Ensure this value is greater than or equal to 0."]
    }
    assert ("undo", "charge-1") in ledger.calls


def test_a_halted_element_halts_the_run_without_rollback() -> None:
    FAIL_AT.add("halt-2")
    outcome = Basket.run({"order_id": 1, "items": [1, 2, 3]})
    assert isinstance(outcome, Halted), outcome
    assert "map element 1 halted: item 2 needs review" in outcome.reason
    assert not [e for e in ledger.calls if e[0] == "undo"]


def test_an_empty_source_gives_empty_results() -> None:
    outcome = Basket.run({"order_id": 1, "items": []})
    assert isinstance(outcome, Completed)
    assert outcome.value == 0


class Tolerant(Reactor):
    class Inputs(serializers.Serializer):
        items = serializers.ListField(child=serializers.IntegerField())

    lines = map_over(
        arg.input("items"),
        Charge,
        item=arg.element(),
        order_id=arg.value(9),
        atomic=False,
        max_failures=2,
        collect=lambda results: {
            "ok": [r["item"] for r in results],
            "failed": [f.index for f in results.failures()],
        },
    )

    class Meta:
        returns = "lines"


def test_a_tolerant_map_completes_with_every_outcome() -> None:
    FAIL_AT.update({"item-2", "item-4"})
    outcome = Tolerant.run({"items": [1, 2, 3, 4, 5]})
    assert isinstance(outcome, Completed), outcome
    assert outcome.value == {"ok": [1, 3, 5], "failed": [1, 3]}


def test_a_tolerant_map_past_its_threshold_fails_and_undoes_the_rest() -> None:
    FAIL_AT.update({"item-1", "item-2", "item-4"})
    outcome = Tolerant.run({"items": [1, 2, 3, 4, 5]})
    assert isinstance(outcome, Failed), outcome
    assert "3 of 5 map elements failed, more than max_failures=2" in outcome.error.message
    assert ("undo", "charge-3") in ledger.calls
    assert ("undo", "charge-5") not in ledger.calls  # never started


def test_collect_raising_fails_the_map_and_undoes_every_element() -> None:
    class Collecting(Reactor):
        class Inputs(serializers.Serializer):
            items = serializers.ListField(child=serializers.IntegerField())

        lines = map_over(
            arg.input("items"),
            Charge,
            item=arg.element(),
            order_id=arg.value(1),
            collect=lambda results: 1 / 0,
        )

    outcome = Collecting.run({"items": [1, 2]})
    assert isinstance(outcome, Failed)
    assert "collect" in outcome.error.message
    assert "ZeroDivisionError" in outcome.error.message
    assert [e for e in ledger.calls if e[0] == "undo"] == [
        ("undo", "charge-2"),
        ("undo", "charge-1"),
    ]


def test_a_source_that_is_not_iterable_fails_the_map_step() -> None:
    class Broken(Reactor):
        @step()
        def first() -> Any:
            ledger("run", "first")
            return 5

        @first.undo
        def unfirst(result: Any) -> None:
            ledger("undo", "first")

        lines = map_over(arg.result("first"), Charge, item=arg.element(), order_id=arg.value(1))

    outcome = Broken.run({})
    assert isinstance(outcome, Failed)
    assert outcome.error.step == "lines"
    assert "not iterable" in outcome.error.message
    assert ledger.calls == [("run", "first"), ("undo", "first")]


def test_a_source_callable_that_raises_fails_the_map_step() -> None:
    def explode(order_id: int) -> list[int]:
        raise LookupError("no such order")

    class Exploding(Reactor):
        lines = map_over(explode, Charge, item=arg.element(), order_id=arg.value(1))

    outcome = Exploding.run({})
    assert isinstance(outcome, Failed)
    assert "LookupError: no such order" in outcome.error.message


def test_map_over_refuses_bad_declarations() -> None:
    with pytest.raises(DefinitionError, match=r"passes no arg\.element"):
        map_over(arg.input("items"), Charge, order_id=arg.value(1))
    with pytest.raises(DefinitionError, match="needs atomic=False"):
        map_over(arg.input("items"), Charge, item=arg.element(), max_failures=1)
    with pytest.raises(DefinitionError, match="batch_size must be a positive integer"):
        map_over(arg.input("items"), Charge, item=arg.element(), batch_size=0)


# ---------------------------------------------------------------------------- fan-out


class FannedBasket(Basket):
    lines = map_over(
        arg.input("items"),
        Line,
        item=arg.element(),
        order_id=arg.input("order_id"),
        wait_for=["reserve"],
        fan_out=True,
        batch_size=4,
        chunk_size=2,
    )

    class Meta:
        returns = "total"


def test_a_fanned_out_map_parks_the_run_and_its_last_element_wakes_it() -> None:
    from django_reactor.testing import run_reactor

    result = run_reactor(
        FannedBasket, {"order_id": 1, "items": list(range(1, 11))}, background="none"
    )
    assert result.status == ExecutionStatus.PENDING
    kinds = [kind for kind, _ in result._queue.pending]
    assert kinds == ["map", "map"]  # batch_size / chunk_size element tasks in flight
    result.drain()
    assert result.status == ExecutionStatus.COMPLETED, result._describe()
    assert result.outcome.value == sum(i * 10 for i in range(1, 11))
    run = MapRun.objects.get(execution_id=result.execution_id)
    assert (run.settled, run.succeeded, run.collected) == (10, 10, True)
    # The run was woken once, by the settle that completed the map.
    resumes = [e for e in services.find(result.execution_id).trace if e.kind == "resume"]
    assert len(resumes) == 1


def test_duplicate_element_tasks_never_duplicate_slots_or_wake_the_run_twice() -> None:
    from django_reactor.runtime import maps
    from django_reactor.testing import run_reactor

    result = run_reactor(FannedBasket, {"order_id": 1, "items": [1, 2, 3, 4, 5]}, background="none")
    map_id = MapRun.objects.get(execution_id=result.execution_id).pk
    queue = result._queue
    with queue.capturing():
        maps.work(map_id, forward=True)
        maps.work(map_id, forward=True)  # delivered again: nothing left to claim
    wakes = [kind for kind, target in queue.pending if kind == "resume"]
    assert wakes == ["resume"]
    result.drain()
    assert result.status == ExecutionStatus.COMPLETED
    assert MapResult.objects.filter(map_run_id=map_id).count() == 5
    assert [c for c in ledger.calls if c[1].startswith("charge")] == [
        ("run", f"charge-{i}") for i in range(1, 6)
    ]


def test_a_settle_whose_connection_broke_is_stored_once_and_the_rest_handed_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import OperationalError

    from django_reactor import store
    from django_reactor.runtime import maps
    from django_reactor.testing import run_reactor

    result = run_reactor(FannedBasket, {"order_id": 1, "items": [1, 2, 3, 4, 5]}, background="none")
    map_id = MapRun.objects.get(execution_id=result.execution_id).pk
    real_settle = store.maps.settle
    broken: list[int] = []

    def settle_then_lose_the_reply(*args: Any, **kwargs: Any) -> Any:
        settled = real_settle(*args, **kwargs)  # committed...
        if not broken:
            broken.append(1)
            raise OperationalError("server closed the connection unexpectedly")  # ...unseen
        return settled

    monkeypatch.setattr(store.maps, "settle", settle_then_lose_the_reply)
    queue = result._queue
    with queue.capturing():
        maps.work(map_id, forward=True)
    monkeypatch.undo()
    assert broken == [1]
    assert [kind for kind, _ in queue.pending].count("map") >= 1  # a fresh task goes on
    result.drain()
    assert result.status == ExecutionStatus.COMPLETED, result._describe()
    run = MapRun.objects.get(pk=map_id)
    assert (run.settled, run.succeeded) == (5, 5)
    assert sorted(c for c in ledger.calls if c[1].startswith("charge")) == sorted(
        ("run", f"charge-{i}") for i in range(1, 6)
    )


def test_a_settle_that_died_before_its_fan_in_is_fanned_in_by_the_next_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The settle's statement commits on its own; the fan-in follows in a transaction of its
    own. A process that dies in between leaves every element settled and the run asleep: the
    next element task (the sweeper sends one for a map that stopped moving) finds nothing to
    claim, fans the map in and wakes the run, once."""
    from django_reactor import store
    from django_reactor.runtime import maps
    from django_reactor.testing import run_reactor

    result = run_reactor(FannedBasket, {"order_id": 1, "items": [1, 2, 3, 4, 5]}, background="none")
    map_id = MapRun.objects.get(execution_id=result.execution_id).pk

    def die(map_id: Any) -> None:
        raise SystemExit("the worker process stopped here")

    monkeypatch.setattr(store.maps, "finish_if_settled", die)
    queue = result._queue
    with queue.capturing(), pytest.raises(SystemExit):
        maps.work(map_id, forward=True)
    run = MapRun.objects.get(pk=map_id)
    assert (run.size, run.collected, run.status) == (5, False, "running")
    # Every element is settled (in the task's tally, not folded into the map's row yet).
    assert store.maps.summary(map_id)["pending"] == 0
    assert "resume" not in [kind for kind, _ in queue.pending]

    monkeypatch.undo()
    with queue.capturing():
        maps.work(map_id, forward=True)  # a new task: nothing to claim
        maps.work(map_id, forward=True)  # and another: the map is collected already
    assert [kind for kind, _ in queue.pending].count("resume") == 1
    result.drain()
    assert result.status == ExecutionStatus.COMPLETED, result._describe()
    assert MapRun.objects.get(pk=map_id).collected
    resumes = [e for e in services.find(result.execution_id).trace if e.kind == "resume"]
    assert len(resumes) == 1


def test_settles_that_counted_without_each_other_are_fanned_in_when_their_task_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two tasks settling the last chunks at once each read the other's tally from before its
    commit, so neither settle sees the map complete: the task that then finds nothing to
    claim checks again after its commit and fans the map in, once."""
    import dataclasses

    from django_reactor import store
    from django_reactor.runtime import maps

    result = run_reactor_fanned([1, 2, 3, 4, 5])
    map_id = MapRun.objects.get(execution_id=result.execution_id).pk
    dialect = type(store.maps.dialect())
    real_settle = dialect.settle_forward

    def counted_without_the_other(self: Any, *args: Any, **kwargs: Any) -> Any:
        row, following = real_settle(self, *args, **kwargs)
        if row is not None:  # one element short: another task's settle not yet committed
            row = dataclasses.replace(row, settled=row.settled - 1)
        return row, following

    monkeypatch.setattr(dialect, "settle_forward", counted_without_the_other)
    queue = result._queue
    with queue.capturing():
        maps.work(map_id, forward=True)
    monkeypatch.undo()
    assert [kind for kind, _ in queue.pending].count("resume") == 1
    result.drain()
    assert result.status == ExecutionStatus.COMPLETED, result._describe()
    run = MapRun.objects.get(pk=map_id)
    assert (run.settled, run.succeeded, run.collected) == (5, 5, True)  # the tallies folded
    resumes = [e for e in services.find(result.execution_id).trace if e.kind == "resume"]
    assert len(resumes) == 1


def test_a_task_folds_its_tally_into_the_map_counters_as_it_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The map's row (what the admin lists) catches up with a task's settles once a
    FOLD_INTERVAL; here after every settle."""
    from django_reactor import store
    from django_reactor.runtime import maps

    result = run_reactor_fanned([1, 2, 3, 4, 5])  # chunks of 2: [1, 2], [3, 4], [5]
    map_id = MapRun.objects.get(execution_id=result.execution_id).pk
    monkeypatch.setattr(maps, "FOLD_INTERVAL", -1.0)
    real_fold = store.maps.fold
    seen: list[tuple[int, int]] = []

    def fold(map_id: Any, token: str) -> None:
        real_fold(map_id, token)
        run = MapRun.objects.get(pk=map_id)
        seen.append((run.settled, run.succeeded))

    monkeypatch.setattr(store.maps, "fold", fold)
    with result._queue.capturing():
        maps.work(map_id, forward=True)
    assert seen == [(2, 2), (4, 4), (5, 5)]
    result.drain()
    assert result.status == ExecutionStatus.COMPLETED, result._describe()


def echo(item: int) -> int:
    return item


class ManyEchoes(Reactor):
    class Inputs(serializers.Serializer):
        items = serializers.ListField(child=serializers.IntegerField())

    echoes = map_over(
        arg.input("items"), echo, item=arg.element(), fan_out=True, batch_size=4, chunk_size=2
    )


@pytest.mark.django_db(transaction=True)
def test_two_tasks_settling_and_folding_at_once_fan_the_map_in_once_without_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two element tasks on real threads work one map to its end, again and again: a task's
    fold (holding the map's row) and the other's settle (inserting a tally row, whose
    foreign key locks the map's row for key share) never wait for each other (a deadlock
    aborts one of them after a second; the database counts it)."""
    import threading

    from django.db import connection, connections

    from django_reactor.runtime import maps
    from django_reactor.testing import run_reactor

    def deadlocks() -> int:
        if connection.vendor != "postgresql":
            # MariaDB counts deadlocks for the whole server (other tests' too): a deadlock
            # here raises in its thread instead (``errors`` below).
            return 0
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            )
            return int(cursor.fetchone()[0])

    # Each task folds its tally after every settle, so its next settle inserts a new one.
    monkeypatch.setattr(maps, "FOLD_INTERVAL", -1.0)
    before = deadlocks()
    for _ in range(8):
        result = run_reactor(ManyEchoes, {"items": list(range(200))}, background="none")
        map_id = MapRun.objects.get(execution_id=result.execution_id).pk
        queue = result._queue
        queue.pending.clear()
        barrier = threading.Barrier(2, timeout=30)
        errors: list[BaseException] = []

        def task(map_id: Any, barrier: threading.Barrier, errors: list[BaseException]) -> None:
            try:
                barrier.wait()
                maps.work(map_id, forward=True)
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                connections.close_all()

        with queue.capturing():
            threads = [
                threading.Thread(target=task, args=(map_id, barrier, errors)) for _ in range(2)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
        assert not errors, errors
        assert [kind for kind, _ in queue.pending] == ["resume"]  # no task handed over
        run = MapRun.objects.get(pk=map_id)
        assert (run.settled, run.succeeded, run.collected) == (200, 200, True)
    # The tasks' backends are gone (each thread closed its connection): their counts are in.
    assert deadlocks() == before


def run_reactor_fanned(items: list[int]) -> Any:
    from django_reactor.testing import run_reactor

    return run_reactor(FannedBasket, {"order_id": 1, "items": items}, background="none")


def test_a_settle_that_died_before_stopping_the_map_is_stopped_by_the_next_settle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The failure that crosses an atomic map's line is stored by the settle's statement; the
    stop follows. If the process dies in between, the next task reads the map's failures from
    its counters and tallies: it starts no element and its settle stops the map."""
    from django_reactor import store
    from django_reactor.runtime import maps
    from django_reactor.testing import run_reactor

    FAIL_AT.add("item-1")
    result = run_reactor(
        FannedBasket, {"order_id": 1, "items": [1, 2, 3, 4, 5, 6, 7, 8]}, background="none"
    )
    map_id = MapRun.objects.get(execution_id=result.execution_id).pk
    real_stop = store.maps.stop
    stops: list[str] = []

    def die_once(map_id: Any, reason: str) -> Any:
        if not stops:
            stops.append(reason)
            raise SystemExit("the worker process stopped here")
        return real_stop(map_id, reason)

    monkeypatch.setattr(store.maps, "stop", die_once)
    queue = result._queue
    with queue.capturing(), pytest.raises(SystemExit):
        maps.work(map_id, forward=True)  # chunk [1, 2]: element 0 fails, the stop dies
    assert MapRun.objects.get(pk=map_id).stop_reason == ""
    assert store.maps.summary(map_id)["failed"] == 1  # in the dead task's tally

    with queue.capturing():
        maps.work(map_id, forward=True)  # the next task: starts nothing, stops the map
    monkeypatch.undo()
    run = MapRun.objects.get(pk=map_id)
    assert run.stop_reason == "failed"
    assert [c for c in ledger.calls if c[1].startswith("charge")] == [("run", "charge-1")]
    # Element 1 (after the failure in its chunk), the chunk the next task claimed and the
    # chunk never claimed; the chunk the dead task had claimed waits for its lease to lapse.
    assert run.not_started == 5
    assert sorted(
        MapResult.objects.filter(map_run_id=map_id, status=ElementStatus.NOT_STARTED).values_list(
            "index", flat=True
        )
    ) == [1, 4, 5, 6, 7]


def test_a_fanned_out_atomic_failure_undoes_completed_elements_on_workers() -> None:
    from django_reactor.testing import run_reactor

    FAIL_AT.add("item-3")
    result = run_reactor(FannedBasket, {"order_id": 1, "items": [1, 2, 3, 4, 5, 6, 7, 8]})
    assert result.status == ExecutionStatus.FAILED, result._describe()
    assert "map element 2 (of 8) failed" in result.outcome.error.message
    undone = [c[1] for c in ledger.calls if c[0] == "undo"]
    # Elements undone highest index first, then the step before the map.
    charges = [int(name.split("-")[1]) for name in undone if name.startswith("charge")]
    assert charges == sorted(charges, reverse=True)
    assert undone[-1] == "reserve"
    statuses = set(
        MapResult.objects.filter(map_run__execution_id=result.execution_id).values_list(
            "status", flat=True
        )
    )
    assert ElementStatus.SUCCEEDED not in statuses
    trace = [(e.kind, e.step) for e in services.find(result.execution_id).trace]
    assert ("compensate", "lines") in trace


def test_undo_of_a_completed_fanned_out_run_rolls_elements_back_on_workers() -> None:
    from django_reactor.testing import run_reactor

    result = run_reactor(FannedBasket, {"order_id": 1, "items": [1, 2, 3]})
    assert result.status == ExecutionStatus.COMPLETED
    with result._queue.capturing():
        handle = services.undo(result.execution_id)
    assert handle.status == ExecutionStatus.ROLLING_BACK
    result.drain()
    assert result.status == ExecutionStatus.CANCELLED, result._describe()
    assert [c for c in ledger.calls if c[0] == "undo"] == [
        ("undo", "charge-3"),
        ("undo", "charge-2"),
        ("undo", "charge-1"),
        ("undo", "reserve"),
    ]


def test_each_element_has_idempotency_keys_of_its_own() -> None:
    from django_reactor import step_context
    from django_reactor.engine.elements import element_id

    seen: list[tuple[Any, str]] = []

    def remember(item: int) -> int:
        context = step_context()
        seen.append((context.execution_id, context.idempotency_key))
        return item

    class Keys(Reactor):
        class Inputs(serializers.Serializer):
            items = serializers.ListField(child=serializers.IntegerField())

        each = map_over(arg.input("items"), remember, item=arg.element())

    outcome = Keys.run({"items": [1, 2, 3]})
    assert isinstance(outcome, Completed)
    map_id = MapRun.objects.get(execution_id=outcome.execution_id).pk
    assert [identity for identity, _ in seen] == [element_id(map_id, i) for i in range(3)]
    assert len({key for _, key in seen}) == 3


def test_undo_of_a_cancelled_run_parked_on_a_map_undoes_the_elements_done_so_far() -> None:
    from django_reactor.runtime import maps
    from django_reactor.testing import run_reactor

    result = run_reactor(
        FannedBasket, {"order_id": 1, "items": [1, 2, 3, 4, 5, 6]}, background="none"
    )
    map_id = MapRun.objects.get(execution_id=result.execution_id).pk
    # One element task runs one chunk, then its worker is gone; the run is still parked.
    from django_reactor import store

    claim, _ = store.maps.claim(map_id, forward=True, token="gone")
    assert claim is not None
    writes = maps._run_chunk(
        map_id,
        FannedBasket.definition.step("lines").map,
        {"order_id": 1},
        claim.slots,
        {c.index: c.index + 1 for c in claim.slots},
        None,
        False,
    )
    store.maps.settle(map_id, claim.chunk, writes, tolerated=None, token="gone")
    result._queue.pending.clear()
    # A parked run is cancelled first (its elements stop), then undone.
    assert services.cancel(result.execution_id).status == ExecutionStatus.CANCELLED
    with result._queue.capturing():
        handle = services.undo(result.execution_id)
    assert handle.status == ExecutionStatus.ROLLING_BACK  # workers undo the elements
    result.drain()
    assert result.status == ExecutionStatus.CANCELLED, result._describe()
    assert [c for c in ledger.calls if c[0] == "undo"] == [
        ("undo", "charge-2"),
        ("undo", "charge-1"),
        ("undo", "reserve"),
    ]
    assert not [c for c in ledger.calls if c == ("run", "charge-3")]


def test_cancelling_a_run_parked_on_a_map_stops_its_elements() -> None:
    from django_reactor.testing import run_reactor

    result = run_reactor(FannedBasket, {"order_id": 1, "items": [1, 2, 3, 4]}, background="none")
    handle = services.cancel(result.execution_id, reason="customer left")
    assert handle.status == ExecutionStatus.CANCELLED
    result.drain()
    assert not [c for c in ledger.calls if c[1].startswith("charge")]
    run = MapRun.objects.get(execution_id=result.execution_id)
    assert (run.stop_reason, run.settled) == ("cancelled", 4)


def test_an_element_reactor_with_coordination_is_refused() -> None:
    from django_reactor import Lock

    class Locked(Reactor):
        class Inputs(serializers.Serializer):
            item = serializers.IntegerField()

        @step(item=arg.input("item"))
        def one(item: int) -> int:
            return item

        class Meta:
            coordination = [Lock("item-{item}")]

    with pytest.raises(DefinitionError, match="declares coordination, which map elements"):

        class Mapping(Reactor):
            class Inputs(serializers.Serializer):
                items = serializers.ListField(child=serializers.IntegerField())

            each = map_over(arg.input("items"), Locked, item=arg.element())


class LosesARow(Reactor):
    """Its last step deletes element 1's stored row, then fails: the rollback finds it gone."""

    class Inputs(serializers.Serializer):
        items = serializers.ListField(child=serializers.IntegerField())

    lines = map_over(arg.input("items"), Line, item=arg.element(), order_id=arg.value(0))

    @step(wait_for=["lines"])
    def close() -> None:
        MapResult.objects.filter(index=1).delete()
        raise RuntimeError("ledger closed")


def test_an_element_whose_row_is_gone_is_reported_with_its_index_not_skipped() -> None:
    outcome = LosesARow.run({"items": [1, 2, 3]})
    assert isinstance(outcome, Failed)
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    (failure,) = outcome.error.rollback_failures
    assert (failure.step, failure.index, failure.kind) == ("lines[1]", 1, "missing")
    assert "no stored row" in failure.message
    assert [c for c in ledger.calls if c[0] == "undo"] == [
        ("undo", "charge-3"),
        ("undo", "charge-1"),
    ]


def test_a_chunk_taken_over_is_claimed_as_retaken_and_its_settle_overwrites_its_slots() -> None:
    import datetime as dt

    from django.db import IntegrityError, connection, transaction

    from django_reactor import store
    from django_reactor.models import MapChunk
    from django_reactor.testing import run_reactor

    result = run_reactor(FannedBasket, {"order_id": 1, "items": [1, 2]}, background="none")
    map_id = MapRun.objects.get(execution_id=result.execution_id).pk
    first, _ = store.maps.claim(map_id, forward=True, token="first")
    assert first is not None
    assert not first.retaken
    # Its holder died: the lease lapses and another task takes the chunk over.
    MapChunk.objects.filter(pk=first.chunk).update(
        lease_until=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    )
    again, _ = store.maps.claim(map_id, forward=True, token="again")
    assert again is not None
    assert again.chunk == first.chunk
    assert again.retaken
    index = again.slots[0].index
    MapResult.objects.create(map_run_id=map_id, index=index, status="pending", attempts=1)
    writes = [store.maps.SlotWrite(s.index, "succeeded", value=s.item) for s in again.slots]
    if connection.vendor == "postgresql":
        # Told it is a first claim, the settle inserts plainly: a slot there fails it.
        with pytest.raises(IntegrityError), transaction.atomic():
            store.maps.settle(
                map_id, again.chunk, writes, tolerated=None, token="again", retaken=False
            )
    store.maps.settle(map_id, again.chunk, writes, tolerated=None, token="again", retaken=True)
    slot = MapResult.objects.get(map_run_id=map_id, index=index)
    assert (slot.status, slot.attempts) == ("succeeded", 2)
    assert MapResult.objects.filter(map_run_id=map_id).count() == len(again.slots)
