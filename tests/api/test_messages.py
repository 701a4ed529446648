"""``POST /executions/{id}/messages/{topic}/``: a message to a run's mailbox over HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework import serializers
from rest_framework.test import APIClient

from django_reactor import Reactor, arg, receive, step
from django_reactor.models import ApiRequest, Execution, Message
from tests.api.conftest import client_for, signed_headers, user_with
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)


class Shipment(serializers.Serializer):
    carrier = serializers.CharField(max_length=20)


class ApiShipping(Reactor):
    pack = step(Tracked)
    shipped = receive("shipment.sent", after="pack", serializer=Shipment)
    notify = step(Tracked, carrier=arg.result("shipped", "carrier"))

    class Meta:
        name = "tests.ApiShipping"


def url(execution_id: Any, topic: str = "shipment.sent") -> str:
    return f"/reactor/executions/{execution_id}/messages/{topic}/"


def post(client: APIClient, path: str, raw: bytes, **headers: str) -> Any:
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post(path, raw, content_type="application/json", **extra)


def paused() -> Any:
    return ApiShipping.run({}).execution_id


def test_a_message_resumes_a_run_paused_at_its_receive(operator: APIClient) -> None:
    run_id = paused()
    answer = post(operator, url(run_id), json.dumps({"carrier": "dhl"}).encode())
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "completed"
    assert answer.json()["value"]["notify"] == {"step": "notify", "carrier": "dhl"}
    assert list(Message.objects.values_list("status", "consumed_by_step")) == [
        ("consumed", "shipped")
    ]


def test_a_signed_webhook_message_is_kept_once_per_webhook_id(anonymous: APIClient) -> None:
    row = Execution.objects.create(reactor=ApiShipping.definition.name, definition_hash="x")
    raw = json.dumps({"carrier": "ups"}).encode()
    headers = signed_headers(raw, webhook_id="msg_ship_1")
    first = post(anonymous, url(row.pk), raw, **headers)
    again = post(anonymous, url(row.pk), raw, **headers)
    assert first.status_code == 202, first.content
    assert first.json()["detail"].startswith("kept")
    assert again.status_code == 202
    assert again.headers["Idempotent-Replayed"] == "true"
    assert Message.objects.filter(execution_id=row.pk).count() == 1
    assert Message.objects.get().idempotency_key == "msg_ship_1"


@pytest.mark.parametrize(
    ("topic", "body", "status_code", "code"),
    [
        ("refund", b"{}", 404, "unknown_topic"),
        ("bad topic!", b"{}", 400, "invalid_message"),
        ("shipment.sent", b"{not json", 400, "parse_error"),
        ("shipment.sent", b'"\\u0000"', 400, "parse_error"),
    ],
)
def test_bad_messages_are_specific_4xx_and_write_nothing(
    operator: APIClient, topic: str, body: bytes, status_code: int, code: str
) -> None:
    run_id = paused()
    answer = post(operator, url(run_id, topic), body)
    assert (answer.status_code, answer.json()["code"]) == (status_code, code), answer.content
    assert not Message.objects.exists()


def test_an_unknown_run_an_ended_run_and_a_big_body(operator: APIClient, settings: Any) -> None:
    missing = post(operator, url("00000000-0000-0000-0000-000000000000"), b"{}")
    assert missing.status_code == 404
    assert post(operator, url("not-a-uuid"), b"{}").status_code == 404
    run_id = paused()
    Execution.objects.filter(pk=run_id).update(status="completed")
    ended = post(operator, url(run_id), b'{"carrier": "dhl"}')
    assert (ended.status_code, ended.json()["code"]) == (409, "invalid_transition")
    assert "takes no messages" in ended.json()["detail"]
    settings.REACTOR = {**settings.REACTOR, "API_MAX_BODY_BYTES": 20}
    big = post(operator, url(run_id), json.dumps({"carrier": "x" * 40}).encode())
    assert big.status_code == 413
    assert not Message.objects.exists()


def test_messages_take_the_resume_credentials(anonymous: APIClient) -> None:
    run_id = paused()
    raw = b'{"carrier": "dhl"}'
    assert post(anonymous, url(run_id), raw).status_code == 401
    reader = client_for(user_with("view_execution"))
    assert post(reader, url(run_id), raw).status_code == 403
    token = post(anonymous, url(run_id), raw, **{"Reactor-Resume-Token": "t" * 40})
    assert token.status_code == 401
    assert not Message.objects.exists()
    assert not ApiRequest.objects.exists()


def test_the_run_detail_lists_its_messages(operator: APIClient) -> None:
    row = Execution.objects.create(reactor=ApiShipping.definition.name, definition_hash="x")
    post(operator, url(row.pk), b'{"carrier": "dhl"}')
    detail = operator.get(f"/reactor/executions/{row.pk}/").json()
    assert [
        (m["topic"], m["kind"], m["status"], m["consumed_by_step"]) for m in detail["messages"]
    ] == [("shipment.sent", "message", "unread", "")]
