"""Pausing and unpausing a run over the API."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from django_reactor import services
from django_reactor.models import Execution, Pause
from django_reactor.states import ExecutionStatus
from tests.api.conftest import ALL_PERMISSIONS, client_for, user_with
from tests.api.test_executions import action, completed_run, detail, paused_run
from tests.integration.reactors import ledger

pytestmark = pytest.mark.django_db


def test_a_run_paused_at_an_interrupt_is_paused_once_it_moves_and_unpaused(
    operator: APIClient,
) -> None:
    run = paused_run()
    response = operator.post(action(run, "pause"), {"reason": "fraud review"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    # It waits at its interrupt (it holds nothing); the pause holds it once it moves.
    assert body["status"] == ExecutionStatus.PAUSED
    assert body["pause"]["reason"] == "fraud review"
    assert body["pause"]["by"].startswith("user-view_execution-")
    assert body["pause"]["reactor_paused"] is False
    outcome = services.resume_interrupt(run, step="approval", payload={"approved": True})
    assert outcome.status == ExecutionStatus.SUSPENDED
    assert operator.get(detail(run)).json()["status"] == ExecutionStatus.SUSPENDED

    response = operator.post(action(run, "unpause"))
    assert response.status_code == 200, response.content
    assert response.json()["status"] == ExecutionStatus.PENDING
    assert response.json()["pause"] is None
    assert not Pause.objects.exists()
    # A worker goes on from the accepted payload: the refund runs once, with it.
    ledger.clear()
    finished = services.resume(run)
    assert finished is not None
    assert finished.ok
    assert ledger.calls == [("run", "refund")]
    assert services.find(run).steps[-1].arguments == {"approved": True}


def test_pausing_a_finished_run_is_409_and_a_bad_body_400(operator: APIClient) -> None:
    run = completed_run()
    refused = operator.post(action(run, "pause"))
    assert refused.status_code == 409
    assert refused.json()["code"] == "invalid_transition"
    assert refused.json()["status"] == "completed"
    bad = operator.post(action(paused_run("Z9"), "pause"), [1, 2], format="json")
    assert bad.status_code == 400
    assert not Pause.objects.exists()
    not_paused = operator.post(action(run, "unpause"))
    assert not_paused.status_code == 409


@pytest.mark.parametrize("name", ["pause", "unpause"])
def test_pausing_needs_the_pause_permission(name: str) -> None:
    others = [p for p in ALL_PERMISSIONS if p != "pause_execution"]
    client = client_for(user_with(*others))
    run = paused_run()
    response = client.post(action(run, name))
    assert response.status_code == 403
    assert "django_reactor.pause_execution" in response.json()["detail"]
    assert Execution.objects.get(pk=run).status == ExecutionStatus.PAUSED
    assert not Pause.objects.exists()
