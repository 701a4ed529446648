"""``GET /executions/?attr.<key>=<value>``: runs found by their business attributes, newest first,
paged by cursor off the attribute index; a wrong filter is a 400 naming its parameter; a run's
detail shows its attributes."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from tests.integration.attribute_reactors import Order

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/reactor/executions/"


def ids(client: APIClient, query: dict[str, Any] | str) -> list[str]:
    text = query if isinstance(query, str) else urlencode(query)
    response = client.get(f"{LIST}?{text}")
    assert response.status_code == 200, response.content
    return [run["id"] for run in response.json()["results"]]


def orders(count: int, **inputs: Any) -> list[str]:
    """``count`` runs of Order, oldest first, as the API shows their ids."""
    return [str(Order.run({"customer_id": 1, **inputs}).execution_id) for _ in range(count)]


def test_runs_are_found_by_an_attribute_newest_first(operator: APIClient) -> None:
    acme = orders(3, tenant="acme", customer_id=42)
    other = orders(2, tenant="other", priority=True)

    assert ids(operator, {"attr.tenant": "acme"}) == acme[::-1]
    assert ids(operator, {"attr.customer_id": "42"}) == acme[::-1]
    assert ids(operator, {"attr.tenant": "other", "attr.priority": "true"}) == other[::-1]
    assert ids(operator, {"attr.tenant": "acme", "attr.priority": "true"}) == []
    assert ids(operator, {"attr.tenant": "nobody"}) == []
    # With the list's own filters, and an empty attribute filter filters nothing.
    assert ids(operator, {"attr.tenant": "acme", "status": "completed"}) == acme[::-1]
    assert ids(operator, {"attr.tenant": "acme", "status": "failed"}) == []
    assert ids(operator, {"attr.tenant": "", "status": "completed"}) == [*acme, *other][::-1]
    # Other parameters are not attribute filters.
    assert ids(operator, {"attribute.tenant": "acme"}) == [*acme, *other][::-1]


def test_a_narrowed_list_pages_by_cursor_both_ways(operator: APIClient) -> None:
    acme = orders(5, tenant="acme")
    orders(2, tenant="other")

    seen: list[str] = []
    url: str | None = f"{LIST}?attr.tenant=acme&page_size=2"
    pages = []
    while url is not None:
        body = operator.get(url).json()
        pages.append(body)
        seen += [run["id"] for run in body["results"]]
        url = body["next"]
    assert seen == acme[::-1]
    assert len(pages) == 3
    back = operator.get(pages[-1]["previous"]).json()
    assert [run["id"] for run in back["results"]] == acme[::-1][2:4]


@pytest.mark.parametrize(
    ("query", "parameter", "message"),
    [
        ("attr.bad%20key=1", "attr.bad key", "an attribute key is a letter"),
        ("attr.=1", "attr.", "an attribute key is a letter"),
        ("attr.1st=1", "attr.1st", "got '1st'"),
        ("attr.tenant=a%00b", "attr.tenant", "cannot hold NUL"),
        ("attr.tenant=" + "t" * 256, "attr.tenant", "at most 255 characters, got 256"),
        ("attr.tenant=a&attr.tenant=b", "attr.tenant", "one value per attribute"),
        ("attr.tenant=%25(x)s", "attr.none%25s=1", ""),
    ],
)
def test_a_wrong_attribute_filter_is_a_400_naming_the_parameter(
    operator: APIClient, query: str, parameter: str, message: str
) -> None:
    if not message:  # a value with % is looked for as typed, a key with % is refused
        orders(1, tenant="%(x)s")
        assert len(ids(operator, query)) == 1
        response = operator.get(f"{LIST}?{parameter}")
        assert response.status_code == 400
        assert list(response.json()["errors"]) == ["attr.none%s"]
        return
    response = operator.get(f"{LIST}?{query}")
    assert response.status_code == 400, response.content
    body = response.json()
    assert (body["detail"], body["code"]) == ("the request is invalid", "invalid")
    assert list(body["errors"]) == [parameter]
    assert message in body["errors"][parameter][0]


def test_a_runs_detail_shows_its_attributes(operator: APIClient) -> None:
    (run,) = orders(1, tenant="acme", customer_id=42)
    body = operator.get(f"{LIST}{run}/").json()
    assert body["attributes"] == {
        "channel": "web",
        "customer_id": "42",
        "payment_id": "pay-1",
        "priority": "false",
        "stage": "shipped",
        "tenant": "acme",
    }


def test_the_schema_says_how_to_filter_by_attribute(anonymous: APIClient) -> None:
    schema = anonymous.get("/api/schema/", {"format": "json"}).json()
    assert "attr.<key>=<value>" in schema["paths"][LIST]["get"]["description"]
    detail = schema["components"]["schemas"]["ExecutionDetail"]["properties"]["attributes"]
    assert detail["additionalProperties"] == {"type": "string"}


@pytest.mark.postgres
def test_a_page_of_a_narrowed_list_is_read_off_the_attribute_index(operator: APIClient) -> None:
    orders(3, tenant="acme")
    with CaptureQueriesContext(connection) as queries:
        assert len(ids(operator, "attr.tenant=acme&page_size=2&status=completed")) == 2
    (sql,) = [q["sql"] for q in queries if 'FROM "django_reactor_execution"' in q["sql"]]
    assert "COUNT(" not in sql.upper()
    assert '"run_created_at" AS "attribute_created_at"' in sql
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "reactor_attribute_find_idx" in plan, plan
    assert "Sort" not in plan, plan


def test_creation_time_bounds_a_narrowed_list_on_the_attribute_index(operator: APIClient) -> None:
    from django_reactor.models import Execution, ExecutionAttribute

    acme = orders(4, tenant="acme")
    base = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
    for days, run in enumerate(acme):  # a day apart, oldest first
        moved = base + dt.timedelta(days=days)
        Execution.objects.filter(pk=run).update(created_at=moved)
        ExecutionAttribute.objects.filter(execution_id=run).update(run_created_at=moved)
    query = {
        "attr.tenant": "acme",
        "created_after": "2024-05-02T00:00:00Z",
        "created_before": "2024-05-04T00:00:00Z",
    }
    with CaptureQueriesContext(connection) as queries:
        assert ids(operator, query) == [acme[2], acme[1]]
    (sql,) = [q["sql"] for q in queries if 'FROM "django_reactor_execution"' in q["sql"]]
    assert 'attribute_found."run_created_at" >=' in sql
    assert 'attribute_found."run_created_at" <' in sql
    assert '"django_reactor_execution"."created_at" >=' not in sql


def test_a_start_whose_inputs_give_an_attribute_no_value_can_be_is_a_400(settings: Any) -> None:
    import json

    from django_reactor.models import Execution
    from tests.api.conftest import client_for, user_with

    name = Order.definition.name
    settings.REACTOR = {**settings.REACTOR, "START_AUTH": {"default": [], name: ["user"]}}
    starter = client_for(user_with("start_execution", "view_execution"))
    answer = starter.post(
        f"/reactor/reactors/{name}/runs/",
        json.dumps({"customer_id": 1, "tenant": "t" * 300}),
        content_type="application/json",
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "invalid_attribute"
    assert (
        "Order.Meta.attributes['tenant']: an attribute value is at most 255"
        in (answer.json()["detail"])
    )
    assert not Execution.objects.exists()
