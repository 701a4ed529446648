"""Map steps in the admin: the summary on a run's page, the element list, the parked view."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_reactor.models import MapResult, MapRun
from django_reactor.states import ElementStatus, ExecutionStatus, MapStatus
from django_reactor.testing import run_reactor
from tests.admin.reactors import TRIGGERS, FannedWarehouse, TolerantWarehouse, Warehouse

pytestmark = pytest.mark.django_db(transaction=True)

PARKED = reverse("admin:django_reactor_execution_parked")
ELEMENTS = reverse("admin:django_reactor_mapresult_changelist")
MAPS = reverse("admin:django_reactor_maprun_changelist")


def detail(execution_id: Any) -> str:
    return reverse("admin:django_reactor_execution_change", args=[str(execution_id)])


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


def elements_of(map_id: Any, **more: str) -> str:
    query = "&".join([f"map_run__id__exact={map_id}", *(f"{k}={v}" for k, v in more.items())])
    return f"{ELEMENTS}?{query}"


def map_of(execution_id: Any) -> MapRun:
    return MapRun.objects.get(execution_id=execution_id)


def section(html: str) -> str:
    """The page's Maps section (up to the step graph)."""
    start = html.index('id="reactor-maps"')
    return html[start : html.index('id="reactor-graph"', start)]


# ---------------------------------------------------------------------------- the run's page


def test_a_completed_map_shows_its_counts_a_full_progress_bar_and_the_element_link(
    client_operator: Client,
) -> None:
    outcome = Warehouse.run({"items": [1, 2, 3, 4, 5]})
    assert outcome.status == ExecutionStatus.COMPLETED
    mapped = map_of(outcome.execution_id)

    maps = section(page(client_operator, detail(outcome.execution_id)))

    assert 'data-step="pack" data-status="settled"' in maps
    assert 'class="reactor-progress" role="progressbar"' in maps
    assert 'aria-valuemax="5" aria-valuenow="5"' in maps
    assert "5 of 5 elements settled (100 %)" in maps
    assert 'class="reactor-progress-seg reactor-progress-succeeded" style="width: 100.000%"' in maps
    assert '<td class="reactor-count-succeeded">5</td>' in maps
    assert '<td class="reactor-count-failed">0</td>' in maps
    assert "reactor-count-undone" not in maps  # zero counts beyond the first four are left out
    assert "reactor-map-failures" not in maps
    assert f'href="{elements_of(mapped.pk)}"' in maps.replace("&amp;", "&")
    assert "See the elements (5)" in maps


def test_a_run_without_maps_has_no_map_section(client_operator: Client) -> None:
    from tests.admin.reactors import Booking

    outcome = Booking.run({"guest": "ann", "card": "4111"})

    assert 'id="reactor-maps"' not in page(client_operator, detail(outcome.execution_id))


def test_a_failed_atomic_map_shows_the_failed_element_with_its_traceback(
    client_operator: Client,
) -> None:
    TRIGGERS.add("item-4")
    outcome = Warehouse.run({"items": [1, 2, 3, 4, 5, 6]})
    assert outcome.status == ExecutionStatus.FAILED
    mapped = map_of(outcome.execution_id)
    assert mapped.status == MapStatus.ROLLED_BACK

    maps = section(page(client_operator, detail(outcome.execution_id)))

    failure = re.search(r'<tr data-index="3">(.*?)</tr>', maps, re.S)
    assert failure, maps
    row = failure.group(1)
    assert "<td>3</td>" in row
    assert "RuntimeError" in row
    assert "the label printer jammed on item 4" in row
    assert "<details><summary>Traceback</summary><pre>Traceback (most recent call last):" in row
    assert "in run" in row  # the element step's frame
    # Three packed items were undone, two never started: every element settled.
    assert "6 of 6 elements settled (100 %)" in maps
    assert '<td class="reactor-count-undone">3</td>' in maps
    assert '<td class="reactor-count-not_started">2</td>' in maps
    assert "rollback: 3 of 3 elements undone" in maps
    assert "atomic: the first failure stops it" in maps
    assert "reactor-map-more" not in maps


def test_more_than_25_failures_are_sampled_with_a_note_and_a_link_to_the_rest(
    client_operator: Client,
) -> None:
    TRIGGERS.add("odd")
    outcome = TolerantWarehouse.run({"items": list(range(70))})
    assert outcome.status == ExecutionStatus.COMPLETED
    mapped = map_of(outcome.execution_id)

    maps = section(page(client_operator, detail(outcome.execution_id)))

    assert maps.count("<tr data-index=") == 25
    assert '<tr data-index="1">' in maps
    assert '<tr data-index="49">' in maps
    assert '<tr data-index="51">' not in maps
    assert "Failed elements (first 25 by index)" in maps
    assert "10 more failures are not shown here." in maps
    assert f'href="{elements_of(mapped.pk, status__exact="failed")}"' in maps.replace("&amp;", "&")
    assert '<td class="reactor-count-failed">35</td>' in maps
    assert "tolerates 1000 failed elements" in maps
    assert "width: 50.000%" in maps  # half succeeded, half failed


def test_the_map_section_costs_a_few_queries_per_map_whatever_its_size(
    client_operator: Client, django_assert_max_num_queries: Any
) -> None:
    TRIGGERS.add("odd")
    small = TolerantWarehouse.run({"items": [1, 2, 3]})
    large = TolerantWarehouse.run({"items": list(range(300))})
    from tests.admin.reactors import Booking

    plain = Booking.run({"guest": "ann", "card": "4111"})

    def queries(execution_id: Any) -> int:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as captured:
            page(client_operator, detail(execution_id))
        return len(captured)

    without_maps = queries(plain.execution_id)
    assert queries(small.execution_id) == queries(large.execution_id)
    # The run's maps in one query, then three per map (its row, the counts, the failures).
    with django_assert_max_num_queries(without_maps + 4):
        page(client_operator, detail(large.execution_id))


# ---------------------------------------------------------------------------- the parked view


def test_a_run_parked_on_a_fanned_out_map_shows_its_progress_in_the_parked_view(
    client_operator: Client, django_assert_max_num_queries: Any
) -> None:
    result = run_reactor(FannedWarehouse, {"items": list(range(10))}, background="none")
    assert result.status == ExecutionStatus.PENDING
    assert result._queue.pending  # the element tasks, captured
    mapped = map_of(result.execution_id)
    # Two elements settle (as one worker's claim would), the rest are still pending.
    slots = list(MapResult.objects.filter(map_run=mapped).order_by("index")[:2])
    MapResult.objects.filter(pk__in=[s.pk for s in slots]).update(status=ElementStatus.SUCCEEDED)
    MapRun.objects.filter(pk=mapped.pk).update(settled=2, succeeded=2)

    with django_assert_max_num_queries(12):
        html = page(client_operator, PARKED)

    row = re.search(rf'<tr>\s*<td><a href="{detail(result.execution_id)}">.*?</tr>', html, re.S)
    assert row, html
    assert "map pack: 2 of 10 elements settled" in row.group(0)
    assert "reactor-badge-pending" in row.group(0)
    assert "FannedWarehouse" in row.group(0)

    # Its page shows the same map running, with the progress so far.
    maps = section(page(client_operator, detail(result.execution_id)))
    assert 'data-step="pack" data-status="running"' in maps
    assert "2 of 10 elements settled (20 %)" in maps
    assert '<td class="reactor-count-pending">8</td>' in maps
    assert "on workers, 4 in flight, 2 per task" in maps


def test_the_parked_view_reads_the_maps_of_a_page_in_one_query(
    client_operator: Client,
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            page(client_operator, PARKED)
        return len(captured)

    run_reactor(FannedWarehouse, {"items": [1, 2, 3]}, background="none")
    one = queries()
    for _ in range(3):
        run_reactor(FannedWarehouse, {"items": [1, 2, 3, 4]}, background="none")
    html = page(client_operator, PARKED)
    assert html.count("map pack: 0 of 4 elements settled") == 3
    assert queries() == one


def test_a_run_undoing_a_map_on_workers_is_listed_as_parked_on_its_rollback(
    client_operator: Client,
) -> None:
    from django_reactor import services

    result = run_reactor(FannedWarehouse, {"items": [1, 2, 3]})
    assert result.status == ExecutionStatus.COMPLETED
    with result._queue.capturing():
        handle = services.undo(result.execution_id)
    assert handle.status == ExecutionStatus.ROLLING_BACK

    html = page(client_operator, PARKED)

    assert detail(result.execution_id) in html
    assert "map pack: 0 of 3 elements undone" in html
    assert "reactor-badge-rolling_back" in html


# ---------------------------------------------------------------------------- element list


def _fanned_map(size: int) -> MapRun:
    """A parked map of ``size`` elements whose slots are written ``running`` by hand (nothing
    ran; a settle would write them), to be given outcomes by the test."""
    from django_reactor.models import MapChunk

    result = run_reactor(FannedWarehouse, {"items": list(range(size))}, background="none")
    mapped = map_of(result.execution_id)
    MapResult.objects.bulk_create(
        MapResult(
            map_run=mapped, index=chunk.first + offset, item=item, status="running", attempts=1
        )
        for chunk in MapChunk.objects.filter(map_run=mapped)
        for offset, item in enumerate(chunk.items)
    )
    assert MapResult.objects.filter(map_run=mapped).count() == size
    return mapped


def test_the_element_list_pages_a_map_by_index_with_filters(
    client_operator: Client, django_assert_max_num_queries: Any
) -> None:
    TRIGGERS.add("odd")
    outcome = TolerantWarehouse.run({"items": list(range(250))})
    mapped = map_of(outcome.execution_id)
    other = map_of(Warehouse.run({"items": [7, 8]}).execution_id)

    with django_assert_max_num_queries(10):
        first = page(client_operator, elements_of(mapped.pk))

    indexes = [int(i) for i in re.findall(r'<th class="field-index"><a [^>]*>(\d+)</a>', first)]
    assert indexes == list(range(100))
    assert "reactor-badge-succeeded" in first
    assert "reactor-badge-failed" in first
    assert "the label printer jammed on item 1" in first
    assert "Traceback" not in first  # only the message is listed
    assert "pack of run" in first  # the map filter names the map
    assert "<h1>Elements of map pack</h1>" in first
    header = re.search(r'<p class="reactor-map-of".*?</p>', first, re.S)
    assert header, first
    assert f'<a href="{detail(outcome.execution_id)}">' in header.group(0)
    assert "250 elements" in header.group(0)
    assert "field-map" not in first  # no map column when one map is listed
    assert f"?map_run__id__exact={other.pk}" not in first

    with django_assert_max_num_queries(10):
        third = page(client_operator, elements_of(mapped.pk, p="3"))
    indexes = [int(i) for i in re.findall(r'<th class="field-index"><a [^>]*>(\d+)</a>', third)]
    assert indexes == list(range(200, 250))

    failed = page(client_operator, elements_of(mapped.pk, status__exact="failed"))
    indexes = [int(i) for i in re.findall(r'<th class="field-index"><a [^>]*>(\d+)</a>', failed)]
    assert indexes == list(range(1, 201, 2))

    everything = page(client_operator, ELEMENTS)
    assert "field-map" in everything  # across maps, each row names its map


def test_the_element_list_never_loads_items_or_values(
    client_operator: Client,
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    mapped = _fanned_map(5)
    MapResult.objects.filter(map_run=mapped).update(
        status=ElementStatus.FAILED,
        value={"big": "x" * 100},
        error={"kind": "step", "message": "scanner offline", "traceback": "T" * 5000},
    )

    with CaptureQueriesContext(connection) as captured:
        html = page(client_operator, elements_of(mapped.pk))

    (listing,) = [
        q["sql"] for q in captured if q["sql"].startswith('SELECT "django_reactor_mapresult"."id"')
    ]
    assert '"django_reactor_mapresult"."item"' not in listing
    assert '"django_reactor_mapresult"."value"' not in listing
    assert '"django_reactor_mapresult"."undo"' not in listing
    assert "scanner offline" in html
    assert "TTTT" not in html


def test_an_element_page_is_read_only_and_shows_its_item_and_error(
    client_operator: Client,
) -> None:
    TRIGGERS.add("item-2")
    outcome = Warehouse.run({"items": [1, 2]})
    element = MapResult.objects.get(map_run__execution_id=outcome.execution_id, index=1)
    url = reverse("admin:django_reactor_mapresult_change", args=[element.pk])

    html = page(client_operator, url)

    assert "the label printer jammed on item 2" in html
    assert "Traceback" in html
    assert 'name="_save"' not in html
    assert client_operator.post(url, {}).status_code == 403
    delete = reverse("admin:django_reactor_mapresult_delete", args=[element.pk])
    assert client_operator.get(delete).status_code == 403
    assert client_operator.get(reverse("admin:django_reactor_mapresult_add")).status_code == 403


def test_the_map_list_links_runs_and_elements(client_operator: Client) -> None:
    outcome = Warehouse.run({"items": [1, 2, 3]})
    mapped = map_of(outcome.execution_id)

    html = page(client_operator, MAPS)

    assert detail(outcome.execution_id) in html
    assert elements_of(mapped.pk) in html
    assert "reactor-badge-settled" in html
    one = page(client_operator, reverse("admin:django_reactor_maprun_change", args=[mapped.pk]))
    assert "Shared arguments" in one
    assert 'name="_save"' not in one
    found = page(client_operator, f"{MAPS}?q={outcome.execution_id}")
    assert detail(outcome.execution_id) in found
    assert detail(outcome.execution_id) not in page(client_operator, f"{MAPS}?q=nonsense")


# ---------------------------------------------------------------------------- permissions


def test_staff_without_the_view_permissions_get_403(client: Client, db: None) -> None:
    outcome = Warehouse.run({"items": [1]})
    mapped = map_of(outcome.execution_id)
    client.force_login(User.objects.create_user("staff", is_staff=True))

    assert client.get(elements_of(mapped.pk)).status_code == 403
    assert client.get(MAPS).status_code == 403
    assert client.get(PARKED).status_code == 403


def test_a_viewer_of_runs_sees_the_summary_but_no_element_link_without_that_permission(
    client_viewer: Client, viewer: User
) -> None:
    outcome = Warehouse.run({"items": [1, 2]})
    mapped = map_of(outcome.execution_id)

    maps = section(page(client_viewer, detail(outcome.execution_id)))
    assert "2 of 2 elements settled" in maps
    assert "reactor-map-elements" not in maps
    assert client_viewer.get(elements_of(mapped.pk)).status_code == 403

    viewer.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_reactor", codename="view_mapresult")
    )
    maps = section(page(client_viewer, detail(outcome.execution_id)))
    assert "reactor-map-elements" in maps
    assert "1" in page(client_viewer, elements_of(mapped.pk))


def test_an_element_that_never_started_shows_no_attempts_and_no_finish_time(
    client_operator: Client,
) -> None:
    TRIGGERS.add("item-2")
    outcome = Warehouse.run({"items": [1, 2, 3, 4]})
    mapped = map_of(outcome.execution_id)
    never = MapResult.objects.get(map_run=mapped, index=3)
    assert never.status == ElementStatus.NOT_STARTED
    # What the store keeps: its chunk's claims and when the map stopped; neither is the
    # element's.
    assert never.attempts >= 1
    assert never.finished_at is not None

    listing = page(client_operator, elements_of(mapped.pk))
    row = re.search(r"<tr>(?:(?!</tr>).)*?Not started.*?</tr>", listing, re.S)
    assert row, listing
    assert '<td class="field-element_attempts">-</td>' in row.group(0)
    assert '<td class="field-element_finished_at">-</td>' in row.group(0)
    failed = re.search(r"<tr>(?:(?!</tr>).)*?>Failed<.*?</tr>", listing, re.S)
    assert failed
    assert '<td class="field-element_attempts">1</td>' in failed.group(0)
    assert 'class="reactor-moment"' in failed.group(0)

    one = page(client_operator, reverse("admin:django_reactor_mapresult_change", args=[never.pk]))
    for field in ("element_attempts", "element_finished_at"):
        shown = re.search(rf'field-{field}.*?<div class="readonly">(.*?)</div>', one, re.S)
        assert shown, field
        assert shown.group(1).strip() == "-", (field, shown.group(1))
