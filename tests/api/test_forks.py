"""Forking a run over the API: the plan, the refusal that shows it, the fork."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from django_reactor.models import Execution
from tests.api.conftest import ALL_PERMISSIONS, client_for, user_with
from tests.api.test_executions import action
from tests.integration.reactors import ledger
from tests.integration.test_forks import Pipeline, failed_at

pytestmark = pytest.mark.django_db


def test_a_dry_run_answers_the_plan_and_writes_nothing(operator: APIClient) -> None:
    original = Pipeline.run({"n": 1}).execution_id
    response = operator.post(
        action(original, "fork"), {"from_step": "s7", "dry_run": True}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json() == {
        "from_step": "s7",
        "carried": ["s1", "s2", "s3", "s4", "s5", "s6"],
        "undo": ["s8", "s7"],
        "again": ["s7", "s8"],
        "warnings": [],
    }
    assert Execution.objects.count() == 1


def test_a_fork_that_abandons_steps_is_409_with_the_plan_until_confirmed(
    operator: APIClient,
) -> None:
    original = Pipeline.run({"n": 1}).execution_id
    refused = operator.post(action(original, "fork"), {"from_step": "s8"}, format="json")
    assert refused.status_code == 409
    body = refused.json()
    assert (body["code"], body["status"], body["plan"]["undo"]) == (
        "fork_needs_undo",
        "completed",
        ["s8"],
    )
    ledger.clear()
    done = operator.post(
        action(original, "fork"), {"from_step": "s8", "undo_abandoned": True}, format="json"
    )
    assert done.status_code == 200, done.content
    assert done.json()["status"] == "completed"
    assert ledger.calls == [("undo", "s8"), ("run", "s8")]


def test_a_failed_run_is_forked_and_bad_requests_are_400(operator: APIClient) -> None:
    original = failed_at("s5")
    for body, code in (
        ({"from_step": "nope"}, "invalid_fork"),
        ({"from_step": "s5", "inputs": {"n": "x"}}, "invalid_inputs"),
        ({}, "invalid"),
        ({"from_step": ""}, "invalid"),
    ):
        response = operator.post(action(original, "fork"), body, format="json")
        assert response.status_code == 400, body
        assert response.json()["code"] == code, response.json()
    assert operator.post(action(original, "fork"), [1], format="json").status_code == 400
    assert Execution.objects.count() == 1
    response = operator.post(action(original, "fork"), {"from_step": "s5"}, format="json")
    assert response.status_code == 200
    assert response.json()["status"] == "completed"
    again = operator.post(action(original, "fork"), {"from_step": "s5"}, format="json")
    assert again.status_code == 409


def test_forking_needs_the_retry_permission() -> None:
    original = failed_at("s5")
    client = client_for(user_with(*[p for p in ALL_PERMISSIONS if p != "retry_execution"]))
    response = client.post(action(original, "fork"), {"from_step": "s5"}, format="json")
    assert response.status_code == 403
    assert "django_reactor.retry_execution" in response.json()["detail"]
    assert Execution.objects.count() == 1
