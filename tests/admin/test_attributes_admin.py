"""The runs list filtered by business attribute (``?attr=customer_id%3D42``): numbered then keyset
pages off the attribute index, either way of the sort; a run's page shows its attributes."""

from __future__ import annotations

import re
from urllib.parse import quote, urlencode

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_reactor.admin.attributes import parse, text_of
from django_reactor.exceptions import InvalidAttribute
from django_reactor.models import Execution, ExecutionAttribute
from django_reactor.states import ExecutionStatus
from tests.admin.test_paging import CHANGELIST, get, link, runs, short, shown, small_pages
from tests.integration.attribute_reactors import Order

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["small_pages"]  # the fixture, used here by name


def tagged(rows: list[Execution], **attributes: str) -> list[Execution]:
    """Give ``rows`` the attributes (as a run's creation and its steps write them)."""
    ExecutionAttribute.objects.bulk_create(
        ExecutionAttribute(execution=row, key=key, value=value, run_created_at=row.created_at)
        for row in rows
        for key, value in attributes.items()
    )
    return rows


def walk(client: Client, url: str) -> list[str]:
    """Every run a list shows, following its "older" (or "newer") links to the end."""
    seen: list[str] = []
    next_url: str | None = url
    while next_url is not None:
        html = get(client, next_url if next_url.startswith("/") else f"{CHANGELIST}{next_url}")
        seen += shown(html)
        next_url = link(html, "reactor-next")
    return seen


def test_the_list_filtered_by_an_attribute_walks_its_runs_once_either_way(
    client_operator: Client, small_pages: None
) -> None:
    acme = tagged(runs(23), tenant="acme")
    tagged(runs(6), tenant="other")
    newest_first = [short(r) for r in reversed(acme)]

    query = urlencode({"attr": "tenant=acme"})
    first = get(client_operator, f"{CHANGELIST}?{query}")
    assert shown(first) == newest_first[:5]
    assert "more than 10 executions" in first
    assert walk(client_operator, f"{CHANGELIST}?{query}") == newest_first
    # Past the numbered pages, the keyset links carry the filter and go back too.
    second = get(client_operator, f"{CHANGELIST}?{query}&p=2")
    older = link(second, "reactor-next")
    assert older is not None
    assert "after=" in older
    assert "attr=tenant%3Dacme" in older
    third = get(client_operator, f"{CHANGELIST}{older}")
    assert shown(third) == newest_first[10:15]
    newer = link(third, "reactor-previous")
    assert newer is not None
    assert "before=" in newer
    assert shown(get(client_operator, f"{CHANGELIST}{newer}")) == newest_first[5:10]
    # Sorted oldest first (the list's one sort), the same runs the other way round.
    oldest = walk(client_operator, f"{CHANGELIST}?{query}&o=6")
    assert oldest == newest_first[::-1]


def test_several_attributes_and_the_other_filters_narrow_together(client_operator: Client) -> None:
    vip = tagged(runs(2, status=ExecutionStatus.FAILED), tenant="acme", tier="gold")
    tagged(runs(2), tenant="acme", tier="gold")
    tagged(runs(2, status=ExecutionStatus.FAILED), tenant="acme", tier="silver")

    query = urlencode({"attr": "tenant=acme tier=gold", "status__exact": "failed"})
    assert shown(get(client_operator, f"{CHANGELIST}?{query}")) == [short(r) for r in reversed(vip)]
    quoted = tagged(runs(1), tenant="Acme Corp")
    query = urlencode({"attr": 'tenant="Acme Corp"'})
    assert shown(get(client_operator, f"{CHANGELIST}?{query}")) == [short(quoted[0])]


def test_the_filter_box_keeps_the_lists_other_parameters(client_operator: Client) -> None:
    runs(1)
    html = get(client_operator, f"{CHANGELIST}?status__exact=failed&q=abc&attr=tenant%3Dacme")
    form = re.search(r'<form method="get" class="reactor-attribute-filter".*?</form>', html, re.S)
    assert form is not None
    box = form.group(0)
    assert '<input type="hidden" name="status__exact" value="failed">' in box
    assert '<input type="hidden" name="q" value="abc">' in box
    assert 'name="attr" value="tenant=acme"' in box
    assert "attr=" not in re.findall(r'href="([^"]*)">All</a>', box)[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tenant", "an attribute filter is KEY=VALUE (such as customer_id=42), got 'tenant'"),
        ("1st=x", "an attribute key is a letter"),
        ('tenant="acme', "No closing quotation"),
        ("tenant=a tenant=b", "tenant is given twice"),
    ],
)
def test_a_filter_that_is_no_filter_lists_nothing_and_says_why(
    client_operator: Client, text: str, message: str
) -> None:
    tagged(runs(2), tenant="a")
    html = get(client_operator, f"{CHANGELIST}?attr={quote(text)}")
    assert shown(html) == []
    assert message in html.replace("&#x27;", "'").replace("&quot;", '"')
    assert "Type KEY=VALUE, such as customer_id=42." in html


def test_the_filters_text_reads_back_what_it_writes() -> None:
    attributes = {"tenant": "Acme Corp", "note": 'say "hi"', "customer_id": "42"}
    assert parse(text_of(attributes)) == attributes
    with pytest.raises(InvalidAttribute):
        parse("customer_id=")


def test_a_runs_page_shows_its_attributes_each_a_link_to_its_runs(client_operator: Client) -> None:
    outcome = Order.run({"customer_id": 42, "tenant": "Acme Corp"})
    html = get(
        client_operator,
        reverse("admin:django_reactor_execution_change", args=[outcome.execution_id]),
    )
    field = re.search(r"<div class=\"readonly\">(channel = .*?)</div>", html, re.S)
    assert field is not None, html
    assert "tenant = <a href=" in field.group(1)
    assert f"{CHANGELIST}?attr=tenant%3D%27Acme+Corp%27" in field.group(1).replace("&amp;", "&")
    listed = get(client_operator, f"{CHANGELIST}?attr=tenant%3D%27Acme+Corp%27")
    assert shown(listed) == [str(outcome.execution_id)[:8]]


@pytest.mark.postgres
def test_a_page_of_the_filtered_list_is_read_off_the_attribute_index(
    client_operator: Client, small_pages: None
) -> None:
    tagged(runs(12), tenant="acme")
    with CaptureQueriesContext(connection) as queries:
        html = get(client_operator, f"{CHANGELIST}?attr=tenant%3Dacme&p=2")
    assert len(shown(html)) == 5
    pages = [q["sql"] for q in queries if "LIMIT 6" in q["sql"] and "attribute_found" in q["sql"]]
    assert pages, [q["sql"] for q in queries]
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute(f"EXPLAIN {pages[0]}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")
    assert "reactor_attribute_find_idx" in plan, plan
    assert "Sort" not in plan, plan


def test_a_list_narrowed_by_an_attribute_and_another_filter_counts_one_page(
    client_operator: Client, small_pages: None
) -> None:
    failed = tagged(runs(12, status=ExecutionStatus.FAILED), tenant="acme")
    newest_first = [short(r) for r in reversed(failed)]
    # Alone, the attribute counts as far as any filter (10 here: small_pages).
    assert "more than 10 executions" in get(client_operator, f"{CHANGELIST}?attr=tenant%3Dacme")
    query = f"{CHANGELIST}?attr=tenant%3Dacme&status__exact=failed"
    with CaptureQueriesContext(connection) as queries:
        html = get(client_operator, query)
    assert "more than 5 executions" in html
    # Counted by its first page's rows: no count of its own.
    assert not [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert not re.findall(r'<a href="\?[^"]*p=(\d+)[^"]*">', html)  # no numbered page 2
    older = link(html, "reactor-next")
    assert older is not None
    assert "after=" in older
    assert walk(client_operator, query) == newest_first
    short_list = tagged(runs(3, status=ExecutionStatus.HALTED), tenant="acme")
    halted = get(client_operator, f"{CHANGELIST}?attr=tenant%3Dacme&status__exact=halted")
    assert "3 executions" in halted
    assert shown(halted) == [short(r) for r in reversed(short_list)]
