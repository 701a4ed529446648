"""The runs' and interrupts' reactor filter lists every reactor that has rows in the database,
loaded in this process or not, read one index seek per reactor (never every run)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_reactor import registry
from django_reactor.models import Execution, Interrupt
from django_reactor.store import dialects
from tests.admin.reactors import Booking

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = reverse("admin:django_reactor_execution_changelist")
INTERRUPTS = reverse("admin:django_reactor_interrupt_changelist")
GONE = "billing.reactors.SettleLegacyInvoices"  # runs of it, no code of it in this process


def run_of(reactor: str, **fields: Any) -> Execution:
    return Execution.objects.create(reactor=reactor, definition_hash="x", **fields)


def offered(html: str) -> dict[str, str]:
    """The reactor filter's choices: value -> label."""
    sidebar = html.split('id="changelist-filter"')[1]
    block = sidebar.split("By reactor")[1].split("</ul>")[0]
    return {
        value: label.strip()
        for value, label in re.findall(r'href="\?reactor=([^"&]+)"[^>]*>([^<]*)</a>', block)
    }


def test_a_reactor_with_runs_is_offered_even_if_not_loaded_here(client_operator: Client) -> None:
    assert GONE not in registry.all_reactors()
    gone = run_of(GONE)
    Booking.run({"guest": "ann", "card": "4111"})

    choices = offered(client_operator.get(RUNS).content.decode())

    assert choices[GONE] == "SettleLegacyInvoices"
    assert choices[Booking.definition.name] == "Booking"
    listed = client_operator.get(RUNS, {"reactor": GONE}).content.decode()
    assert str(gone.pk)[:8] in listed
    assert "Booking" not in listed.split('id="result_list"')[1].split("</table>")[0]


def test_the_interrupts_filter_offers_the_reactors_of_its_rows(client_operator: Client) -> None:
    row = run_of(GONE, status="paused")
    Interrupt.objects.create(execution=row, reactor=GONE, step="approval", status="waiting")

    choices = offered(client_operator.get(INTERRUPTS).content.decode())
    assert choices[GONE] == "SettleLegacyInvoices"


def test_two_reactors_of_one_short_name_are_told_apart(client_operator: Client) -> None:
    run_of("shop.reactors.Refund")
    run_of("billing.reactors.Refund")
    choices = offered(client_operator.get(RUNS).content.decode())
    assert choices["shop.reactors.Refund"] == "shop.reactors.Refund"
    assert choices["billing.reactors.Refund"] == "billing.reactors.Refund"


@pytest.mark.parametrize("dialect", ["postgresql", "generic"])
def test_the_names_are_read_one_seek_a_reactor(dialect: str) -> None:
    for n in range(3):
        for _ in range(4):
            run_of(f"app.reactors.R{n}")
    chosen = (
        dialects.dialect_for(connection.alias)
        if dialect == "postgresql"
        else dialects.generic(connection.alias)
    )
    if dialect == "postgresql" and chosen.name != "postgresql":
        pytest.skip("needs PostgreSQL")

    with CaptureQueriesContext(connection) as captured:
        names = chosen.distinct_values(Execution, "reactor", 500)
    assert names == ["app.reactors.R0", "app.reactors.R1", "app.reactors.R2"]
    if dialect == "postgresql":
        assert len(captured) == 1  # one statement, whatever the number of reactors
    else:
        assert len(captured) == 4  # a query a name, and one that finds no more
        assert all("LIMIT 1" in q["sql"] for q in captured)
    assert chosen.distinct_values(Execution, "reactor", 2) == names[:2]


@pytest.mark.postgres
def test_postgresql_reads_the_names_through_the_reactor_index_not_the_table() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    for n in range(3):
        run_of(f"app.reactors.R{n}")
    with CaptureQueriesContext(connection) as captured:
        dialects.dialect_for(connection.alias).distinct_values(Execution, "reactor", 500)
    (query,) = captured
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        # The plan the planner would take at any size: a table scan is not on offer.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + query["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("ROLLBACK")
    assert "reactor_exec_by_reactor_idx" in plan, plan
    assert "Seq Scan" not in plan, plan
    assert "Recursive Union" in plan, plan
