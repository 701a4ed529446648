"""The API's steering is recorded as its credential's (the user, the webhook secrets that
signed, a resume token; never a secret's value), via "api", with the body's reason."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from django_reactor import Failed, Paused, services
from django_reactor.api.signatures import sign
from django_reactor.models import AuditEntry
from tests.api.conftest import ALL_PERMISSIONS, SECRET, client_for, make_user
from tests.api.reactors import ApiRefund
from tests.integration.reactors import FAIL_AT

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ops() -> tuple[APIClient, str]:
    user = make_user("ops", *ALL_PERMISSIONS)
    return client_for(user), f"ops (user {user.pk})"


def paused(order: str) -> uuid.UUID:
    outcome = ApiRefund.run({"order": order, "card": "4242"})
    assert isinstance(outcome, Paused)
    assert outcome.execution_id is not None
    return outcome.execution_id


def recorded() -> list[tuple[str, uuid.UUID | None, str, str, str]]:
    return [
        (e.action, e.execution_id, e.who, e.via, e.reason)
        for e in AuditEntry.objects.order_by("at", "id")
    ]


def action(execution_id: Any, name: str) -> str:
    return f"/reactor/executions/{execution_id}/{name}/"


def test_cancel_undo_and_retry_are_the_users_with_the_bodys_reason(
    ops: tuple[APIClient, str],
) -> None:
    client, me = ops
    cancelled = paused("C1")
    cancel = client.post(action(cancelled, "cancel"), {"reason": "dupe"}, format="json")
    assert cancel.status_code == 200, cancel.content
    completed = paused("C2")
    services.resume_interrupt(completed, step="approval", payload={"approved": True})
    AuditEntry.objects.filter(action="resume").delete()  # this test's own (via python)
    undo = client.post(action(completed, "undo"), {"reason": "refunded"}, format="json")
    assert undo.status_code == 200, undo.content
    FAIL_AT.add("request")
    try:
        failed = ApiRefund.run({"order": "C3", "card": "4242"})
    finally:
        FAIL_AT.discard("request")
    assert isinstance(failed, Failed)
    retry = client.post(action(failed.execution_id, "retry"), {"reason": "fixed"}, format="json")
    assert retry.status_code == 200, retry.content
    empty = client.post(action(paused("C4"), "undo"))  # no body: no reason
    assert empty.status_code == 200, empty.content
    assert [(a, who, via, why) for a, _, who, via, why in recorded()] == [
        ("cancel", me, "api", "dupe"),
        ("undo", me, "api", "refunded"),
        ("retry", me, "api", "fixed"),
        ("undo", me, "api", ""),
    ]
    trace = client.get(f"/reactor/executions/{cancelled}/").json()["trace"]
    assert trace[-1]["data"] == {
        "by": me,
        "via": "api",
        "reason": "dupe",
        "previous_status": "paused",
    }


def test_a_refused_request_records_nothing(ops: tuple[APIClient, str]) -> None:
    client, _ = ops
    run = paused("R1")
    refused = client.post(action(run, "retry"), {"reason": "why not"}, format="json")
    assert refused.status_code == 409
    bad = client.post(action(run, "undo"), {"reason": 5}, format="json")
    assert bad.status_code == 400
    assert bad.json()["errors"] == {"reason": ["Not a valid string."]}
    not_object = client.post(action(run, "undo"), [1], format="json")
    assert not_object.status_code == 400
    assert recorded() == []


def test_a_resume_names_its_credential_never_a_secret(ops: tuple[APIClient, str]) -> None:
    client, me = ops
    by_user = paused("U1")
    response = client.post(
        f"/reactor/executions/{by_user}/resume/",
        {"step": "approval", "payload": {"approved": True}, "reason": "checked the photos"},
        format="json",
    )
    assert response.status_code == 200, response.content

    by_webhook = paused("W1")
    raw = json.dumps({"step": "approval", "payload": {"approved": True}}).encode()
    signed = APIClient().post(
        f"/reactor/executions/{by_webhook}/resume/",
        raw,
        content_type="application/json",
        headers=sign(SECRET, f"msg_{time.monotonic_ns()}", raw),
    )
    assert signed.status_code == 200, signed.content

    by_token = paused("T1")
    token = services.issue_resume_token(by_token, "approval")
    tokened = APIClient().post(
        "/reactor/resume/",
        {"payload": {"approved": False}},
        format="json",
        headers={"Reactor-Resume-Token": token},
    )
    assert tokened.status_code == 200, tokened.content

    assert recorded() == [
        ("resume", by_user, me, "api", "checked the photos"),
        ("resume", by_webhook, "webhook signed with the 'default' secrets", "api", ""),
        ("resume", by_token, "resume token", "api", ""),
    ]
    shown = " ".join(str(r) for r in recorded())
    assert SECRET not in shown
    assert token not in shown
    steer = [e for e in services.find(by_webhook).trace if e.kind == "steer"]
    assert steer[0].data["by"] == "webhook signed with the 'default' secrets"


def test_a_resume_reason_that_cannot_be_stored_is_refused(ops: tuple[APIClient, str]) -> None:
    client, _ = ops
    run = paused("N1")
    response = client.post(
        f"/reactor/executions/{run}/resume/",
        {"step": "approval", "payload": {"approved": True}, "reason": "x" * 1001},
        format="json",
    )
    assert response.status_code == 400
    assert "reason" in response.json()["errors"]
    assert recorded() == []
