"""map_over() sources: QuerySets read in keyset pages, generators read in batches, callables
over the map's arguments, and sources that break while they are read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework import serializers

from django_reactor import (
    Completed,
    Failed,
    Reactor,
    arg,
    map_over,
    services,
    step,
    store,
)
from django_reactor.engine.outcomes import ErrorKind
from django_reactor.models import MapChunk, MapResult, MapRun
from django_reactor.runtime import maps
from django_reactor.states import ElementStatus, ExecutionStatus
from tests.integration.reactors import ledger

pytestmark = pytest.mark.django_db

#: Primary keys created out of order, so that reading in pk order is visible.
PKS = [7, 3, 10, 1, 12, 5, 9, 2, 11, 4]


@pytest.fixture
def users() -> list[int]:
    for pk in PKS:
        User.objects.create(id=pk, username=f"m-{pk:02d}")
    User.objects.create(id=99, username="other")  # not matched by the source
    return sorted(PKS)


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maps, "QUERYSET_CHUNK", 3)


def matching_users(prefix: str) -> Any:
    """A callable source taking the map's ``prefix`` argument by name; its own ordering
    (by username, descending) is replaced by the map's primary-key order."""
    return User.objects.filter(username__startswith=prefix).order_by("-username")


def greet(user: Any, prefix: str) -> Any:
    ledger("run", f"user-{user.pk}")
    assert isinstance(user, User)
    return {"pk": user.pk, "name": user.username, "prefix": prefix}


class GreetUsers(Reactor):
    class Inputs(serializers.Serializer):
        prefix = serializers.CharField()

    greet = map_over(
        matching_users,
        greet,
        user=arg.element(),
        prefix=arg.input("prefix"),
        batch_size=4,
        chunk_size=2,
        collect=list,
    )

    class Meta:
        returns = "greet"


def _map(execution_id: Any) -> MapRun:
    return MapRun.objects.get(execution_id=execution_id)


def _items(execution_id: Any) -> list[Any]:
    return list(
        MapResult.objects.filter(map_run__execution_id=execution_id)
        .order_by("index")
        .values_list("item", flat=True)
    )


def test_a_queryset_of_rows_is_read_in_keyset_pages_and_each_element_gets_its_instance(
    users: list[int], small_pages: None
) -> None:
    with CaptureQueriesContext(connection) as queries:
        outcome = GreetUsers.run({"prefix": "m-"})
    assert isinstance(outcome, Completed), outcome
    # Elements in primary-key order, whatever the QuerySet's own ordering.
    assert [v["pk"] for v in outcome.value] == users
    assert outcome.value[0] == {"pk": 1, "name": "m-01", "prefix": "m-"}
    assert ledger.calls == [("run", f"user-{pk}") for pk in users]
    # The slots store primary keys, never the rows.
    assert _items(outcome.execution_id) == users
    run = _map(outcome.execution_id)
    assert run.source_model == "auth.User"
    assert (run.size, run.succeeded) == (10, 10)
    # Keyset pages of 3 (3 + 3 + 3 + 1 rows, the short page ends the read): never OFFSET,
    # never the whole table; the rows are fetched again per claimed chunk, by key.
    table, key = connection.ops.quote_name("auth_user"), connection.ops.quote_name("id")
    user_queries = [q["sql"] for q in queries.captured_queries if f"FROM {table}" in q["sql"]]
    pages = [sql for sql in user_queries if "LIMIT 3" in sql]
    assert len(pages) == 4
    assert all("OFFSET" not in sql for sql in user_queries)
    assert [sql.count(f"{table}.{key} >") for sql in pages] == [0, 1, 1, 1]
    refetches = [sql for sql in user_queries if sql not in pages]
    assert len(refetches) == 5  # one in_bulk per chunk of 2 elements
    assert all(" IN (" in sql for sql in refetches)


def test_a_page_boundary_on_the_last_row_ends_with_an_empty_page(
    users: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maps, "QUERYSET_CHUNK", 5)  # 10 rows: 5 + 5 + an empty page
    outcome = GreetUsers.run({"prefix": "m-"})
    assert isinstance(outcome, Completed), outcome
    assert [v["pk"] for v in outcome.value] == users
    assert _items(outcome.execution_id) == users


class FannedGreetUsers(Reactor):
    class Inputs(serializers.Serializer):
        prefix = serializers.CharField()

    greet = map_over(
        matching_users,
        greet,
        user=arg.element(),
        prefix=arg.input("prefix"),
        fan_out=True,
        batch_size=4,
        chunk_size=2,
        atomic=False,
    )

    class Meta:
        returns = "greet"


def test_a_row_deleted_between_reading_and_running_fails_that_element_clearly(
    users: list[int], small_pages: None
) -> None:
    from django_reactor.testing import run_reactor

    result = run_reactor(FannedGreetUsers, {"prefix": "m-"}, background="none")
    assert result.status == ExecutionStatus.PENDING  # the source is read; no element ran
    stored = MapChunk.objects.filter(map_run__execution_id=result.execution_id).order_by("first")
    assert [item for chunk in stored for item in chunk.items] == users
    User.objects.filter(pk=5).delete()
    result.drain()
    assert result.status == ExecutionStatus.COMPLETED, result._describe()
    assert ledger.calls == [("run", f"user-{pk}") for pk in users if pk != 5]
    slot = MapResult.objects.get(map_run__execution_id=result.execution_id, index=users.index(5))
    assert slot.status == ElementStatus.FAILED
    assert slot.error["kind"] == ErrorKind.ARGUMENT
    assert slot.error["message"] == "row 5 of auth.User no longer exists"
    results = services.find(result.execution_id).step_result("greet")
    assert [f.index for f in results.failures()] == [users.index(5)]
    assert [v["pk"] for v in results] == [pk for pk in users if pk != 5]


def test_a_values_queryset_gives_each_element_a_dict(users: list[int], small_pages: None) -> None:
    seen: list[Any] = []

    def rows(prefix: str) -> Any:
        return User.objects.filter(username__startswith=prefix).values("id", "username")

    def element(row: Any, prefix: str) -> Any:
        seen.append(row)
        return row["username"]

    class Named(Reactor):
        names = map_over(rows, element, row=arg.element(), prefix=arg.value("m-"), collect=list)

        class Meta:
            returns = "names"

    outcome = Named.run({})
    assert isinstance(outcome, Completed), outcome
    assert outcome.value == [f"m-{pk:02d}" for pk in users]
    assert seen == [{"id": pk, "username": f"m-{pk:02d}"} for pk in users]
    assert _items(outcome.execution_id) == seen  # dicts stored as they are
    assert _map(outcome.execution_id).source_model == ""


def test_a_generator_source_is_read_lazily_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store.maps, "MATERIALISE_BATCH", 4)
    produced: list[int] = []
    writes: list[tuple[int, int, int]] = []
    write_items = store.maps.write_items

    def recording(map_id: Any, first: int, items: Any, **options: Any) -> None:
        # (first index, batch length, items the generator had produced at that moment)
        writes.append((first, len(items), len(produced)))
        write_items(map_id, first, items, **options)

    monkeypatch.setattr(store.maps, "write_items", recording)

    def numbers(count: int) -> Iterator[int]:
        for i in range(count):
            produced.append(i)
            yield i * 3

    def triple(n: int, count: int) -> int:
        ledger("run", f"n-{n}")
        return n + 1

    class Numbers(Reactor):
        values = map_over(numbers, triple, n=arg.element(), count=arg.input("count"), collect=list)

        class Meta:
            returns = "values"

    outcome = Numbers.run({"count": 10})
    assert isinstance(outcome, Completed), outcome
    assert outcome.value == [i * 3 + 1 for i in range(10)]
    # Each batch was written as soon as it was full: never more than a batch in memory.
    assert writes == [(0, 4, 4), (4, 4, 8), (8, 2, 10)]
    assert _items(outcome.execution_id) == [i * 3 for i in range(10)]


def up_to(count: int) -> range:
    return range(count)


def double(n: int, count: int) -> int:
    return n * 2


class Doubled(Reactor):
    values = map_over(up_to, double, n=arg.element(), count=arg.input("count"), collect=list)

    class Meta:
        returns = "values"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_source_batches_commit_without_waiting_for_the_disk_and_leave_the_setting_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each batch of the source is its own transaction with synchronous_commit off (the map
    becomes runnable in a synchronous commit, which flushes them); the setting is local to
    the batch's transaction, and a batch written inside the caller's transaction leaves the
    caller's commit synchronous."""
    from django.db import transaction

    monkeypatch.setattr(store.maps, "MATERIALISE_BATCH", 4)

    def settings_seen(queries: CaptureQueriesContext) -> list[str]:
        return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SET")]

    with CaptureQueriesContext(connection) as own:
        outcome = Doubled.run({"count": 10})
    assert isinstance(outcome, Completed), outcome
    assert outcome.value == [n * 2 for n in range(10)]
    assert settings_seen(own) == ["SET LOCAL synchronous_commit TO off"] * 3  # 4 + 4 + 2
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"

    # Inside a caller's transaction (run() refuses one; a test's is one) the batch goes in it.
    map_id = _map(outcome.execution_id).pk
    with transaction.atomic(), CaptureQueriesContext(connection) as inside:
        store.maps.write_items(map_id, 0, [1, 2], chunk_size=4)
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on"
        transaction.set_rollback(True)
    assert settings_seen(inside) == []


def test_a_callable_source_gets_the_map_arguments_it_names() -> None:
    calls: list[dict[str, Any]] = []

    def named(first: Any, limit: int) -> list[int]:
        calls.append({"first": first, "limit": limit})
        return list(range(first["start"], first["start"] + limit))

    def everything(**arguments: Any) -> list[int]:
        calls.append(dict(arguments))
        return [arguments["limit"]]

    def add(n: int, limit: int, first: Any) -> int:
        return n + limit

    class Sourced(Reactor):
        class Inputs(serializers.Serializer):
            limit = serializers.IntegerField()

        @step()
        def first() -> Any:
            return {"start": 5}

        by_name = map_over(
            named,
            add,
            n=arg.element(),
            limit=arg.input("limit"),
            first=arg.result("first"),
            collect=list,
        )
        by_kwargs = map_over(
            everything,
            add,
            n=arg.element(),
            limit=arg.input("limit"),
            first=arg.result("first"),
            collect=list,
        )

        @step(a=arg.result("by_name"), b=arg.result("by_kwargs"))
        def both(a: Any, b: Any) -> Any:
            return {"a": a, "b": b}

        class Meta:
            returns = "both"

    outcome = Sourced.run({"limit": 3})
    assert isinstance(outcome, Completed), outcome
    assert outcome.value == {"a": [8, 9, 10], "b": [6]}
    assert sorted(calls, key=len) == [
        {"first": {"start": 5}, "limit": 3},
        {"first": {"start": 5}, "limit": 3},
    ]


def test_a_source_raising_mid_iteration_fails_the_map_step_and_undoes_earlier_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store.maps, "MATERIALISE_BATCH", 2)  # a batch was written already

    def flaky_rows() -> Iterator[int]:
        yield 1
        yield 2
        yield 3
        raise ConnectionError("the export API hung up")

    def element(n: int) -> int:
        ledger("run", f"n-{n}")
        return n

    class Broken(Reactor):
        @step()
        def reserve() -> Any:
            ledger("run", "reserve")
            return "held"

        @reserve.undo
        def release(result: Any) -> None:
            ledger("undo", "reserve")

        lines = map_over(flaky_rows, element, n=arg.element(), wait_for=["reserve"])

        @step(lines=arg.result("lines"))
        def after(lines: Any) -> Any:
            ledger("run", "after")

    outcome = Broken.run({})
    assert isinstance(outcome, Failed), outcome
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.step == "lines"
    assert outcome.error.message == (
        "the map's source raised ConnectionError while reading element 3: the export API hung up"
    )
    assert ledger.calls == [("run", "reserve"), ("undo", "reserve")]  # no element ran
    trace = [(e.kind, e.step) for e in services.find(outcome.execution_id).trace if e.step]
    assert ("fail", "lines") in trace
    assert trace[-1] == ("undo", "reserve")
    assert not MapResult.objects.filter(
        map_run__execution_id=outcome.execution_id, status=ElementStatus.SUCCEEDED
    ).exists()
