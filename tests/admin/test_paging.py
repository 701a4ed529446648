"""Admin lists that count at most a few rows and page by keyset past the numbered pages."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Iterator

import pytest
from django.contrib import admin
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_reactor.admin.paging import Keyset, RowCount
from django_reactor.models import Dispatch, Execution, Interrupt, MapResult, MapRun
from django_reactor.states import ElementStatus, ExecutionStatus
from tests.admin.reactors import Booking

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:django_reactor_execution_changelist")
ELEMENTS = reverse("admin:django_reactor_mapresult_changelist")
BASE = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pages of 5 rows, counted up to 10 rows: two numbered pages, keyset pages beyond."""
    for model in (Execution, MapResult, Interrupt, Dispatch, MapRun):
        model_admin = admin.site._registry[model]
        monkeypatch.setattr(model_admin, "list_per_page", 5)
        monkeypatch.setattr(model_admin, "count_limit", 10)
    return


def runs(count: int, status: str = ExecutionStatus.COMPLETED) -> list[Execution]:
    """``count`` runs created a minute apart, oldest first."""
    rows = Execution.objects.bulk_create(
        Execution(
            reactor=Booking.definition.name,
            definition_hash=Booking.definition.definition_hash,
            status=status,
            inputs={"n": index},
        )
        for index in range(count)
    )
    for minutes, row in enumerate(rows):
        row.created_at = BASE + dt.timedelta(minutes=minutes)
        Execution.objects.filter(pk=row.pk).update(created_at=row.created_at)
    return rows


def shown(html: str) -> list[str]:
    """The short ids of the runs listed, in order."""
    return re.findall(r'<th class="field-run"><a href="[^"]*">([0-9a-f]{8})</a>', html)


def link(html: str, css: str) -> str | None:
    match = re.search(rf'<a class="{css}" href="([^"]*)"', html)
    return match.group(1).replace("&amp;", "&") if match else None


def get(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


def short(row: Execution) -> str:
    return str(row.pk)[:8]


# ---------------------------------------------------------------------------- counts


def test_the_count_says_what_was_counted() -> None:
    assert RowCount(1, exact=True).text("execution", "executions") == "1 execution"
    assert RowCount(523, exact=True).text("execution", "executions") == "523 executions"
    assert RowCount(1000, exact=False).text("run", "runs") == "more than 1,000 runs"
    assert RowCount(1234567, exact=False, estimated=True).text("run", "runs") == (
        "about 1,234,567 runs"
    )


def test_a_short_list_is_counted_exactly_on_one_page(
    client_operator: Client, small_pages: None
) -> None:
    rows = runs(4)
    html = get(client_operator, CHANGELIST)
    assert shown(html) == [short(r) for r in reversed(rows)]
    assert '<span class="reactor-count">4 executions</span>' in html
    assert link(html, "reactor-next") is None
    assert link(html, "reactor-previous") is None


def test_a_long_list_is_counted_up_to_the_limit_with_a_limit_subquery(
    client_operator: Client, small_pages: None
) -> None:
    runs(23)
    with CaptureQueriesContext(connection) as queries:
        html = get(client_operator, f"{CHANGELIST}?status__exact=completed")
    assert "more than 10 executions" in html
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert counts, "the list counts its rows"
    assert all("LIMIT 11" in sql for sql in counts), counts


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the planner's estimate")
def test_an_unfiltered_list_past_the_limit_shows_the_planners_estimate(
    client_operator: Client, small_pages: None
) -> None:
    runs(23)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Execution._meta.db_table}")
    html = get(client_operator, CHANGELIST)
    assert '<span class="reactor-count">about 23 executions</span>' in html


# ---------------------------------------------------------------------------- pages


def test_numbered_pages_then_keyset_pages_walk_every_run_once(
    client_operator: Client, small_pages: None
) -> None:
    rows = runs(23)
    newest_first = [short(r) for r in reversed(rows)]

    first = get(client_operator, CHANGELIST)
    assert shown(first) == newest_first[:5]
    # The numbered pages reach as far as the count: 10 rows, 2 pages of 5.
    assert re.findall(r'<a href="\?p=(\d+)">', first) == ["2"]
    assert link(first, "reactor-previous") is None
    assert link(first, "reactor-next") == "?p=2"

    second = get(client_operator, f"{CHANGELIST}?p=2")
    assert shown(second) == newest_first[5:10]
    assert "older &rsaquo;" in second
    older = link(second, "reactor-next")
    assert older is not None
    assert older.startswith("?after=")

    seen = shown(first) + shown(second)
    url: str | None = older
    keyset_pages = []
    while url is not None:
        with CaptureQueriesContext(connection) as queries:
            html = get(client_operator, f"{CHANGELIST}{url}")
        keyset_pages.append(html)
        assert not [q["sql"] for q in queries if "OFFSET" in q["sql"].upper()]
        assert "a page past the numbered ones" in html
        seen += shown(html)
        url = link(html, "reactor-next")
    assert seen == newest_first
    assert len(keyset_pages) == 3  # rows 11-15, 16-20, 21-23

    # "newer" from the third keyset page goes back one page, and the numbers stay offered.
    last = keyset_pages[-1]
    assert re.findall(r'<a href="\?p=(\d+)">', last) == ["2"]
    newer = link(last, "reactor-previous")
    assert newer is not None
    assert newer.startswith("?before=")
    assert shown(get(client_operator, f"{CHANGELIST}{newer}")) == newest_first[15:20]


def test_filters_and_search_keep_to_their_rows_on_keyset_pages(
    client_operator: Client, small_pages: None
) -> None:
    failed = runs(14, status=ExecutionStatus.FAILED)
    runs(9)
    html = get(client_operator, f"{CHANGELIST}?p=2&status__exact=failed")
    older = link(html, "reactor-next")
    assert older is not None
    assert "status__exact=failed" in older
    assert "after=" in older
    rest = get(client_operator, f"{CHANGELIST}{older}")
    assert shown(rest) == [short(r) for r in reversed(failed)][10:]
    # Filter links on a keyset page start the filtered list again at its first page.
    assert "after=" not in (link(rest, "reactor-next") or "")
    assert not re.search(r'href="[^"]*after=[^"]*status__exact=completed', rest)


def test_each_row_links_to_its_page_keeping_the_lists_filters(client_operator: Client) -> None:
    failed = runs(3, status=ExecutionStatus.FAILED)
    runs(2)
    html = get(client_operator, f"{CHANGELIST}?status__exact=failed")
    hrefs = re.findall(r'<th class="field-run"><a href="([^"]*)">', html)
    assert [h.replace("&amp;", "&") for h in hrefs] == [
        reverse("admin:django_reactor_execution_change", args=[row.pk])
        + "?_changelist_filters=status__exact%3Dfailed"
        for row in reversed(failed)
    ]
    unfiltered = re.findall(
        r'<th class="field-run"><a href="([^"]*)">', get(client_operator, CHANGELIST)
    )
    assert len(unfiltered) == 5
    assert all("?" not in href for href in unfiltered)


def test_a_cursor_the_list_did_not_make_and_a_page_past_the_numbered_ones_are_refused(
    client_operator: Client, small_pages: None
) -> None:
    runs(23)
    for query in ("?after=garbage", "?after=WyJ4Il0", "?before=e30", "?p=3"):
        response = client_operator.get(f"{CHANGELIST}{query}")
        assert response.status_code == 302, query
        assert response["Location"].endswith("?e=1")


def test_only_the_creation_time_sorts_and_a_forged_sort_is_ignored(
    client_operator: Client, small_pages: None
) -> None:
    rows = runs(7)
    html = get(client_operator, CHANGELIST)
    sortable = re.findall(r'<th scope="col" class="sortable column-([a-z_]+)', html)
    assert sortable == ["created"]  # the creation time column
    # Column 3 is the status: not served by an index in this ordering, so not applied.
    assert shown(get(client_operator, f"{CHANGELIST}?o=3")) == [short(r) for r in rows][::-1][:5]
    oldest = get(client_operator, f"{CHANGELIST}?o=6")
    assert shown(oldest) == [short(r) for r in rows][:5]
    assert "newer &rsaquo;" in oldest


def test_the_keyset_follows_the_direction_of_the_sort() -> None:
    keyset = Keyset.of(Execution, ["created_at", "pk"])
    assert keyset is not None
    assert not keyset.descending
    assert [f.name for f in keyset.fields] == ["created_at", "id"]
    assert Keyset.of(Execution, ["-created_at", "pk"]) is None  # mixed directions
    assert Keyset.of(Execution, ["-finished_at", "-pk"]) is None  # nullable
    row = Execution(id=uuid.uuid4(), created_at=BASE)
    assert keyset.decode(keyset.encode(row)) == [BASE, row.id]


# ---------------------------------------------------------------------------- map elements


def big_map(size: int) -> MapRun:
    (run,) = runs(1)
    mapped = MapRun.objects.create(
        execution=run, step="pack", size=size, batch_size=10, chunk_size=5, fan_out=True
    )
    MapResult.objects.bulk_create(
        MapResult(
            map_run=mapped,
            index=index,
            status=ElementStatus.FAILED if index % 4 == 1 else ElementStatus.SUCCEEDED,
            error={"message": "boom"} if index % 4 == 1 else None,
        )
        for index in range(size)
    )
    return mapped


def indexes(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<th class="field-index"><a href="[^"]*">(\d+)</a>', html)]


def test_map_elements_page_by_index_past_the_numbered_pages(
    client_operator: Client, small_pages: None
) -> None:
    mapped = big_map(27)
    of_map = f"{ELEMENTS}?map_run__id__exact={mapped.pk}"
    html = get(client_operator, of_map)
    assert indexes(html) == [0, 1, 2, 3, 4]
    assert "more than 10 map elements" in html
    seen = indexes(html)
    url = link(html, "reactor-next")
    while url is not None:
        with CaptureQueriesContext(connection) as queries:
            html = get(client_operator, f"{ELEMENTS}{url}")
        if "after=" in url:
            assert not [q["sql"] for q in queries if "OFFSET" in q["sql"].upper()]
            # One map: the cursor compares the index alone (a row comparison that starts with
            # the map would make PostgreSQL read the map's elements up to the cursor).
            page_sql = [q["sql"] for q in queries if "LIMIT" in q["sql"] and "index" in q["sql"]]
            assert any('"index" >' in sql for sql in page_sql), page_sql
            row_comparison = '"map_run_id", "django_reactor_mapresult"."index") >'
            assert not any(row_comparison in sql for sql in page_sql)
        seen += indexes(html)
        url = link(html, "reactor-next")
    assert seen == list(range(27))

    failed = get(client_operator, f"{of_map}&status__exact=failed")
    assert indexes(failed) == [1, 5, 9, 13, 17]
    older = link(failed, "reactor-next")
    assert older is not None
    assert indexes(get(client_operator, f"{ELEMENTS}{older}")) == [21, 25]


def test_the_elements_of_every_map_page_by_map_and_index(
    client_operator: Client, small_pages: None
) -> None:
    big_map(7)
    big_map(8)
    html = get(client_operator, ELEMENTS)
    seen = indexes(html)
    url = link(html, "reactor-next")
    while url is not None:
        html = get(client_operator, f"{ELEMENTS}{url}")
        seen += indexes(html)
        url = link(html, "reactor-next")
    # Every element of both maps, once: the cursor compares (map, index) across maps.
    assert sorted(seen) == sorted([*range(7), *range(8)])


def test_the_element_status_filter_is_offered_once_one_map_is_shown(
    client_operator: Client, small_pages: None
) -> None:
    mapped = big_map(3)
    assert "status__exact=failed" not in get(client_operator, ELEMENTS)
    of_map = get(client_operator, f"{ELEMENTS}?map_run__id__exact={mapped.pk}")
    assert "status__exact=failed" in of_map.replace("&amp;", "&")


# ---------------------------------------------------------------------------- other lists


@pytest.mark.parametrize("model", ["interrupt", "dispatch", "maprun"])
def test_every_other_list_pages_by_keyset_too(
    client_operator: Client, small_pages: None, model: str
) -> None:
    rows = runs(13)
    for row in rows:
        Interrupt.objects.create(execution=row, reactor=row.reactor, step="approval")
        Dispatch.objects.create(execution=row, reason=Dispatch.Reason.START)
        MapRun.objects.create(execution=row, step="pack", batch_size=1, chunk_size=1)
    url = reverse(f"admin:django_reactor_{model}_changelist")
    html = get(client_operator, f"{url}?p=2")
    assert "more than 10" in html
    older = link(html, "reactor-next")
    assert older is not None
    assert "after=" in older
    with CaptureQueriesContext(connection) as queries:
        last = get(client_operator, f"{url}{older}")
    assert not [q["sql"] for q in queries if "OFFSET" in q["sql"].upper()]
    assert link(last, "reactor-next") is None
    assert link(last, "reactor-previous") is not None


def test_the_select_all_action_names_the_capped_count(
    client_operator: Client, small_pages: None
) -> None:
    runs(12)
    html = get(client_operator, CHANGELIST)
    assert "Select all matching (more than 10 executions)" in html
    assert "Select all 11" not in html
