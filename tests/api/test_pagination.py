"""The executions list pages by cursor: no count and no offset over the runs, at any depth."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_reactor.models import Execution
from tests.api.conftest import client_for, user_with
from tests.api.reactors import ApiRefund

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/reactor/executions/"


def test_a_deep_cursor_page_reads_an_index_range_without_count_or_offset() -> None:
    rows = Execution.objects.bulk_create(
        Execution(reactor=ApiRefund.definition.name, definition_hash="x", status="completed")
        for _ in range(9)
    )
    base = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
    for minutes, row in enumerate(rows):
        Execution.objects.filter(pk=row.pk).update(created_at=base + dt.timedelta(minutes=minutes))
    client = client_for(user_with("view_execution"))
    page = client.get(f"{LIST}?page_size=2&status=completed").json()
    seen = [row["id"] for row in page["results"]]
    while page["next"]:
        with CaptureQueriesContext(connection) as queries:
            page = client.get(page["next"]).json()
        seen += [row["id"] for row in page["results"]]
        listed = [q["sql"] for q in queries if 'FROM "django_reactor_execution"' in q["sql"]]
        assert listed
        for sql in listed:
            assert "COUNT(" not in sql.upper()
            assert "OFFSET" not in sql.upper()
            assert '"created_at" <' in sql
            assert 'ORDER BY "django_reactor_execution"."created_at" DESC' in sql
    assert seen == [str(row.pk) for row in reversed(rows)]
