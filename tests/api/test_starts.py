"""``POST /reactors/{name}/runs/``: a run started over HTTP, on a worker."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework import serializers
from rest_framework.test import APIClient

from django_reactor import Reactor, arg, step
from django_reactor.models import ApiRequest, Execution
from django_reactor.states import ExecutionStatus
from tests.api.conftest import client_for, signed_headers, user_with
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "tests.ApiCheckout"


class ApiCheckout(Reactor):
    class Inputs(serializers.Serializer):
        order_id = serializers.CharField(max_length=20)
        amount = serializers.IntegerField(min_value=1)

    charge = step(Tracked, order=arg.input("order_id"), amount=arg.input("amount"))

    class Meta:
        name = NAME


class ApiClosed(Reactor):
    """Not opted in to START_AUTH."""

    only = step(Tracked)

    class Meta:
        name = "tests.ApiClosed"


@pytest.fixture(autouse=True)
def _startable(settings: Any) -> None:
    settings.REACTOR = {
        **settings.REACTOR,
        "START_AUTH": {"default": [], NAME: ["user", "webhook"]},
    }


@pytest.fixture
def starter() -> APIClient:
    return client_for(user_with("start_execution", "view_execution"))


def url(name: str = NAME) -> str:
    return f"/reactor/reactors/{name}/runs/"


def post(client: APIClient, path: str, body: Any, **headers: str) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post(path, raw, content_type="application/json", **extra)


def test_a_user_with_start_execution_starts_a_run_on_a_worker(starter: APIClient) -> None:
    answer = post(starter, url(), {"order_id": "o-1", "amount": 250})
    assert answer.status_code == 202, answer.content
    body = answer.json()
    row = Execution.objects.get(pk=body["execution_id"])
    assert row.reactor == NAME
    assert row.status == ExecutionStatus.PENDING  # a worker takes it
    assert row.inputs == {"order_id": "o-1", "amount": 250}
    assert body["status"] == "pending"
    assert body["url"] == f"http://testserver/reactor/executions/{row.id}/"
    assert answer["Location"] == body["url"]
    assert body["idempotent_replay"] is False
    assert [e.kind for e in row.events.order_by("seq")] == ["start"]
    # The URL it gives is the run's.
    assert starter.get(body["url"]).json()["id"] == str(row.id)


def test_inputs_failing_the_serializer_answer_their_field_errors_and_write_nothing(
    starter: APIClient,
) -> None:
    answer = post(starter, url(), {"order_id": "o-1", "amount": 0})
    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "invalid_inputs"
    assert set(answer.json()["errors"]) == {"amount"}
    assert "ApiCheckout" in answer.json()["detail"]
    not_object = post(starter, url(), [1, 2])
    assert not_object.status_code == 400
    assert not_object.json()["code"] == "invalid"
    not_json = post(starter, url(), b"{nope")
    assert not_json.status_code == 400
    assert not_json.json()["code"] == "parse_error"
    assert not Execution.objects.exists()


def test_an_unknown_reactor_is_a_404_naming_it(starter: APIClient) -> None:
    answer = post(starter, url("tests.NoSuchReactor"), {})
    assert answer.status_code == 404
    assert answer.json()["code"] == "unknown_reactor"
    assert "tests.NoSuchReactor" in answer.json()["detail"]
    assert not Execution.objects.exists()


def test_starting_needs_the_permission_and_a_reactor_opted_in(starter: APIClient) -> None:
    anonymous = post(APIClient(), url(), {"order_id": "o-1", "amount": 1})
    assert anonymous.status_code == 401
    reader = post(client_for(user_with("view_execution")), url(), {"order_id": "o", "amount": 1})
    assert reader.status_code == 403
    assert "start_execution" in reader.json()["detail"]
    closed = post(starter, url("tests.ApiClosed"), {})
    assert closed.status_code == 403
    assert closed.json()["code"] == "credential_not_accepted"
    assert "START_AUTH" in closed.json()["detail"]
    assert not Execution.objects.exists()


def test_a_repeated_idempotency_key_starts_one_run(starter: APIClient) -> None:
    body = {"order_id": "o-2", "amount": 5}
    first = post(starter, url(), body, **{"Idempotency-Key": "start-1"})
    again = post(starter, url(), body, **{"Idempotency-Key": "start-1"})
    assert first.status_code == again.status_code == 202
    assert again.json()["execution_id"] == first.json()["execution_id"]
    assert again["Idempotent-Replayed"] == "true"
    other = post(starter, url(), {"order_id": "o-3", "amount": 5}, **{"Idempotency-Key": "start-1"})
    assert other.status_code == 422
    assert Execution.objects.count() == 1


def test_the_run_keeps_the_key_when_the_request_record_is_lost(starter: APIClient) -> None:
    # A process that died after starting the run, before recording its answer: the run's own
    # key finds it.
    body = {"order_id": "o-4", "amount": 5}
    first = post(starter, url(), body, **{"Idempotency-Key": "start-2"})
    ApiRequest.objects.all().delete()
    again = post(starter, url(), body, **{"Idempotency-Key": "start-2"})
    assert again.json()["execution_id"] == first.json()["execution_id"]
    assert again.json()["idempotent_replay"] is True
    # Another user's same key is another request.
    stranger = client_for(user_with("start_execution"))
    theirs = post(stranger, url(), body, **{"Idempotency-Key": "start-2"})
    assert theirs.json()["execution_id"] != first.json()["execution_id"]
    assert Execution.objects.count() == 2


def test_a_signed_webhook_starts_one_run_per_webhook_id() -> None:
    raw = json.dumps({"order_id": "o-5", "amount": 9}).encode()
    headers = signed_headers(raw, webhook_id="msg_start_1")
    first = post(APIClient(), url(), raw, **headers)
    again = post(APIClient(), url(), raw, **headers)
    assert first.status_code == again.status_code == 202, first.content
    assert again.json()["execution_id"] == first.json()["execution_id"]
    forged = post(APIClient(), url(), raw, **{**headers, "webhook-signature": "v1,AAAA"})
    assert forged.status_code == 401
    assert Execution.objects.count() == 1


def test_a_resume_token_starts_nothing() -> None:
    answer = post(APIClient(), url(), {}, **{"Reactor-Resume-Token": "x" * 40})
    assert answer.status_code == 401
    assert not Execution.objects.exists()


def test_the_schema_shows_each_reactors_inputs(starter: APIClient) -> None:
    schema = APIClient().get("/api/schema/", {"format": "json"})
    document = schema.json()
    operation = document["paths"]["/reactor/reactors/{name}/runs/"]["post"]
    options = operation["requestBody"]["content"]["application/json"]["schema"]
    components = document["components"]["schemas"]
    refs = (
        [o["$ref"].rsplit("/", 1)[1] for o in components["ReactorInputs"]["oneOf"]]
        if ("$ref" in options)
        else [o["$ref"].rsplit("/", 1)[1] for o in options["oneOf"]]
    )
    assert "TestsApiCheckoutInputs" in refs
    assert set(components["TestsApiCheckoutInputs"]["properties"]) == {"order_id", "amount"}
