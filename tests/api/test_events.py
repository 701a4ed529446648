"""``POST /events/{name}/``: an event emitted by a signed webhook, and the EVENT_AUTH checks."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from rest_framework import serializers
from rest_framework.test import APIClient

from django_reactor import EmittedEvent, Paused, Reactor, arg, on_event, step, wait_for_event
from django_reactor.api.signatures import sign
from django_reactor.checks import check_settings
from django_reactor.models import ApiRequest, Event, Execution
from django_reactor.states import ExecutionStatus
from tests.api.conftest import SECRET, client_for, signed_headers, user_with
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)

WAITED = "api.charge.refunded"
TRIGGER = "api.invoice.paid"
CANCELLING = "api.order.voided"


class ApiAwaitRefund(Reactor):
    """Waits for the refund of its order, then closes it."""

    charge = step(Tracked, order=arg.input("order"))
    refunded = wait_for_event(WAITED, match=arg.input("order"), resume="inline")
    close = step(Tracked, refund=arg.result("refunded"))

    class Meta:
        name = "tests.ApiAwaitRefund"
        cancel_on = [on_event(CANCELLING, match=arg.input("order"))]


def invoice_inputs(event: EmittedEvent) -> dict[str, Any]:
    return {"invoice": event.payload["invoice"]}


class ApiInvoiced(Reactor):
    """Started by each api.invoice.paid event."""

    class Inputs(serializers.Serializer):
        invoice = serializers.CharField(max_length=20)

    book = step(Tracked, invoice=arg.input("invoice"))

    class Meta:
        name = "tests.ApiInvoiced"
        triggers = [on_event(TRIGGER, inputs=invoice_inputs)]


@pytest.fixture(autouse=True)
def _emittable(settings: Any) -> None:
    settings.REACTOR = {
        **settings.REACTOR,
        "EVENT_AUTH": {"default": [], WAITED: ["webhook"], TRIGGER: ["webhook"]},
    }


def url(name: str) -> str:
    return f"/reactor/events/{name}/"


def emit(
    name: str, body: Any, *, webhook_id: str | None = None, client: APIClient | None = None
) -> Any:
    """POST ``body`` (JSON, or bytes as they are) to the event's URL, signed now."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = signed_headers(raw, webhook_id=webhook_id)
    return (client or APIClient()).post(
        url(name), raw, content_type="application/json", headers=headers
    )


def paused(order: str) -> str:
    outcome = ApiAwaitRefund.run({"order": order})
    assert isinstance(outcome, Paused), outcome
    return str(outcome.execution_id)


def refused(answer: Any, status: int, code: str, *, events: int = 0) -> dict[str, Any]:
    """The answer is the error ``status``/``code`` and only ``events`` Event rows exist."""
    assert answer.status_code == status, answer.content
    body: dict[str, Any] = answer.json()
    assert body["code"] == code, body
    assert Event.objects.count() == events
    return body


# ---------------------------------------------------------------------------- emitted


def test_a_signed_event_resumes_the_run_waiting_for_its_key() -> None:
    waiting = paused("A1")
    other = paused("B2")
    answer = emit(WAITED, {"payload": {"amount": 5}, "key": "A1"}, webhook_id="msg_refund_1")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert body == {
        "name": WAITED,
        "event_id": "msg_refund_1",  # the webhook id, as the body gives none
        "replay": False,
        "started": [],
        "given": [waiting],
        "resumed": [waiting],
        "cancelled": [],
        "errors": [],
    }
    assert Execution.objects.get(pk=waiting).status == ExecutionStatus.COMPLETED
    assert Execution.objects.get(pk=other).status == ExecutionStatus.PAUSED
    close = Execution.objects.get(pk=waiting).steps.get(step="close").result
    assert close["refund"] == {"amount": 5}
    event = Event.objects.get()
    assert (event.name, event.key, event.event_id, event.source) == (
        WAITED,
        "A1",
        "msg_refund_1",
        "webhook",
    )
    assert event.handled_at is not None


def test_a_signed_event_starts_the_run_its_trigger_names() -> None:
    answer = emit(TRIGGER, {"payload": {"invoice": "I-7"}, "event_id": "evt_7"})
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert body["event_id"] == "evt_7"  # the body's id wins over the webhook id
    (started,) = body["started"]
    row = Execution.objects.get(pk=started)
    assert row.reactor == "tests.ApiInvoiced"
    assert row.inputs == {"invoice": "I-7"}
    assert row.status == ExecutionStatus.PENDING  # a worker runs it
    assert (body["resumed"], body["given"], body["cancelled"]) == ([], [], [])


def test_a_signed_event_cancels_the_runs_subscribed_to_its_key(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "EVENT_AUTH": {"default": ["webhook"]}}
    waiting = paused("C3")
    answer = emit(CANCELLING, {"key": "C3"})
    assert answer.status_code == 202, answer.content
    assert answer.json()["cancelled"] == [waiting]
    assert Event.objects.get().payload is None  # an event may be its key alone


def test_a_redelivery_gets_the_first_answer_and_emits_nothing_new() -> None:
    raw = json.dumps({"payload": {"invoice": "I-8"}}).encode()
    headers = signed_headers(raw, webhook_id="msg_redelivered")
    first = APIClient().post(url(TRIGGER), raw, content_type="application/json", headers=headers)
    again = APIClient().post(url(TRIGGER), raw, content_type="application/json", headers=headers)
    assert first.status_code == again.status_code == 202, again.content
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    # The answer's record lost (a process stopped): the event's own id finds the event.
    ApiRequest.objects.all().delete()
    lost = APIClient().post(url(TRIGGER), raw, content_type="application/json", headers=headers)
    assert lost.status_code == 202, lost.content
    assert lost.json()["replay"] is True
    assert Event.objects.count() == 1
    assert Execution.objects.filter(reactor="tests.ApiInvoiced").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
def test_an_event_reaches_the_runs_of_every_database(settings: Any) -> None:
    settings.REACTOR = {
        **settings.REACTOR,
        "DATABASE": {"default": "default", "tests.ApiAwaitRefund": "shard"},
    }
    waiting = paused("S1")
    assert Execution.objects.using("shard").filter(pk=waiting).exists()
    answer = emit(WAITED, {"payload": {"amount": 9}, "key": "S1"})
    assert answer.status_code == 202, answer.content
    assert answer.json()["resumed"] == [waiting]
    assert Execution.objects.using("shard").get(pk=waiting).status == ExecutionStatus.COMPLETED
    answer = emit(TRIGGER, {"payload": {"invoice": "I-S"}})
    (started,) = answer.json()["started"]
    assert Execution.objects.using("default").filter(pk=started).exists()


# ---------------------------------------------------------------------------- refused


def test_a_bad_signature_is_401_and_emits_nothing() -> None:
    raw = json.dumps({"payload": {"invoice": "I-9"}}).encode()
    headers = {**signed_headers(raw), "webhook-signature": "v1," + "A" * 44}
    answer = APIClient().post(url(TRIGGER), raw, content_type="application/json", headers=headers)
    body = refused(answer, 401, "bad_signature")
    assert "does not match" in body["detail"]
    other_secret = sign("another-secret", "msg_other", raw)
    answer = APIClient().post(
        url(TRIGGER), raw, content_type="application/json", headers=other_secret
    )
    refused(answer, 401, "bad_signature")
    assert not Execution.objects.exists()


def test_a_timestamp_outside_the_window_is_401_as_for_a_resume() -> None:
    raw = json.dumps({"payload": {"invoice": "I-10"}}).encode()
    stale = sign(SECRET, "msg_stale", raw, timestamp=int(time.time()) - 3600)
    answer = APIClient().post(url(TRIGGER), raw, content_type="application/json", headers=stale)
    body = refused(answer, 401, "bad_signature")
    assert "seconds away from now" in body["detail"]
    assert answer["WWW-Authenticate"]
    # The same refusal a resume gets for it.
    resume = APIClient().post(
        "/reactor/resume/", raw, content_type="application/json", headers=stale
    )
    assert (resume.status_code, resume.json()) == (401, answer.json())


def test_only_signed_webhooks_emit() -> None:
    anonymous = APIClient().post(url(TRIGGER), {"payload": {}}, format="json")
    assert "signed webhooks only" in refused(anonymous, 401, "not_authenticated")["detail"]
    user = client_for(user_with("start_execution", "resume_interrupt"))
    refused(user.post(url(TRIGGER), {"payload": {}}, format="json"), 401, "credential_not_accepted")
    token = APIClient().post(
        url(TRIGGER), {"payload": {}}, format="json", headers={"Reactor-Resume-Token": "x" * 40}
    )
    refused(token, 401, "credential_not_accepted")


def test_no_event_is_emitted_until_event_auth_opens_it(settings: Any) -> None:
    settings.REACTOR = {k: v for k, v in settings.REACTOR.items() if k != "EVENT_AUTH"}
    body = refused(emit(TRIGGER, {"payload": {"invoice": "I-11"}}), 401, "credential_not_accepted")
    assert "EVENT_AUTH" in body["detail"]
    assert "accepted: none" in body["detail"]
    # Opened for another event only.
    settings.REACTOR = {**settings.REACTOR, "EVENT_AUTH": {WAITED: ["webhook"]}}
    refused(emit(TRIGGER, {"payload": {"invoice": "I-11"}}), 401, "credential_not_accepted")
    assert not Execution.objects.exists()


def test_an_event_auth_key_that_names_no_event_refuses_the_events_it_does_not_name(
    settings: Any,
) -> None:
    settings.REACTOR = {
        **settings.REACTOR,
        "EVENT_AUTH": {"default": ["webhook"], "api.invoice.payd": ["webhook"]},
    }
    body = refused(emit(TRIGGER, {"payload": {"invoice": "I-12"}}), 401, "credential_not_accepted")
    assert "E015" in body["detail"]


def test_a_secret_listed_for_one_reactor_emits_nothing(settings: Any) -> None:
    settings.REACTOR = {
        **settings.REACTOR,
        "WEBHOOK_SECRETS": {"default": ["unused-secret"], "tests.ApiInvoiced": [SECRET]},
    }
    body = refused(emit(TRIGGER, {"payload": {"invoice": "I-13"}}), 401, "bad_signature")
    assert "tests.ApiInvoiced" in body["detail"]
    assert '"default"' in body["detail"]


def test_an_unknown_event_is_a_404_listing_the_known_ones() -> None:
    body = refused(emit("api.charge.refundd", {"payload": {}}), 404, "unknown_event")
    assert "api.charge.refundd" in body["detail"]
    assert {WAITED, TRIGGER, CANCELLING} <= set(body["events"])
    assert body["events"] == sorted(body["events"])


@pytest.mark.parametrize(
    ("name", "body", "detail"),
    [
        (TRIGGER, {"payload": {"invoice": "I-14"}, "key": ""}, "key"),
        (TRIGGER, {"payload": {"invoice": "I-14"}, "key": ["a", "b"]}, "key"),
        (TRIGGER, {"payload": {"invoice": "I-14"}, "key": "k" * 256}, "key"),
        (TRIGGER, {"payload": {"invoice": "I-14"}, "event_id": True}, "event_id"),
        ("-no-name", {"payload": {}}, "event name"),
    ],
)
def test_a_bad_key_id_or_name_is_400_invalid_event(name: str, body: Any, detail: str) -> None:
    answer = refused(emit(name, body), 400, "invalid_event")
    assert detail in answer["detail"]
    assert not Execution.objects.exists()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"payload": {"invoice": "I-15"}, "paylod": 1}, "invalid"),
        ([{"invoice": "I-15"}], "invalid"),
        (b"{nope", "parse_error"),
    ],
)
def test_a_body_that_is_not_an_event_is_400(body: Any, code: str) -> None:
    refused(emit(TRIGGER, body), 400, code)


def test_an_oversize_body_is_413(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "API_MAX_BODY_BYTES": 200}
    body = refused(
        emit(TRIGGER, {"payload": {"invoice": "I-16", "notes": "x" * 300}}), 413, "too_large"
    )
    assert "200 bytes" in body["detail"]


def test_an_event_id_reused_for_another_payload_is_400() -> None:
    first = emit(TRIGGER, {"payload": {"invoice": "I-17"}, "event_id": "evt_same"})
    assert first.status_code == 202, first.content
    other = emit(TRIGGER, {"payload": {"invoice": "I-18"}, "event_id": "evt_same"})
    body = refused(other, 400, "invalid_event", events=1)
    assert "evt_same" in body["detail"]
    assert Event.objects.get().payload == {"invoice": "I-17"}
    assert Execution.objects.count() == 1


# ---------------------------------------------------------------------------- schema, checks


def test_the_schema_documents_the_endpoint() -> None:
    schema = APIClient().get("/api/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/reactor/events/{name}/"]["post"]
    assert set(operation["responses"]) == {"202", "400", "401", "404", "409", "413", "422", "429"}
    headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
    assert {"webhook-id", "webhook-timestamp", "webhook-signature"} <= headers
    assert "Reactor-Resume-Token" not in headers
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(request["properties"]) == {"payload", "key", "event_id"}
    assert not request.get("required")


def test_event_auth_entries_are_checked(settings: Any) -> None:
    settings.REACTOR = {"EVENT_AUTH": {"default": [], WAITED: ["user"]}}
    (shape,) = check_settings()
    assert shape.id == "django_reactor.E015"
    assert shape.msg == (
        "REACTOR['EVENT_AUTH'] has ['user']; each entry must be a list of webhook."
    )
    settings.REACTOR = {"EVENT_AUTH": {"api.charge.refundd": ["webhook"], TRIGGER: ["webhook"]}}
    (unknown,) = check_settings()
    assert unknown.id == "django_reactor.E015"
    assert "'api.charge.refundd'" in unknown.msg
    assert WAITED in unknown.hint
    settings.REACTOR = {"EVENT_AUTH": {"default": ["webhook"], TRIGGER: []}}
    assert check_settings() == []
    settings.REACTOR = {"EVENT_AUTH": ["webhook"], "WEBHOOK_SECRETS": []}
    assert [m.id for m in check_settings()] == ["django_reactor.W004"]
