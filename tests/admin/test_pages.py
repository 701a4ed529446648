"""The execution changelist, detail pages for every status, and the parked view."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_reactor import services
from django_reactor.models import Execution, ExecutionEvent, Interrupt
from django_reactor.states import EventKind, ExecutionStatus, InterruptStatus
from tests.admin.reactors import TRIGGERS, Booking, Refund, Shipment
from tests.shapes import keep_shape

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:django_reactor_execution_changelist")
PARKED = reverse("admin:django_reactor_execution_parked")


def detail(execution_id: Any) -> str:
    return reverse("admin:django_reactor_execution_change", args=[str(execution_id)])


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


def make_row(status: str, **fields: Any) -> Execution:
    """A run as the engine would have stored it, without running step code."""
    keep_shape(Booking.definition)
    return Execution.objects.create(
        reactor=Booking.definition.name,
        definition_hash=Booking.definition.definition_hash,
        status=status,
        inputs={"guest": "ann", "card": "4111"},
        secret_paths=[["card"]],
        **fields,
    )


# ---------------------------------------------------------------------------- changelist


def test_the_changelist_shows_runs_with_their_status_and_correlation_id(
    client_operator: Client,
) -> None:
    done = Booking.run({"guest": "ann", "card": "4111"})
    paused = Refund.run({"order": "A7"})

    html = page(client_operator, CHANGELIST)

    assert str(done.execution_id)[:8] in html
    assert 'title="tests.admin.reactors.Booking"' in html
    assert "reactor-badge-completed" in html
    assert "reactor-badge-paused" in html
    assert "refund-A7" in html
    assert PARKED in html  # the object-tools link
    assert str(paused.execution_id)[:8] in html


def test_search_matches_an_id_an_idempotency_key_and_a_correlation_id(
    client_operator: Client,
) -> None:
    keyed = Booking.run({"guest": "bob", "card": "1"}, idempotency_key="order-42")
    paused = Refund.run({"order": "B9"})
    other = Booking.run({"guest": "eve", "card": "2"})

    def found(term: str) -> set[str]:
        html = page(client_operator, f"{CHANGELIST}?q={term}")
        return {
            str(i)[:8]
            for i in (keyed.execution_id, paused.execution_id, other.execution_id)
            if f">{str(i)[:8]}<" in html
        }

    assert found(str(keyed.execution_id)) == {str(keyed.execution_id)[:8]}
    assert found("order-42") == {str(keyed.execution_id)[:8]}
    assert found("refund-B9") == {str(paused.execution_id)[:8]}
    assert found(str(uuid.uuid4())) == set()


def _changelist_queries(client: Client) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(CHANGELIST)
    assert response.status_code == 200
    return len(queries)


def _rows(count: int, start: int = 0) -> None:
    for index in range(start, start + count):
        row = make_row(ExecutionStatus.PAUSED if index % 2 else ExecutionStatus.COMPLETED)
        if index % 2:
            Interrupt.objects.create(
                execution=row,
                reactor=row.reactor,
                step="approval",
                correlation_id=f"corr-{index}",
            )


def test_the_changelist_runs_a_constant_number_of_queries(client_operator: Client) -> None:
    _rows(5)
    few = _changelist_queries(client_operator)
    _rows(45, start=5)
    many = _changelist_queries(client_operator)
    assert few == many
    assert many <= 12


# ---------------------------------------------------------------------------- detail pages


def test_a_completed_run_shows_graph_steps_trace_and_redacted_inputs(
    client_operator: Client,
) -> None:
    outcome = Booking.run({"guest": "ann", "card": "4111-secret"})

    html = page(client_operator, detail(outcome.execution_id))

    assert '<div class="reactor-graph-box"><svg' in html
    assert 'data-step="charge" data-state="completed"' in html
    assert "4111-secret" not in html
    assert "[REDACTED]" in html
    assert 'id="reactor-trace"' in html
    assert "Run completed" in html
    # Retry is for failed runs; undo is offered for a completed one.
    assert 'class="reactor-action-undo"' in html
    assert 'class="reactor-action-retry"' not in html


def test_a_failed_run_shows_its_failure_and_the_failed_step(client_operator: Client) -> None:
    TRIGGERS.add("charge")
    outcome = Booking.run({"guest": "ann", "card": "4111"})
    assert outcome.status == ExecutionStatus.FAILED

    html = page(client_operator, detail(outcome.execution_id))

    assert 'data-step="charge" data-state="failed"' in html
    assert 'id="reactor-failure"' in html
    assert "RuntimeError" in html
    assert "Traceback" in html
    # The exception text is escaped, never markup.
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;" in html
    assert "reactor-ev-fail" in html
    assert 'class="reactor-action-retry"' in html


def test_a_halted_run(client_operator: Client) -> None:
    TRIGGERS.add("halt")
    outcome = Booking.run({"guest": "ann", "card": "4111"})
    assert outcome.status == ExecutionStatus.HALTED

    html = page(client_operator, detail(outcome.execution_id))

    assert "reactor-badge-halted" in html
    assert 'data-step="charge" data-state="halted"' in html


def test_a_paused_run_offers_resume(client_operator: Client) -> None:
    outcome = Refund.run({"order": "C1"})

    html = page(client_operator, detail(outcome.execution_id))

    resume = reverse(
        "admin:django_reactor_execution_resume", args=[str(outcome.execution_id), "approval"]
    )
    assert resume in html
    assert 'data-step="approval" data-state="waiting"' in html
    assert "refund-C1" in html
    assert 'class="reactor-action-cancel"' in html


def test_a_cancelled_run(client_operator: Client) -> None:
    outcome = Refund.run({"order": "C2"})
    services.cancel(outcome.execution_id, reason="customer called")

    html = page(client_operator, detail(outcome.execution_id))

    assert "reactor-badge-cancelled" in html
    assert "customer called" in html


def test_a_run_that_needs_attention_shows_its_rollback_failures(client_operator: Client) -> None:
    TRIGGERS.update({"charge", "undo-fails"})
    outcome = Booking.run({"guest": "ann", "card": "4111"})
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION

    html = page(client_operator, detail(outcome.execution_id))

    assert "reactor-badge-needs_attention" in html
    assert "Rollback failures" in html
    assert "the refund service is down" in html
    assert 'class="reactor-action-undo"' in html


def test_a_running_run(client_operator: Client) -> None:
    row = make_row(
        ExecutionStatus.RUNNING,
        current_step="charge",
        lease_owner="worker-1",
        lease_expires_at=timezone.now() + dt.timedelta(minutes=1),
    )

    html = page(client_operator, detail(row.id))

    assert "reactor-badge-running" in html
    assert 'data-step="charge" data-state="running"' in html
    assert "No step has recorded an outcome yet." in html


def test_a_run_of_an_unknown_reactor_falls_back_to_the_step_table(
    client_operator: Client,
) -> None:
    outcome = Booking.run({"guest": "ann", "card": "4111"})
    Execution.objects.filter(pk=outcome.execution_id).update(reactor="gone.Reactor")

    html = page(client_operator, detail(outcome.execution_id))

    assert 'class="reactor-graph-box"' not in html
    assert "No graph:" in html
    assert 'id="reactor-steps"' in html


def test_a_composed_run_links_parent_and_children(client_operator: Client) -> None:
    outcome = Shipment.run({})
    assert outcome.ok
    child = services.find(outcome.execution_id).child("ship")

    parent_html = page(client_operator, detail(outcome.execution_id))
    child_html = page(client_operator, detail(child.id))

    assert f'class="reactor-child" href="{detail(child.id)}"' in parent_html
    assert f'class="reactor-parent" href="{detail(outcome.execution_id)}"' in child_html
    # A composed child is steered through its parent: no buttons of its own.
    assert 'id="reactor-actions"' not in child_html


def test_a_retried_run_links_both_ways(client_operator: Client) -> None:
    TRIGGERS.add("charge")
    failed = Booking.run({"guest": "ann", "card": "4111"})
    TRIGGERS.clear()
    retried = services.retry(failed.execution_id)

    assert f'class="reactor-retried-as" href="{detail(retried.execution_id)}"' in page(
        client_operator, detail(failed.execution_id)
    )
    assert f'class="reactor-retry-of" href="{detail(failed.execution_id)}"' in page(
        client_operator, detail(retried.execution_id)
    )


# ---------------------------------------------------------------------------- parked


def test_the_parked_view_lists_paused_and_parked_runs(client_operator: Client) -> None:
    paused = Refund.run({"order": "P1"})
    parked = make_row(
        ExecutionStatus.PENDING,
        current_step="charge",
        wake_at=timezone.now() + dt.timedelta(minutes=1),  # every park stores a wake-up
    )
    ExecutionEvent.objects.create(
        execution=parked,
        seq=1,
        kind=EventKind.PARK,
        step="charge",
        at=timezone.now(),
        data={"waiting_for": "charge.unit"},
    )
    waking = make_row(
        ExecutionStatus.PENDING,
        current_step="confirm",
        wake_at=timezone.now() + dt.timedelta(minutes=5),
    )
    make_row(ExecutionStatus.PENDING)  # not started yet: not parked

    with CaptureQueriesContext(connection) as queries:
        html = page(client_operator, PARKED)

    assert detail(paused.execution_id) in html
    assert "refund-P1" in html
    assert "0 / 2" in html
    assert detail(parked.id) in html
    assert "async unit charge.unit" in html
    assert detail(waking.id) in html
    assert html.count('href="/admin/django_reactor/execution/') >= 3
    assert Interrupt.objects.filter(status=InterruptStatus.WAITING).count() == 1
    assert len(queries) <= 12


@pytest.mark.postgres
def test_the_parked_view_reads_its_runs_through_the_wake_up_index(client_operator: Client) -> None:
    for status in (ExecutionStatus.PENDING, ExecutionStatus.ROLLING_BACK):
        make_row(status, wake_at=timezone.now() + dt.timedelta(minutes=5))
    with CaptureQueriesContext(connection) as queries:
        page(client_operator, PARKED)
    [runs] = [
        q["sql"]
        for q in queries.captured_queries
        if "wake_at" in q["sql"] and "ORDER BY" in q["sql"] and "COUNT" not in q["sql"]
    ]
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + runs)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("ROLLBACK")
    assert "reactor_exec_wake_idx" in plan, plan


def test_the_parked_view_needs_the_view_permission(client: Client, db: None) -> None:
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("staff", is_staff=True))
    assert client.get(PARKED).status_code == 403
    assert client.get(CHANGELIST).status_code == 403


def test_runs_are_read_only_even_for_a_superuser(client_operator: Client) -> None:
    outcome = Booking.run({"guest": "ann", "card": "4111"})

    html = page(client_operator, detail(outcome.execution_id))

    assert 'name="_save"' not in html
    assert client_operator.post(detail(outcome.execution_id), {}).status_code == 403
    add = reverse("admin:django_reactor_execution_add")
    assert client_operator.get(add).status_code == 403
    delete = reverse("admin:django_reactor_execution_delete", args=[str(outcome.execution_id)])
    assert client_operator.get(delete).status_code == 403
    assert status_of(outcome.execution_id) == ExecutionStatus.COMPLETED


def status_of(execution_id: Any) -> str:
    return Execution.objects.get(pk=execution_id).status


def test_the_interrupt_and_dispatch_tables_are_listed_read_only(client_operator: Client) -> None:
    paused = Refund.run({"order": "T1"})

    interrupts = page(client_operator, reverse("admin:django_reactor_interrupt_changelist"))
    dispatches = page(client_operator, reverse("admin:django_reactor_dispatch_changelist"))

    assert "refund-T1" in interrupts
    assert detail(paused.execution_id) in interrupts
    assert "reactor-badge-waiting" in interrupts
    assert "token_hash" not in page(
        client_operator,
        reverse(
            "admin:django_reactor_interrupt_change",
            args=[Interrupt.objects.get(execution_id=paused.execution_id).pk],
        ),
    )
    assert "Select dispatch to view" in dispatches


def test_the_page_of_a_run_still_moving_reads_it_again_and_a_finished_one_does_not(
    client_operator: Client,
) -> None:
    done = Booking.run({"guest": "ann", "card": "4111"}).execution_id
    paused = Refund.run({"order": "R5"}).execution_id
    moving = Booking.run({"guest": "bob", "card": "4111"}).execution_id
    Execution.objects.filter(pk=moving).update(status=ExecutionStatus.PENDING)

    html = page(client_operator, detail(moving))
    assert 'id="reactor-refresh" class="reactor-muted" data-seconds="5"' in html
    assert "window.location.reload()" in html
    for still in (done, paused):  # finished, or waiting for a person: nothing to follow
        assert 'id="reactor-refresh"' not in page(client_operator, detail(still))
