"""Forking from the admin: the fork page's plan, its confirmation, the permission."""

from __future__ import annotations

import pytest
from django.test import Client

from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.admin.reactors import TRIGGERS, Booking
from tests.admin.test_actions import log_messages, status, texts, url

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_failed_run_is_forked_from_its_page(client_operator: Client) -> None:
    TRIGGERS.add("charge")
    original = Booking.run({"guest": "ann", "card": "4111"}).execution_id
    TRIGGERS.discard("charge")
    page = client_operator.get(url("change", original)).content.decode()
    assert url("fork", original) in page

    plan = client_operator.get(url("fork", original)).content.decode()
    # The failed step is offered first; the steps before it that stand are carried.
    assert '<option value="charge" selected>' in plan
    assert 'id="reactor-fork-plan"' in plan
    assert "Yes, fork it" in plan
    unknown = client_operator.get(url("fork", original) + "?step=nope").content.decode()
    assert 'id="reactor-fork-problem"' in unknown
    assert "has no step &#x27;nope&#x27; to fork from" in unknown

    response = client_operator.post(url("fork", original), {"step": "charge"})
    fork = Execution.objects.get(retry_of=original)
    assert response["Location"] == url("change", fork.pk)
    assert fork.fork_step == "charge"
    assert fork.status == ExecutionStatus.COMPLETED
    assert texts(response) == [f"Forked from charge as {fork.pk}: completed"]
    # Re-run once: the button is gone.
    assert (
        url("fork", original) not in client_operator.get(url("change", original)).content.decode()
    )


def test_a_completed_run_forked_from_its_first_step_shows_the_undo_first(
    client_operator: Client,
) -> None:
    original = Booking.run({"guest": "ann", "card": "4111"}).execution_id
    plan = client_operator.get(url("fork", original) + "?step=reserve").content.decode()
    assert 'id="reactor-fork-undo"' in plan
    assert "Yes, undo 3 steps and fork" in plan
    response = client_operator.post(
        url("fork", original), {"step": "reserve", "undo_abandoned": "yes"}
    )
    assert response.status_code == 302
    assert status(original) == ExecutionStatus.CANCELLED
    assert log_messages(original)[-1].startswith("Forked from reserve as ")


def test_a_viewer_cannot_fork(client_viewer: Client) -> None:
    original = Booking.run({"guest": "ann", "card": "4111"}).execution_id
    assert client_viewer.get(url("fork", original)).status_code == 403
    assert client_viewer.post(url("fork", original), {"step": "reserve"}).status_code == 403
