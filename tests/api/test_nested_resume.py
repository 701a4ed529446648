"""The resume endpoints and interrupts of composed children: resumed through the root by path,
by correlation id and by token; a child's own id, and paths that do not exist, are refused."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rest_framework.test import APIClient

from django_reactor import Paused, services
from django_reactor.api.signatures import sign
from django_reactor.models import Execution, Interrupt
from django_reactor.states import ExecutionStatus, InterruptStatus
from tests.api.conftest import SECRET
from tests.integration.nested_reactors import NestedOrder, NestedSubscribe
from tests.integration.reactors import ledger

pytestmark = pytest.mark.django_db(transaction=True)

APPROVED = {"approved": True}


def paused_order(order: str) -> Paused:
    outcome = NestedOrder.run({"order": order})
    assert isinstance(outcome, Paused)
    return outcome


def url(execution_id: Any) -> str:
    return f"/reactor/executions/{execution_id}/resume/"


def child_id(parent_id: Any, step: str) -> Any:
    return Execution.objects.get(parent_id=parent_id, parent_step=step).pk


def test_the_detail_of_the_paused_root_lists_the_nested_interrupt_by_path(
    operator: APIClient,
) -> None:
    paused = paused_order("N1")

    response = operator.get(f"/reactor/executions/{paused.execution_id}/")

    assert response.status_code == 200
    assert response.data["status"] == "paused"
    assert [(i["step"], i["status"], i["correlation_id"]) for i in response.data["interrupts"]] == [
        ("checkout.approval", "waiting", "checkout-N1")
    ]


def test_resume_by_path_answers_the_roots_outcome(operator: APIClient) -> None:
    paused = paused_order("N2")

    response = operator.post(
        url(paused.execution_id), {"step": "checkout.approval", "payload": APPROVED}, format="json"
    )

    assert response.status_code == 200, response.data
    assert response.data["execution_id"] == str(paused.execution_id)
    assert response.data["status"] == "completed"
    assert ("run", "receipt") in ledger.calls


def test_an_unknown_path_answers_400_with_the_valid_paths(operator: APIClient) -> None:
    paused = paused_order("N3")

    for step in ("checkout.aproval", "shipping.approval", "checkout"):
        response = operator.post(
            url(paused.execution_id), {"step": step, "payload": APPROVED}, format="json"
        )
        assert response.status_code == 400, (step, response.data)
        assert response.data["code"] == "unknown_interrupt"
        assert response.data["paths"] == ["checkout.approval"]
        detail = response.data["detail"]
        assert f"{step!r} is not an interrupt of tests.nested.NestedOrder" in detail
    assert Interrupt.objects.get(execution_id=child_id(paused.execution_id, "checkout")).status == (
        InterruptStatus.WAITING
    )


def test_an_unknown_path_two_levels_down_lists_the_full_paths(operator: APIClient) -> None:
    paused = NestedSubscribe.run({"order": "N4"})

    response = operator.post(
        url(paused.execution_id), {"step": "fulfil.approval", "payload": APPROVED}, format="json"
    )

    assert response.status_code == 400
    assert response.data["paths"] == ["fulfil.checkout.approval"]
    done = operator.post(
        url(paused.execution_id),
        {"step": "fulfil.checkout.approval", "payload": APPROVED},
        format="json",
    )
    assert done.status_code == 200, done.data
    assert done.data["status"] == "completed"


def test_resuming_the_child_execution_is_refused_naming_the_root_and_the_path(
    operator: APIClient,
) -> None:
    paused = paused_order("N5")
    child = child_id(paused.execution_id, "checkout")

    response = operator.post(url(child), {"payload": APPROVED}, format="json")

    assert response.status_code == 409
    assert response.data["code"] == "invalid_transition"
    assert f"resumed through execution {paused.execution_id}" in response.data["detail"]
    assert "step='checkout.approval'" in response.data["detail"]


def test_resume_by_correlation_id_finds_the_nested_interrupt(operator: APIClient) -> None:
    paused = paused_order("N6")

    response = operator.post(
        "/reactor/correlations/checkout-N6/resume/",
        {"payload": APPROVED, "reactor": "tests.nested.NestedOrder"},
        format="json",
    )

    assert response.status_code == 200, response.data
    assert response.data["execution_id"] == str(paused.execution_id)
    assert response.data["status"] == "completed"


def test_resume_with_a_token_of_the_nested_interrupt(anonymous: APIClient) -> None:
    paused = paused_order("N7")
    token = services.issue_resume_token(paused.execution_id, "checkout.approval")

    wrong_step = anonymous.post(
        "/reactor/resume/",
        {"step": "approval2", "payload": APPROVED},
        format="json",
        headers={"Reactor-Resume-Token": token},
    )
    response = anonymous.post(
        url(paused.execution_id),
        {"step": "checkout.approval", "payload": APPROVED},
        format="json",
        headers={"Reactor-Resume-Token": token},
    )

    assert wrong_step.status_code == 404
    assert response.status_code == 200, response.data
    assert response.data == {"execution_id": str(paused.execution_id), "status": "completed"}


def test_a_signed_webhook_resumes_the_nested_interrupt(anonymous: APIClient) -> None:
    paused = paused_order("N8")
    raw = b'{"step": "checkout.approval", "payload": {"approved": true}}'
    headers = sign(SECRET, f"msg_{time.monotonic_ns()}", raw)

    response = anonymous.post(
        url(paused.execution_id), raw, content_type="application/json", headers=headers
    )

    assert response.status_code == 200, response.data
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.COMPLETED


def test_an_idempotency_key_accepts_one_payload_for_a_nested_interrupt(
    operator: APIClient,
) -> None:
    paused = paused_order("N9")
    headers = {"Idempotency-Key": "nested-1"}
    body = {"step": "checkout.approval", "payload": APPROVED}

    first = operator.post(url(paused.execution_id), body, format="json", headers=headers)
    second = operator.post(url(paused.execution_id), body, format="json", headers=headers)
    other = operator.post(
        url(paused.execution_id),
        {"step": "checkout.approval", "payload": {"approved": False}},
        format="json",
        headers=headers,
    )

    assert (first.status_code, second.status_code, other.status_code) == (200, 200, 422)
    assert second.data == first.data
    assert second.headers["Idempotent-Replayed"] == "true"
    assert ledger.calls.count(("run", "ship")) == 1


def test_an_invalid_payload_for_a_nested_interrupt_answers_400_with_field_errors(
    operator: APIClient,
) -> None:
    paused = paused_order("N10")

    response = operator.post(
        url(paused.execution_id),
        {"step": "checkout.approval", "payload": {"approved": "maybe"}},
        format="json",
    )

    assert response.status_code == 400
    assert response.data["code"] == "invalid_payload"
    assert response.data["errors"] == {"approved": ["Must be a valid boolean."]}
    assert response.data["attempts"] == 1
