"""Meta.concurrency: at most ``limit`` runs in flight per key; what a start over it does; queued
runs admitted in arrival order as runs of their key end (by the process that ended them, or by
the sweeper)."""

from __future__ import annotations

import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from rest_framework import serializers

from django_reactor import Concurrency, Queued, Reactor, services, step
from django_reactor.exceptions import DefinitionError, InvalidInputs
from django_reactor.models import Dispatch, Execution
from django_reactor.states import ExecutionStatus
from django_reactor.store import outbox

pytestmark = pytest.mark.django_db


class TenantInputs(serializers.Serializer):
    tenant_id = serializers.CharField()
    n = serializers.IntegerField(required=False, default=0)


class Sync(Reactor):
    Inputs = TenantInputs

    @step()
    def only() -> str:
        return "synced"

    class Meta:
        background = "all"
        concurrency = Concurrency(key="tenant-{tenant_id}", limit=2)


class Singleton(Reactor):
    @step()
    def only() -> str:
        return "done"

    class Meta:
        background = "all"
        concurrency = Concurrency(limit=1, on_limit="skip")


class Newest(Reactor):
    Inputs = TenantInputs

    @step()
    def only() -> str:
        return "done"

    class Meta:
        background = "all"
        concurrency = Concurrency(key="{tenant_id}", limit=1, on_limit="cancel_newest")


class Latest(Reactor):
    Inputs = TenantInputs

    @step()
    def only() -> str:
        return "done"

    class Meta:
        background = "all"
        concurrency = Concurrency(key="{tenant_id}", limit=1, on_limit="cancel_in_progress")


class InlineLimited(Reactor):
    Inputs = TenantInputs

    @step()
    def only() -> str:
        return "inline"

    class Meta:
        concurrency = Concurrency(key="{tenant_id}", limit=1)


def statuses(ids: list[uuid.UUID]) -> list[str]:
    rows = dict(Execution.objects.filter(pk__in=ids).values_list("id", "status"))
    return [rows[i] for i in ids]


def kinds(execution_id: uuid.UUID) -> list[str]:
    return [e.kind for e in services.find(execution_id).trace]


def finish(execution_id: uuid.UUID) -> None:
    """A worker takes the run and runs it to its end (the task's body, in this process)."""
    outcome = services.resume(execution_id)
    assert outcome is not None
    assert outcome.status == ExecutionStatus.COMPLETED


# ---------------------------------------------------------------------------- declarations


@pytest.mark.parametrize(
    ("concurrency", "says"),
    [
        (Concurrency(key="{tenant_id}", limit=0), "Bad.Meta.concurrency.limit must be a positive"),
        (Concurrency(key="{tenant_id}", limit=True), "Bad.Meta.concurrency.limit must be"),
        (Concurrency(key="{tenant_id}", on_limit="drop"), "Bad.Meta.concurrency.on_limit must be"),
        (Concurrency(key="{customer}"), "names {customer}, which is not an input of Bad"),
        (Concurrency(key="{tenant_id"), "is not a valid format string"),
        (Concurrency(key="{}"), "has an empty {}"),
        (Concurrency(key=5), "Bad.Meta.concurrency.key must be a format string"),  # type: ignore[arg-type]
        ("{tenant_id}", "Bad.Meta.concurrency must be Concurrency("),
    ],
)
def test_a_bad_declaration_is_refused_at_class_definition(concurrency: Any, says: str) -> None:
    with pytest.raises(DefinitionError, match=re.escape(says)) as raised:
        type(
            "Bad",
            (Reactor,),
            {
                "Inputs": TenantInputs,
                "only": step()(lambda: 1),
                "Meta": type("Meta", (), {"concurrency": concurrency}),
            },
        )
    assert isinstance(raised.value, ImproperlyConfigured)


# ---------------------------------------------------------------------------- queue


def test_runs_over_the_limit_queue_and_start_in_arrival_order_as_runs_end() -> None:
    first, second, third, fourth = (
        services.run_in_background(Sync, {"tenant_id": "a", "n": n}).execution_id for n in range(4)
    )
    other = services.run_in_background(Sync, {"tenant_id": "b"}).execution_id
    assert statuses([first, second, third, fourth, other]) == [
        "pending",
        "pending",
        "queued",
        "queued",
        "pending",  # another key has its own slots
    ]
    queued = services.find(third)
    assert queued.outcome == Queued(execution_id=third, key="tenant-a")
    assert kinds(third) == ["start", "queue"]
    assert queued.trace[1].data == {
        "reason": "concurrency limit of tests.integration.test_concurrency_keys.Sync: 2 of 2 "
        "run(s) with key 'tenant-a' in flight",
        "key": "tenant-a",
    }
    # A queued run holds no worker: no dispatch, and a worker's task finds nothing to take.
    assert not Dispatch.objects.filter(execution_id=third).exists()
    assert services.resume(third) is None
    # The first ends: the oldest queued run is admitted by the process that ended it.
    finish(first)
    assert statuses([second, third, fourth]) == ["pending", "pending", "queued"]
    assert kinds(third) == ["start", "queue", "admit"]
    assert Dispatch.objects.get(execution_id=third).reason == "admit"
    finish(second)
    assert statuses([third, fourth]) == ["pending", "pending"]
    finish(third)
    finish(fourth)
    assert services.find(fourth).outcome.value == {"only": "synced"}


def test_the_route_of_an_admitted_run_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = services.run_in_background(Sync, {"tenant_id": "r"}, queue="sync").execution_id
    services.run_in_background(Sync, {"tenant_id": "r"}, queue="sync")
    waiting = services.run_in_background(Sync, {"tenant_id": "r"}, priority=9).execution_id
    sent: list[Any] = []

    class Capture:
        def publish(self, dispatches: Any) -> list[int]:
            sent.extend((d.execution_id, d.route) for d in dispatches)
            return [d.dispatch_id for d in dispatches]

    previous = outbox.register_publisher(Capture(), after_commit=False)
    try:
        finish(holder)
    finally:
        outbox.register_publisher(previous[0], after_commit=previous[1])
    [(run, route)] = sent
    assert (run, route.queue, route.priority) == (waiting, "", 9)


def test_a_cancelled_queued_run_leaves_the_queue_and_a_cancelled_holder_admits_the_next() -> None:
    holder, _ = (
        services.run_in_background(Sync, {"tenant_id": "c"}).execution_id for _ in range(2)
    )
    dropped = services.run_in_background(Sync, {"tenant_id": "c"}).execution_id
    later = services.run_in_background(Sync, {"tenant_id": "c"}).execution_id
    services.cancel(dropped, reason="not needed")
    assert statuses([dropped, later]) == ["cancelled", "queued"]
    services.cancel(holder, reason="stop")
    assert statuses([holder, later]) == ["cancelled", "pending"]


def test_the_sweeper_admits_what_a_dead_process_left_queued() -> None:
    holder = services.run_in_background(Sync, {"tenant_id": "d", "n": 1}).execution_id
    services.run_in_background(Sync, {"tenant_id": "d", "n": 2})
    waiting = services.run_in_background(Sync, {"tenant_id": "d", "n": 3}).execution_id
    # The holder ended where nothing admitted the next (its process died after the commit).
    Execution.objects.filter(pk=holder).update(status=ExecutionStatus.COMPLETED)
    assert statuses([waiting]) == ["queued"]
    assert services.sweep().recovered >= 1
    assert statuses([waiting]) == ["pending"]


def test_an_inline_run_over_the_limit_is_queued_for_a_worker() -> None:
    # A run paused inline... here: one held by a run that is pending on a worker.
    holder = services.run_in_background(InlineLimited, {"tenant_id": "i"}).execution_id
    outcome = InlineLimited.run({"tenant_id": "i"})
    assert isinstance(outcome, Queued)
    assert statuses([holder, outcome.execution_id]) == ["pending", "queued"]
    # The inline run of another key runs here, and ends: nothing waits for it.
    assert InlineLimited.run({"tenant_id": "j"}).value == {"only": "inline"}


def test_a_key_naming_a_missing_input_refuses_the_start_and_writes_nothing() -> None:
    class Optional(Reactor):
        class Inputs(serializers.Serializer):
            region = serializers.CharField(required=False)

        only = step()(lambda: 1)

        class Meta:
            background = "all"
            concurrency = Concurrency(key="{region}", limit=1)

    with pytest.raises(InvalidInputs, match=r"names \{region\}, but only nothing are given"):
        services.run_in_background(Optional, {})
    assert Execution.objects.count() == 0


# ---------------------------------------------------------------------------- the other strategies


def test_skip_makes_a_singleton_a_repeated_start_returns_the_run_in_flight() -> None:
    first = services.run_in_background(Singleton, {})
    again = services.run_in_background(Singleton, {})
    assert again.execution_id == first.execution_id
    assert again.idempotent_replay
    assert Execution.objects.count() == 1
    finish(first.execution_id)
    assert services.run_in_background(Singleton, {}).execution_id != first.execution_id


def test_cancel_newest_records_the_new_run_cancelled_and_saying_why() -> None:
    running = services.run_in_background(Newest, {"tenant_id": "n"}).execution_id
    refused = services.run_in_background(Newest, {"tenant_id": "n"})
    assert refused.status == ExecutionStatus.CANCELLED
    assert refused.reason.startswith("concurrency limit of ")
    assert kinds(refused.execution_id) == ["start", "cancel"]
    assert statuses([running]) == ["pending"]


def test_cancel_in_progress_stops_the_run_in_flight_for_the_newest() -> None:
    old = services.run_in_background(Latest, {"tenant_id": "l"}).execution_id
    new = services.run_in_background(Latest, {"tenant_id": "l"}).execution_id
    # Nobody ran the old one yet: it is cancelled at once, and the new one admitted.
    assert statuses([old, new]) == ["cancelled", "pending"]
    assert services.find(old).outcome.reason == (
        f"superseded by execution {new} (concurrency key 'l')"
    )
    assert kinds(new) == ["start", "queue", "admit"]


# ---------------------------------------------------------------------------- races


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_start_with_room_takes_its_key_in_its_insert_and_a_full_key_falls_back_to_the_lock() -> (
    None
):
    from django.test.utils import CaptureQueriesContext

    def locked_statements(tenant: str) -> tuple[str, list[str]]:
        with CaptureQueriesContext(connection) as seen:
            outcome = services.run_in_background(Sync, {"tenant_id": tenant})
        status = Execution.objects.get(pk=outcome.execution_id).status
        return status, [q["sql"] for q in seen.captured_queries if "advisory" in q["sql"]]

    # With room, the insert (sent outside Django's query log) took the key: no lock of its own.
    assert locked_statements("fast") == ("pending", [])
    assert locked_statements("fast")[1] == []
    # Full: the insert wrote nothing and the start decided under the key's lock, queued (and
    # looked, under the lock again, for a slot freed meanwhile).
    status, locks = locked_statements("fast")
    assert status == "queued"
    assert len(locks) == 2
    assert Execution.objects.filter(concurrency_key="tenant-fast").count() == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_of_one_key_never_take_more_than_its_slots() -> None:
    assert connection.vendor == "postgresql"
    callers = 8
    barrier = threading.Barrier(callers, timeout=20)

    def start(n: int) -> uuid.UUID:
        from django.db import connections

        try:
            barrier.wait()
            outcome = services.run_in_background(Sync, {"tenant_id": "race", "n": n})
            assert outcome.execution_id is not None
            return outcome.execution_id
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=callers) as pool:
        ids = [f.result(timeout=60) for f in [pool.submit(start, n) for n in range(callers)]]
    assert sorted(statuses(ids)) == ["pending"] * 2 + ["queued"] * 6
    # In arrival order: the admitted are the two oldest.
    by_age = list(
        Execution.objects.filter(pk__in=ids).order_by("created_at").values_list("status", flat=True)
    )
    assert by_age == ["pending"] * 2 + ["queued"] * 6


def test_reactor_show_and_the_api_say_what_a_queued_run_waits_for() -> None:
    from io import StringIO

    from django.core.management import call_command

    from django_reactor.api.serializers import ExecutionSerializer

    services.run_in_background(Sync, {"tenant_id": "s"})
    services.run_in_background(Sync, {"tenant_id": "s"})
    queued = services.run_in_background(Sync, {"tenant_id": "s"}).execution_id
    out = StringIO()
    call_command("reactor_show", str(queued), stdout=out, no_color=True)
    text = out.getvalue()
    assert "status: queued" in text or "queued" in text.splitlines()[0]
    assert "concurrency key: tenant-s" in text
    assert (
        "  waiting for its concurrency key 'tenant-s': 2 of 2 run(s) in flight, 0 queued ahead "
        "of it; it starts when one of them ends"
    ) in text
    data = ExecutionSerializer(Execution.objects.get(pk=queued)).data
    assert (data["status"], data["concurrency_key"]) == ("queued", "tenant-s")


def test_the_sweeper_finds_a_key_behind_another_keys_deep_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_reactor.store import flow as store_flow

    monkeypatch.setattr(store_flow, "WAITING_READ", 2)
    deep = [services.run_in_background(Sync, {"tenant_id": "deep"}).execution_id for _ in range(8)]
    stuck = [services.run_in_background(Sync, {"tenant_id": "late"}).execution_id for _ in range(3)]
    # Both keys' holders ended where nothing admitted the next.
    Execution.objects.filter(pk__in=[*deep[:2], *stuck[:2]]).update(
        status=ExecutionStatus.COMPLETED
    )
    assert store_flow.waiting_keys() == [
        (Sync.definition.name, "tenant-deep"),
        (Sync.definition.name, "tenant-late"),
    ]
    services.sweep()
    assert statuses([stuck[2]]) == ["pending"]
    assert statuses(deep[2:]) == ["pending", "pending", "queued", "queued", "queued", "queued"]
