"""The resume endpoints: credentials, HTTP semantics, idempotency, one winner."""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import pytest
from django.db import connections
from rest_framework.test import APIClient

from django_reactor import Paused, services
from django_reactor.api.signatures import sign
from django_reactor.models import Execution, Interrupt
from tests.api.conftest import OLD_SECRET, SECRET, user_with
from tests.api.reactors import ApiRefund, ApiRefundInBackground
from tests.integration.reactors import ledger

pytestmark = pytest.mark.django_db(transaction=True)


def paused_run(order: str = "A1") -> Paused:
    outcome = ApiRefund.run({"order": order, "card": "4242"})
    assert isinstance(outcome, Paused)
    return outcome


def url(execution_id: Any) -> str:
    return f"/reactor/executions/{execution_id}/resume/"


def body(payload: Any, **extra: Any) -> bytes:
    return json.dumps({"payload": payload, **extra}).encode()


def signed_post(
    client: APIClient, path: str, raw: bytes, *, secret: str = SECRET, **headers: Any
) -> Any:
    signed = sign(secret, headers.pop("webhook_id", f"msg_{time.monotonic_ns()}"), raw)
    signed.update(headers)
    return client.post(path, raw, content_type="application/json", headers=signed)


def test_a_user_with_the_permission_resumes_inline_and_gets_the_outcome(
    operator: APIClient,
) -> None:
    paused = paused_run()
    response = operator.post(
        url(paused.execution_id), {"step": "approval", "payload": {"approved": True}}, format="json"
    )
    assert response.status_code == 200, response.data
    assert response.data["status"] == "completed"
    assert response.data["value"]["refund"]["approved"] is True


def test_background_resume_answers_202(operator: APIClient) -> None:
    paused = ApiRefundInBackground.run({})
    response = operator.post(
        url(paused.execution_id), {"payload": {"approved": True}}, format="json"
    )
    assert response.status_code == 202
    assert response.data["status"] == "pending"
    assert Execution.objects.get(pk=paused.execution_id).status == "pending"


def test_a_signed_webhook_resumes_and_a_replay_gets_the_stored_response(
    anonymous: APIClient,
) -> None:
    paused = paused_run()
    raw = body({"approved": True})
    first = signed_post(anonymous, url(paused.execution_id), raw, webhook_id="msg_1")
    again = signed_post(anonymous, url(paused.execution_id), raw, webhook_id="msg_1")
    assert first.status_code == 200, first.data
    assert first.data == {"execution_id": str(paused.execution_id), "status": "completed"}
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert ledger.calls.count(("run", "refund")) == 1


@pytest.mark.parametrize("secret", [SECRET, OLD_SECRET])
def test_every_configured_secret_verifies_during_rotation(
    anonymous: APIClient, secret: str
) -> None:
    paused = paused_run()
    response = signed_post(
        anonymous, url(paused.execution_id), body({"approved": True}), secret=secret
    )
    assert response.status_code == 200


def test_forged_tampered_and_stale_signatures_are_401_before_anything_changes(
    anonymous: APIClient,
) -> None:
    paused = paused_run()
    raw = body({"approved": True})
    forged = signed_post(anonymous, url(paused.execution_id), raw, secret="whsec_Zm9yZ2Vk")
    headers = sign(SECRET, "msg_t", raw)
    tampered = anonymous.post(
        url(paused.execution_id),
        raw.replace(b"true", b"false"),
        content_type="application/json",
        headers=headers,
    )
    reordered = anonymous.post(
        url(paused.execution_id),
        json.dumps({"payload": {"approved": True}}, indent=2).encode(),
        content_type="application/json",
        headers=headers,
    )
    stale_headers = sign(SECRET, "msg_s", raw, timestamp=int(time.time()) - 301)
    stale = anonymous.post(
        url(paused.execution_id), raw, content_type="application/json", headers=stale_headers
    )
    for response in (forged, tampered, reordered, stale):
        assert response.status_code == 401, response.data
    assert "300 seconds" in stale.data["detail"]
    assert Execution.objects.get(pk=paused.execution_id).status == "paused"
    assert Interrupt.objects.get(execution_id=paused.execution_id).invalid_attempts == 0


def test_a_resume_token_resumes_once_and_guesses_get_404(anonymous: APIClient) -> None:
    paused = paused_run()
    token = services.issue_resume_token(paused.execution_id, "approval")
    guesses = [
        anonymous.post(
            "/reactor/resume/",
            body({"approved": True}),
            content_type="application/json",
            headers={"Reactor-Resume-Token": token[:-3] + "abc"},
        )
        for _ in range(3)
    ]
    assert {g.status_code for g in guesses} == {404}
    ok = anonymous.post(
        "/reactor/resume/",
        body({"approved": True}),
        content_type="application/json",
        headers={"Reactor-Resume-Token": token},
    )
    assert ok.status_code == 200
    reused = anonymous.post(
        "/reactor/resume/",
        body({"approved": True}),
        content_type="application/json",
        headers={"Reactor-Resume-Token": token},
    )
    assert reused.status_code == 404


@pytest.mark.parametrize(
    "first_class",
    ["SessionAuthentication", "BasicAuthentication"],
    ids=["session-first", "basic-first"],
)
def test_a_token_or_signature_is_honoured_beside_a_wrong_basic_password(
    anonymous: APIClient, settings: Any, first_class: str
) -> None:
    # The documented order: the token, then the signature, then the user. A request that
    # carries a token or a signature is never refused for its user credentials.
    classes = ["SessionAuthentication", "BasicAuthentication"]
    classes.sort(key=lambda name: name != first_class)
    settings.REACTOR = {
        **settings.REACTOR,
        "API_AUTHENTICATION_CLASSES": [f"rest_framework.authentication.{c}" for c in classes],
    }
    user_with("resume_interrupt")  # user-resume_interrupt, password "pw"
    wrong = "Basic " + base64.b64encode(b"user-resume_interrupt:wrong").decode()
    unknown = "Basic " + base64.b64encode(b"nobody:pw").decode()
    raw = body({"approved": True})

    by_token = paused_run("T1")
    token = services.issue_resume_token(by_token.execution_id, "approval")
    answered = anonymous.post(
        "/reactor/resume/",
        raw,
        content_type="application/json",
        headers={"Reactor-Resume-Token": token, "Authorization": wrong},
    )
    assert answered.status_code == 200, answered.content
    # Answered as a token sender: where the run stands, not the outcome a user sees.
    assert answered.json() == {"execution_id": str(by_token.execution_id), "status": "completed"}

    by_signature = paused_run("S1")
    signed = signed_post(anonymous, url(by_signature.execution_id), raw, Authorization=unknown)
    assert signed.status_code == 200, signed.content

    # Without a token or a signature the user is the credential, and a wrong password is
    # refused with 401 whatever the first authentication class, and nothing is delivered.
    alone = paused_run("U1")
    refused = anonymous.post(
        url(alone.execution_id), raw, content_type="application/json",
        headers={"Authorization": wrong},
    )  # fmt: skip
    assert refused.status_code == 401  # a wrong credential, whatever the first class
    assert Execution.objects.get(pk=alone.execution_id).status == "paused"
    # A malformed token is still refused, whatever the user credentials say.
    ok = "Basic " + base64.b64encode(b"user-resume_interrupt:pw").decode()
    malformed = anonymous.post(
        url(alone.execution_id), raw, content_type="application/json",
        headers={"Reactor-Resume-Token": "short", "Authorization": ok},
    )  # fmt: skip
    assert malformed.status_code == 401
    assert Execution.objects.get(pk=alone.execution_id).status == "paused"


def test_no_credential_is_401_and_a_user_without_the_permission_is_403(
    anonymous: APIClient,
) -> None:
    paused = paused_run()
    assert (
        anonymous.post(url(paused.execution_id), {"payload": {}}, format="json").status_code == 401
    )
    client = APIClient()
    client.force_authenticate(user_with("view_execution"))
    assert client.post(url(paused.execution_id), {"payload": {}}, format="json").status_code == 403


def test_status_codes_of_refused_deliveries(operator: APIClient, settings: Any) -> None:
    paused = paused_run()
    invalid = operator.post(
        url(paused.execution_id), {"payload": {"approved": "maybe"}}, format="json"
    )
    assert invalid.status_code == 400
    assert "approved" in invalid.data["errors"]
    assert invalid.data["attempts"] == 1
    unknown = operator.post(
        url("00000000-0000-0000-0000-000000000000"), {"payload": {}}, format="json"
    )
    assert unknown.status_code == 404
    done = operator.post(url(paused.execution_id), {"payload": {"approved": True}}, format="json")
    assert done.status_code == 200
    again = operator.post(url(paused.execution_id), {"payload": {"approved": True}}, format="json")
    assert again.status_code == 409
    assert again.data["code"] == "already_resumed"
    cancelled = paused_run("B2")
    services.cancel(cancelled.execution_id)
    gone = operator.post(
        url(cancelled.execution_id), {"payload": {"approved": True}}, format="json"
    )
    assert gone.status_code == 410
    settings.REACTOR = {**settings.REACTOR, "API_MAX_BODY_BYTES": 100}
    big = operator.post(url(paused.execution_id), {"payload": {"note": "x" * 200}}, format="json")
    assert big.status_code == 413


def test_a_run_that_has_not_reached_its_interrupt_keeps_the_payload(operator: APIClient) -> None:
    running = Execution.objects.create(reactor=ApiRefund.definition.name, definition_hash="x")
    response = operator.post(url(running.id), {"payload": {"approved": True}}, format="json")
    assert response.status_code == 202, response.content
    assert response.data["status"] == running.status
    second = operator.post(url(running.id), {"payload": {"approved": False}}, format="json")
    assert second.status_code == 409
    assert second.data["code"] == "already_resumed"
    invalid = operator.post(url(running.id), {"payload": {"approved": "?"}}, format="json")
    assert (invalid.status_code, invalid.data["code"]) == (400, "invalid_payload")


def test_idempotency_key_replays_and_refuses_another_body(operator: APIClient) -> None:
    paused = paused_run()
    headers = {"Idempotency-Key": "k-1"}
    first = operator.post(
        url(paused.execution_id), {"payload": {"approved": True}}, format="json", headers=headers
    )
    second = operator.post(
        url(paused.execution_id), {"payload": {"approved": True}}, format="json", headers=headers
    )
    other = operator.post(
        url(paused.execution_id), {"payload": {"approved": False}}, format="json", headers=headers
    )
    assert (first.status_code, second.status_code, other.status_code) == (200, 200, 422)
    assert second.data == first.data


def test_resume_by_correlation_id(operator: APIClient) -> None:
    paused = paused_run("C3")
    response = operator.post(
        "/reactor/correlations/api-refund-C3/resume/",
        {"payload": {"approved": True}, "reactor": "tests.ApiRefund"},
        format="json",
    )
    assert response.status_code == 200
    assert response.data["execution_id"] == str(paused.execution_id)


def test_the_rate_limit_answers_429(operator: APIClient, settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "API_RESUME_RATE": "2/m"}
    paused = paused_run()
    codes = [
        operator.post(
            url(paused.execution_id), {"payload": {"approved": "maybe"}}, format="json"
        ).status_code
        for _ in range(3)
    ]
    assert codes == [400, 400, 429]


@pytest.mark.postgres
def test_concurrent_signed_deliveries_resume_once(anonymous: APIClient) -> None:
    paused = ApiRefundInBackground.run({})
    barrier = threading.Barrier(4, timeout=10)
    codes: list[int] = []

    def deliver(index: int) -> None:
        client = APIClient()
        try:
            barrier.wait()
            response = signed_post(
                client,
                url(paused.execution_id),
                body({"approved": True}),
                webhook_id=f"msg_c{index}",
            )
            codes.append(response.status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(codes) == [202, 409, 409, 409]


def test_a_key_whose_request_died_unanswered_is_taken_over_after_the_lease() -> None:
    import datetime as dt

    from django_reactor import store
    from django_reactor.models import ApiRequest

    first = store.request_keys.reserve("webhook:default", "msg_dead", "fp")
    assert first.state == "new"
    assert store.request_keys.reserve("webhook:default", "msg_dead", "fp").state == "in_flight"
    ApiRequest.objects.filter(pk=first.row_id).update(
        created_at=ApiRequest.objects.get(pk=first.row_id).created_at - dt.timedelta(minutes=5)
    )
    assert store.request_keys.reserve("webhook:default", "msg_dead", "fp").state == "new"
