"""Meta.batch: starts of a key (events' triggers among them) collect into one run, which
receives their inputs as ``items`` and starts when full or at max_wait; an idempotency key is
one item however often it comes."""

from __future__ import annotations

import datetime as dt
import re
import threading
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from rest_framework import serializers

from django_reactor import Batch, Reactor, Scheduled, arg, emit, on_event, services, step
from django_reactor.exceptions import DefinitionError, IdempotencyKeyReused, InvalidTime
from django_reactor.models import BatchItem, Execution
from django_reactor.states import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = dt.timedelta(seconds=5)


class OrderLine(serializers.Serializer):
    tenant = serializers.CharField()
    sku = serializers.CharField()
    card = serializers.CharField(write_only=True, required=False)


class ShipLines(Reactor):
    Inputs = OrderLine

    @step(items=arg.input("items"))
    def ship(items: list[dict[str, Any]]) -> list[str]:
        return [line["sku"] for line in items]

    class Meta:
        batch = Batch(key="{tenant}", max_size=3, max_wait=WAIT)
        triggers = [on_event("line.added")]
        returns = "ship"


def row(execution_id: uuid.UUID | None) -> Execution:
    return Execution.objects.get(pk=execution_id)


def make(meta: dict[str, Any], inputs: type = OrderLine) -> type:
    return type(
        "Bad",
        (Reactor,),
        {"Inputs": inputs, "only": step()(lambda: 1), "Meta": type("Meta", (), meta)},
    )


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        ({"batch": Batch(key="{nope}")}, "Bad.Meta.batch.key '{nope}' names {nope}"),
        ({"batch": Batch(key="{tenant}", max_size=0)}, "Bad.Meta.batch.max_size must be"),
        ({"batch": Batch(key="{tenant}", max_wait=-1)}, "Bad.Meta.batch.max_wait"),
        ({"batch": "{tenant}"}, "Bad.Meta.batch must be Batch("),
        (
            {"batch": Batch(key="{tenant}"), "subject": arg.input("tenant")},
            "Bad.Meta declares batch with subject",
        ),
    ],
)
def test_a_bad_declaration_is_refused_at_class_definition(meta: dict[str, Any], says: str) -> None:
    with pytest.raises(DefinitionError, match=re.escape(says)):
        make(meta)


def test_a_step_reads_the_items_not_one_starts_inputs() -> None:
    class Reads(Reactor):
        Inputs = OrderLine

        @step(sku=arg.input("sku"))
        def only(sku: str) -> str:
            return sku

    with pytest.raises(DefinitionError, match="sku"):

        class ReadsOne(Reactor):
            Inputs = OrderLine

            @step(sku=arg.input("sku"))
            def only(sku: str) -> str:
                return sku

            class Meta:
                batch = Batch(key="{tenant}")

    del Reads


def test_starts_collect_into_one_run_that_starts_when_full(reactor_clock: Any) -> None:
    outcomes = [
        services.run_in_background(ShipLines, {"tenant": "t1", "sku": f"s{n}", "card": "4242"})
        for n in range(3)
    ]
    assert all(isinstance(o, Scheduled) for o in outcomes)
    batch = row(outcomes[0].execution_id)
    assert {o.execution_id for o in outcomes} == {batch.id}
    assert (batch.batch_key, batch.batch_size) == ("t1", 3)
    # The third filled it: it starts now, with the items in arrival order, their cards sealed.
    assert outcomes[-1].start_at <= outcomes[0].start_at
    assert [item["sku"] for item in batch.inputs["items"]] == ["s0", "s1", "s2"]
    assert all(item["card"] != "4242" for item in batch.inputs["items"])
    kinds = [e.kind for e in services.find(batch.id).trace]
    assert kinds == ["start", "batch", "batch", "batch"]
    out = StringIO()
    call_command("reactor_show", str(batch.id), stdout=out, no_color=True)
    assert "batch key: t1 (3 items)" in out.getvalue()
    reactor_clock.advance(seconds=0)
    assert services.find(batch.id).outcome.value == ["s0", "s1", "s2"]
    # The next start opens the next batch.
    again = services.run_in_background(ShipLines, {"tenant": "t1", "sku": "s3"})
    assert again.execution_id != batch.id


def test_a_batch_that_does_not_fill_starts_at_max_wait(reactor_clock: Any) -> None:
    first = services.run_in_background(ShipLines, {"tenant": "t2", "sku": "a"})
    reactor_clock.advance(seconds=3, run=False)
    second = services.run_in_background(ShipLines, {"tenant": "t2", "sku": "b"})
    other = services.run_in_background(ShipLines, {"tenant": "t3", "sku": "c"})
    assert second.execution_id == first.execution_id != other.execution_id
    # max_wait counts from the first item, not the last (the test clock moved stored times 3 s
    # back).
    assert second.start_at == first.start_at - dt.timedelta(seconds=3)
    assert reactor_clock.advance(seconds=1) == []
    done = reactor_clock.advance(seconds=1)
    assert [(o.execution_id, o.status) for o in done] == [(first.execution_id, "completed")]
    assert services.find(first.execution_id).outcome.value == ["a", "b"]
    assert row(other.execution_id).status == ExecutionStatus.SCHEDULED


def test_an_idempotency_key_is_one_item_even_after_its_batch_started(reactor_clock: Any) -> None:
    first = services.run_in_background(
        ShipLines, {"tenant": "t4", "sku": "a"}, idempotency_key="line-1"
    )
    again = services.run_in_background(
        ShipLines, {"tenant": "t4", "sku": "a"}, idempotency_key="line-1"
    )
    assert again.execution_id == first.execution_id
    assert again.idempotent_replay
    assert row(first.execution_id).batch_size == 1
    with pytest.raises(IdempotencyKeyReused, match="line-1"):
        services.run_in_background(
            ShipLines, {"tenant": "t4", "sku": "other"}, idempotency_key="line-1"
        )
    reactor_clock.advance(WAIT)
    assert services.find(first.execution_id).status == ExecutionStatus.COMPLETED
    late = services.run_in_background(
        ShipLines, {"tenant": "t4", "sku": "a"}, idempotency_key="line-1"
    )
    assert late.execution_id == first.execution_id
    assert Execution.objects.filter(reactor=row(first.execution_id).reactor).count() == 1


def test_events_start_batches_and_a_redelivered_event_is_one_item(reactor_clock: Any) -> None:
    emitted = [emit("line.added", {"tenant": "t5", "sku": f"e{n}"}, event_id=n) for n in range(4)]
    redelivered = emit("line.added", {"tenant": "t5", "sku": "e1"}, event_id=1)
    assert redelivered.replay
    runs = [e.started[0] for e in emitted]
    # Three fill the first batch; the fourth opens the next.
    assert runs[0] == runs[1] == runs[2] != runs[3]
    assert BatchItem.objects.count() == 4
    reactor_clock.advance(WAIT)
    assert services.find(runs[0]).outcome.value == ["e0", "e1", "e2"]
    assert services.find(runs[3]).outcome.value == ["e3"]


def test_a_start_time_is_refused_and_nothing_written() -> None:
    with pytest.raises(InvalidTime, match="collects its starts in batches"):
        services.run(ShipLines, {"tenant": "t6", "sku": "a"}, delay=10)
    assert not Execution.objects.exists()


def test_invalid_inputs_fail_alone_without_joining_a_batch() -> None:
    outcome = services.run_in_background(ShipLines, {"tenant": "t7"})
    assert outcome.status == "failed"
    assert row(outcome.execution_id).batch_key == ""


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite writers take turns anyway")
def test_concurrent_starts_of_a_key_fill_batches_exactly(reactor_clock: Any) -> None:
    threads, barrier = 6, threading.Barrier(6, timeout=30)
    got: list[uuid.UUID] = []
    lock = threading.Lock()

    def starter(n: int) -> None:
        barrier.wait()
        for m in range(5):
            outcome = services.run_in_background(
                ShipLines, {"tenant": "race", "sku": f"{n}-{m}"}, idempotency_key=f"{n}-{m}"
            )
            with lock:
                got.append(outcome.execution_id)  # type: ignore[arg-type]
        connection.close()

    workers = [threading.Thread(target=starter, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    sizes = sorted(Execution.objects.filter(batch_key="race").values_list("batch_size", flat=True))
    assert sizes == [3] * 10
    assert len(got) == 30
    assert len(set(got)) == 10
    assert sum(len(row(r).inputs["items"]) for r in set(got)) == 30
