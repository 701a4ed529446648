"""A new run's one statement on PostgreSQL (``store.sql.insert_all``): empty columns written as
literals, every value stored as the ORM would store it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_reactor import Reactor, step, store
from django_reactor.models import Execution
from django_reactor.store import sql
from tests.integration.reactors import Tracked

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's one statement"),
]


class Plain(Reactor):
    one = step(Tracked)

    class Meta:
        background = "all"


class Routed(Reactor):
    one = step(Tracked)

    class Meta:
        background = "all"
        queue = "payments"
        priority = 8


@pytest.fixture
def inserts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Any]]]:
    """The insert statements sent and their parameters."""
    sent: list[tuple[str, list[Any]]] = []
    execute = sql.execute

    def recorded(statement: str, params: Any, connection: Any = None) -> Any:
        if statement.startswith("WITH ") and "INSERT INTO" in statement:
            sent.append((statement, list(params)))
        return execute(statement, params, connection)

    monkeypatch.setattr(sql, "execute", recorded)
    return sent


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (None, "NULL"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        ("", "''"),
        (5, None),
        ("0", None),
        ("x", None),
        (dt.datetime(2026, 1, 1, tzinfo=dt.UTC), None),
    ],
)
def test_only_empty_values_are_written_as_literals(value: Any, written: str | None) -> None:
    assert sql.literal(value) == written


def test_a_plain_run_keeps_under_psycopgs_fifty_parameters(
    inserts: list[tuple[str, list[Any]]],
) -> None:
    Plain.run({})
    (statement, params), *_ = inserts
    assert len(params) <= 50  # above, psycopg parses the statement's text for every run
    assert statement.count("%s") == len(params)
    assert "NULL" in statement


def test_values_written_as_literals_or_parameters_are_stored_alike(
    inserts: list[tuple[str, list[Any]]],
) -> None:
    deadline = timezone.now() + dt.timedelta(hours=1)
    plain = Plain.run({}).execution_id
    busy = Routed.run({"amount": 5}, idempotency_key="key-7", deadline=deadline).execution_id
    assert len(inserts) == 2
    assert inserts[0][0] != inserts[1][0]  # other columns empty: another statement
    row = Execution.objects.get(pk=plain)
    assert (row.queue, row.priority, row.correlation_id, row.idempotency_key) == ("", 5, None, None)
    assert (row.parent_id, row.detached, row.generation, row.fence) == (None, False, 0, 0)
    assert (row.result, row.failure, row.deadline_at, row.handed_off) == (None, None, None, True)
    other = Execution.objects.get(pk=busy)
    assert (other.queue, other.priority) == ("payments", 8)
    assert other.idempotency_key == "key-7"
    assert other.deadline_at == deadline
    assert store.get_row(busy).inputs == other.inputs
