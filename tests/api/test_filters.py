"""The executions list filters through a django-filter FilterSet: wrong values are 400s in the
API's error format, the schema shows every parameter, and each filter stays on an index."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from django_reactor.api.filters import ExecutionFilterSet
from django_reactor.api.views import ExecutionViewSet
from django_reactor.models import Execution, Interrupt
from django_reactor.states import ExecutionStatus
from tests.api.conftest import client_for, user_with

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/reactor/executions/"
FILTERS = ["reactor", "status", "correlation_id", "created_after", "created_before"]


def test_the_list_filters_through_its_filterset() -> None:
    assert ExecutionViewSet.filterset_class is ExecutionFilterSet
    assert list(ExecutionFilterSet.base_filters) == FILTERS


@pytest.mark.parametrize(
    ("query", "parameter", "message"),
    [
        (
            "status=paused,bogus",
            "status",
            "unknown status bogus; one of pending, scheduled, running",
        ),
        ("status=100%25s,%25(x)d", "status", "unknown status %(x)d, 100%s; one of"),
        ("created_after=yesterday", "created_after", "'yesterday' is not an ISO 8601 date"),
        ("created_before=%25d%25s", "created_before", "'%d%s' is not an ISO 8601 date"),
        (
            "created_after=0001-01-01T00:00:00%2B16:00",
            "created_after",
            "earlier than a date can hold",
        ),
        (
            "created_before=9999-12-31T23:59:59-05:00",
            "created_before",
            "the time is 9999-12-31T23:59:59-05:00, later than a date can hold: the latest time "
            "django_reactor accepts is 9999-01-01T00:00:00+00:00; give an earlier one",
        ),
        ("reactor=a%00b", "reactor", "Null characters are not allowed."),
        ("correlation_id=a%00b", "correlation_id", "Null characters are not allowed."),
    ],
)
def test_a_wrong_filter_value_is_a_400_naming_the_parameter(
    operator: APIClient, query: str, parameter: str, message: str
) -> None:
    response = operator.get(f"{LIST}?{query}")
    assert response.status_code == 400, response.content
    body = response.json()
    assert (body["detail"], body["code"]) == ("the request is invalid", "invalid")
    assert list(body["errors"]) == [parameter]
    assert message in body["errors"][parameter][0]


def test_several_wrong_filters_are_reported_together(operator: APIClient) -> None:
    response = operator.get(f"{LIST}?status=nope&created_after=never&created_before=ever")
    assert response.status_code == 400
    assert sorted(response.json()["errors"]) == ["created_after", "created_before", "status"]


def test_empty_filters_filter_nothing(operator: APIClient) -> None:
    # As the schema says (allowEmptyValue: true; tests/api/test_schema.py).
    Execution.objects.create(reactor="tests.ApiRefund", status="completed", definition_hash="x")
    query = "reactor=&status=&correlation_id=&created_after=&created_before="
    assert len(operator.get(f"{LIST}?{query}").json()["results"]) == 1


def test_the_schema_shows_every_filter_with_its_description(anonymous: APIClient) -> None:
    schema = anonymous.get("/api/schema/", {"format": "json"}).json()
    parameters = {p["name"]: p for p in schema["paths"][LIST]["get"]["parameters"]}
    # Besides the filters, the page and the database (routing: REACTOR["DATABASE"]).
    assert set(FILTERS) | {"cursor", "page_size", "database"} == set(parameters)
    assert "REACTOR['DATABASE']" in parameters["database"]["description"]
    for name in FILTERS:
        assert parameters[name]["in"] == "query"
        assert parameters[name]["description"], name
    status = parameters["status"]
    assert (status["style"], status["explode"]) == ("form", False)  # status=paused,failed
    assert status["schema"]["items"]["enum"] == sorted(ExecutionStatus.values)
    for name in ("created_after", "created_before"):
        assert parameters[name]["schema"] == {"type": "string", "format": "date-time"}


def test_the_browsable_api_renders_the_filtered_list() -> None:
    client = client_for(user_with("view_execution"))
    response = client.get(f"{LIST}?status=paused", HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    assert b"<html" in response.content


# ---------------------------------------------------------------------------- index-served


def _list_queries(client: APIClient, query: str) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"{LIST}?{query}")
    assert response.status_code == 200, response.content
    return [q["sql"] for q in queries if 'FROM "django_reactor_execution"' in q["sql"]]


def _plan(sql: str) -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.postgres
@pytest.mark.parametrize(
    "query",
    [
        "",
        "status=paused",
        "status=paused,failed",
        "reactor=tests.ApiRefund",
        "created_after=2024-05-01T00:00:00Z&created_before=2024-06-01T00:00:00Z",
        "correlation_id=refund-7",
        "reactor=tests.ApiRefund&status=completed&created_after=2024-05-01T00:00:00Z",
    ],
)
def test_every_filter_reads_an_index_without_count_or_distinct(query: str) -> None:
    base = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
    rows = Execution.objects.bulk_create(
        Execution(reactor="tests.ApiRefund", status=status, definition_hash="x")
        for status in ("paused", "completed", "failed")
    )
    for minutes, row in enumerate(rows):
        Execution.objects.filter(pk=row.pk).update(created_at=base + dt.timedelta(minutes=minutes))
    Interrupt.objects.create(
        execution=rows[0], reactor="tests.ApiRefund", step="approval", correlation_id="refund-7"
    )
    client = client_for(user_with("view_execution"))
    (sql,) = _list_queries(client, f"page_size=2&{query}")
    assert "COUNT(" not in sql.upper()
    assert "DISTINCT" not in sql.upper()
    assert 'ORDER BY "django_reactor_execution"."created_at" DESC' in sql
    plan = _plan(sql)
    assert "Seq Scan on django_reactor_execution" not in plan, plan
    assert "Index" in plan, plan
