"""Abuse of the resume endpoints (reliability scenarios 40-49) and concurrent deliveries.

Every refused request must leave the run exactly as it was: still paused, no step run, no
invalid attempt counted.
"""

from __future__ import annotations

import io
import logging
import secrets
import threading
import time
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from rest_framework.test import APIClient

from django_reactor import Paused, services
from django_reactor.api import signatures
from django_reactor.models import ApiRequest, Execution, ExecutionEvent, Interrupt, Message
from tests.api.conftest import (
    OLD_SECRET,
    SECRET,
    client_for,
    make_user,
    resume_body,
    signed_headers,
    user_with,
)
from tests.api.reactors import ApiRefund, ApiRefundInBackground
from tests.integration.reactors import FAIL_AT, ledger

pytestmark = pytest.mark.django_db(transaction=True)

PAYLOAD = {"approved": True}


def paused_run(order: str = "A1") -> uuid.UUID:
    outcome = ApiRefund.run({"order": order, "card": "4242-4242"})
    assert isinstance(outcome, Paused), outcome
    assert outcome.execution_id is not None
    return outcome.execution_id


def url(execution_id: Any) -> str:
    return f"/reactor/executions/{execution_id}/resume/"


def post(client: APIClient, path: str, raw: bytes, **headers: Any) -> Any:
    return client.post(path, raw, content_type="application/json", headers=headers)


def assert_untouched(execution_id: uuid.UUID, *, remembered: int = 0) -> None:
    """The run is still paused at its interrupt and nothing ran or was counted.

    ``remembered``: how many answers were stored under an idempotency key or webhook id.
    """
    assert Execution.objects.get(pk=execution_id).status == "paused"
    interrupt = Interrupt.objects.get(execution_id=execution_id)
    assert (interrupt.status, interrupt.invalid_attempts) == ("waiting", 0)
    assert ("run", "refund") not in ledger.calls
    assert not ExecutionEvent.objects.filter(
        execution_id=execution_id, kind__in=["payload", "invalid_payload"]
    ).exists()
    assert ApiRequest.objects.count() == remembered


@pytest.fixture
def loose(anonymous: APIClient) -> APIClient:
    """An anonymous client that returns a 500 response instead of raising the error."""
    anonymous.raise_request_exception = False
    return anonymous


# ---------------------------------------------------------------------------- 40: signatures


def _wrong_scheme(headers: dict[str, str]) -> None:
    headers["webhook-signature"] = headers["webhook-signature"].replace("v1,", "v2,")


def _truncated(headers: dict[str, str]) -> None:
    headers["webhook-signature"] = headers["webhook-signature"][:-6]


def _empty_signature(headers: dict[str, str]) -> None:
    headers["webhook-signature"] = "v1,"


def _no_scheme(headers: dict[str, str]) -> None:
    headers["webhook-signature"] = headers["webhook-signature"].removeprefix("v1,")


def _several_wrong(headers: dict[str, str]) -> None:
    good = headers["webhook-signature"].removeprefix("v1,")
    headers["webhook-signature"] = f"v1,{good[::-1]} v2,{good} v1a,{good}"


def _without(name: str) -> Any:
    def drop(headers: dict[str, str]) -> None:
        del headers[name]

    drop.__name__ = f"without_{name}"
    return drop


def _timestamp(value: str) -> Any:
    def change(headers: dict[str, str]) -> None:
        headers["webhook-timestamp"] = value

    change.__name__ = f"timestamp_{value}"
    return change


def _an_hour_ahead(headers: dict[str, str]) -> None:
    # Read when the test runs (not in its id: every xdist process must collect the same ids).
    headers["webhook-timestamp"] = str(int(time.time()) + 3600)


@pytest.mark.parametrize(
    "spoil",
    [
        _wrong_scheme,
        _truncated,
        _empty_signature,
        _no_scheme,
        _several_wrong,
        _without("webhook-id"),
        _without("webhook-timestamp"),
        _timestamp("soon"),
        _timestamp("1e9"),
        _an_hour_ahead,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
def test_a_bad_signature_is_401_with_nothing_changed(anonymous: APIClient, spoil: Any) -> None:
    execution_id = paused_run()
    raw = resume_body(PAYLOAD)
    headers = signed_headers(raw)
    spoil(headers)
    response = post(anonymous, url(execution_id), raw, **headers)
    assert response.status_code == 401, response.content
    assert response.json()["code"] == "bad_signature"
    assert_untouched(execution_id)


def test_without_the_signature_header_the_request_is_unauthenticated(
    anonymous: APIClient,
) -> None:
    execution_id = paused_run()
    raw = resume_body(PAYLOAD)
    headers = signed_headers(raw)
    del headers["webhook-signature"]
    response = post(anonymous, url(execution_id), raw, **headers)
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
    assert post(anonymous, url(execution_id), raw).status_code == 401
    assert_untouched(execution_id)


def test_a_huge_webhook_timestamp_is_401_not_500(loose: APIClient) -> None:
    execution_id = paused_run()
    raw = resume_body(PAYLOAD)
    headers = {**signed_headers(raw), "webhook-timestamp": "9" * 400}
    response = post(loose, url(execution_id), raw, **headers)
    assert response.status_code == 401
    assert_untouched(execution_id)


def test_a_non_ascii_signature_is_401_not_500(loose: APIClient) -> None:
    execution_id = paused_run()
    raw = resume_body(PAYLOAD)
    headers = {**signed_headers(raw), "webhook-signature": "v1,\u00e9t\u00e9"}
    response = post(loose, url(execution_id), raw, **headers)
    assert response.status_code == 401
    assert_untouched(execution_id)


# ---------------------------------------------------------------------------- 41: replays


def test_a_replay_inside_the_window_gets_the_stored_response(anonymous: APIClient) -> None:
    execution_id = paused_run()
    raw = resume_body(PAYLOAD)
    headers = signed_headers(raw, webhook_id="msg_replayed")
    first = post(anonymous, url(execution_id), raw, **headers)
    assert first.status_code == 200
    assert first.json() == {"execution_id": str(execution_id), "status": "completed"}
    # The captured request sent again as it was, and the same delivery signed again.
    again = post(anonymous, url(execution_id), raw, **headers)
    resigned = post(
        anonymous, url(execution_id), raw, **signed_headers(raw, webhook_id="msg_replayed")
    )
    for replay in (again, resigned):
        assert replay.status_code == 200
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.json() == first.json()
    # The same webhook id with another (validly signed) body is refused.
    other = resume_body({"approved": False})
    changed = post(
        anonymous, url(execution_id), other, **signed_headers(other, webhook_id="msg_replayed")
    )
    assert changed.status_code == 422
    assert ledger.calls.count(("run", "refund")) == 1
    assert ExecutionEvent.objects.filter(execution_id=execution_id, kind="payload").count() == 1
    assert ApiRequest.objects.count() == 1


def test_a_replayed_invalid_delivery_is_not_counted_twice(anonymous: APIClient) -> None:
    execution_id = paused_run()
    raw = resume_body({"approved": "perhaps"})
    headers = signed_headers(raw, webhook_id="msg_invalid")
    codes = [post(anonymous, url(execution_id), raw, **headers).status_code for _ in range(3)]
    assert codes == [400, 400, 400]
    interrupt = Interrupt.objects.get(execution_id=execution_id)
    assert (interrupt.status, interrupt.invalid_attempts) == ("waiting", 1)
    assert Execution.objects.get(pk=execution_id).status == "paused"


def test_a_delivery_before_the_pause_is_kept_and_its_redelivery_replayed(
    anonymous: APIClient,
) -> None:
    running = Execution.objects.create(reactor=ApiRefund.definition.name, definition_hash="x")
    raw = resume_body(PAYLOAD)
    headers = signed_headers(raw, webhook_id="msg_early")
    early = post(anonymous, url(running.pk), raw, **headers)
    assert early.status_code == 202, early.content
    assert early.json() == {
        "execution_id": str(running.pk),
        "status": running.status,
        "detail": "accepted: the run is already moving and records this payload",
    }
    again = post(anonymous, url(running.pk), raw, **headers)
    assert again.status_code == 202
    assert again.headers["Idempotent-Replayed"] == "true"
    assert list(Message.objects.values_list("kind", "topic")) == [("delivery", "approval")]


def test_a_webhook_redelivered_after_the_run_paused_resumes_it(anonymous: APIClient) -> None:
    path = "/reactor/correlations/api-refund-E1/resume/"
    raw = resume_body(PAYLOAD)
    early = post(anonymous, path, raw, **signed_headers(raw, webhook_id="msg_early"))
    assert early.status_code == 404
    assert "again later" in early.json()["detail"]
    execution_id = paused_run("E1")
    again = post(anonymous, path, raw, **signed_headers(raw, webhook_id="msg_early"))
    assert again.status_code == 200, again.json()
    assert Execution.objects.get(pk=execution_id).status == "completed"


# ---------------------------------------------------------------------------- 42-43: tokens


def test_random_resume_tokens_are_all_404(anonymous: APIClient) -> None:
    execution_id = paused_run()
    services.issue_resume_token(execution_id, "approval")
    raw = resume_body(PAYLOAD)
    paths = ["/reactor/resume/", url(execution_id), "/reactor/correlations/api-refund-A1/resume/"]
    for _ in range(10):
        token = secrets.token_urlsafe(32)
        for path in paths:
            response = post(anonymous, path, raw, **{"Reactor-Resume-Token": token})
            assert response.status_code == 404, (path, response.content)
            assert response.json() == {"detail": "not found", "code": "not_found"}
    for bad in ("", "short-token-19chars", "x" * 201):
        response = post(anonymous, "/reactor/resume/", raw, **{"Reactor-Resume-Token": bad})
        assert response.status_code == 401, (bad, response.content)
        assert "Reactor-Resume-Token" in response.json()["detail"]
    assert_untouched(execution_id)


def test_a_token_resumes_only_its_own_run_and_step(anonymous: APIClient) -> None:
    mine, other = paused_run("A1"), paused_run("B2")
    token = services.issue_resume_token(mine, "approval")
    header = {"Reactor-Resume-Token": token}
    raw = resume_body(PAYLOAD)
    assert post(anonymous, url(other), raw, **header).status_code == 404
    assert (
        post(anonymous, "/reactor/correlations/api-refund-B2/resume/", raw, **header).status_code
        == 404
    )
    for step in ("request", "refund", "nope"):
        wrong = resume_body(PAYLOAD, step=step)
        assert post(anonymous, "/reactor/resume/", wrong, **header).status_code == 404
    assert_untouched(mine)
    assert_untouched(other)
    assert post(anonymous, "/reactor/resume/", raw, **header).status_code == 200


def test_the_token_never_appears_in_a_log_record(
    anonymous: APIClient, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    settings.DEBUG = True  # SQL statements and their parameters are logged too
    ok, failing = paused_run("A1"), paused_run("B2")
    tokens = [
        services.issue_resume_token(ok, "approval"),
        services.issue_resume_token(failing, "approval"),
    ]
    guess = tokens[0][:-4] + "AAAA"
    raw = resume_body(PAYLOAD)
    caplog.set_level(logging.DEBUG)
    for name in ("django_reactor", "django.db.backends", "django.request"):
        caplog.set_level(logging.DEBUG, logger=name)
    codes = [
        post(anonymous, "/reactor/resume/", raw, **{"Reactor-Resume-Token": guess}).status_code,
        post(anonymous, url(failing), raw, **{"Reactor-Resume-Token": tokens[0]}).status_code,
        post(anonymous, url(ok), raw, **{"Reactor-Resume-Token": tokens[0]}).status_code,
        post(anonymous, url(ok), raw, **{"Reactor-Resume-Token": tokens[0]}).status_code,
    ]
    FAIL_AT.add("refund")  # a run that fails while resumed by a token logs its failure
    codes.append(
        post(anonymous, "/reactor/resume/", raw, **{"Reactor-Resume-Token": tokens[1]}).status_code
    )
    assert codes == [404, 404, 200, 404, 200]
    assert Execution.objects.get(pk=failing).status == "failed"
    assert len(caplog.records) > 20  # logging was on: the SQL of every request is there
    formatter = logging.Formatter()
    for record in caplog.records:
        text = " ".join([formatter.format(record), repr(record.args), repr(vars(record))])
        for secret in (*tokens, guess):
            assert secret not in text, record.name


# ---------------------------------------------------------------------------- 44: body size


class Unreadable(io.RawIOBase):
    """A request body that fails the test if the view reads it."""

    def readable(self) -> bool:
        return True

    def read(self, *args: Any) -> bytes:
        raise AssertionError("the body was read")

    readline = read  # type: ignore[assignment]


def test_an_oversized_content_length_is_413_before_the_body_is_read(
    anonymous: APIClient, operator: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    execution_id = paused_run()

    def no_verify(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the signature was checked")

    monkeypatch.setattr(signatures, "verify", no_verify)
    raw = resume_body(PAYLOAD)
    environ = {"CONTENT_LENGTH": str(10**9), "wsgi.input": Unreadable()}
    signed = anonymous.post(
        url(execution_id),
        raw,
        content_type="application/json",
        headers=signed_headers(raw),
        **environ,
    )
    as_user = operator.post(url(execution_id), raw, content_type="application/json", **environ)
    for response in (signed, as_user):
        assert response.status_code == 413
        assert response.json()["code"] == "too_large"
    assert_untouched(execution_id)


def test_a_body_over_the_limit_is_413(operator: APIClient, settings: Any) -> None:
    execution_id = paused_run()
    padded = resume_body({**PAYLOAD, "pad": "x" * 70_000})
    assert (
        operator.post(url(execution_id), padded, content_type="application/json").status_code == 413
    )
    # Django's own limit below ours: still 413, not a 400 from Django.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    middle = resume_body({**PAYLOAD, "pad": "x" * 5000})
    assert (
        operator.post(url(execution_id), middle, content_type="application/json").status_code == 413
    )
    bad_length = operator.post(
        url(execution_id), resume_body(PAYLOAD), content_type="application/json",
        CONTENT_LENGTH="12abc",
    )  # fmt: skip
    assert bad_length.status_code == 400
    assert_untouched(execution_id)


# ---------------------------------------------------------------------------- 45-46: parsing


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 10_000 + b"]" * 10_000,
        b'{"payload": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        b'{"payload": ' + b'{"a": ' * 10_000 + b"1" + b"}" * 10_000 + b"}",
        b'{"payload": {"approved": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}",
    ],
    ids=["lists", "payload-lists", "payload-objects", "field-lists"],
)
def test_deeply_nested_json_is_400(operator: APIClient, raw: bytes, settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "API_MAX_BODY_BYTES": 200_000}
    execution_id = paused_run()
    client = client_for(user_with("resume_interrupt"), raise_request_exception=False)
    response = client.post(url(execution_id), raw, content_type="application/json")
    assert response.status_code == 400, response.content[:200]
    assert response.json()["code"] == "parse_error"
    assert_untouched(execution_id)


def test_json_nested_just_below_the_parser_limit_is_not_a_server_error() -> None:
    client = client_for(user_with("resume_interrupt"), raise_request_exception=False)
    unknown = url(uuid.uuid4())

    def send(depth: int) -> Any:
        raw = b'{"payload": ' + b"[" * depth + b"]" * depth + b"}"
        return client.post(unknown, raw, content_type="application/json")

    def unparsable(depth: int) -> bool:
        response = send(depth)
        return response.status_code == 400 and response.json().get("code") == "parse_error"

    # The smallest depth json.loads refuses, then every depth just below it.
    low, high = 1, 20_000
    while low < high:
        middle = (low + high) // 2
        if unparsable(middle):
            high = middle
        else:
            low = middle + 1
    codes = {depth: send(depth).status_code for depth in range(max(1, low - 150), low)}
    assert 500 not in codes.values(), sorted(d for d, c in codes.items() if c == 500)


def test_numbers_too_long_or_too_large_are_400(operator: APIClient, settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "API_MAX_BODY_BYTES": 300_000}
    execution_id = paused_run()
    digits = b"9" * 100_000
    bodies = {
        b"{" + b'"payload": {"approved": ' + digits + b"}}": "parse_error",
        b'{"step": ' + digits + b', "payload": {"approved": true}}': "parse_error",
        b'{"payload": ' + digits + b"}": "parse_error",
        digits: "parse_error",
        # Not JSON, or not storable: the parser refuses them before the serializers run.
        b'{"payload": {"approved": true, "x": 1e999999}}': "parse_error",
        b'{"payload": {"approved": NaN}}': "parse_error",
        b'{"payload": -Infinity}': "parse_error",
    }
    client = client_for(user_with("resume_interrupt"), raise_request_exception=False)
    for raw, code in bodies.items():
        response = client.post(url(execution_id), raw, content_type="application/json")
        assert response.status_code == 400, (raw[:60], response.content[:200])
        assert response.json()["code"] == code, raw[:60]
    assert_untouched(execution_id)


def test_a_nul_character_in_the_correlation_id_is_not_a_server_error() -> None:
    paused_run()
    client = client_for(user_with("resume_interrupt"), raise_request_exception=False)
    response = client.post(
        "/reactor/correlations/api-refund-A1%00/resume/",
        {"payload": PAYLOAD},
        format="json",
    )
    assert response.status_code == 404


# ---------------------------------------------------------------------------- 47: steps


@pytest.mark.parametrize("step", ["request", "refund", "nope", ""])
def test_a_step_that_is_not_a_waiting_interrupt_runs_nothing(
    operator: APIClient, step: str
) -> None:
    execution_id = paused_run()
    ledger.clear()
    raw = resume_body(PAYLOAD, step=step)
    response = post(operator, url(execution_id), raw)
    by_correlation = post(operator, "/reactor/correlations/api-refund-A1/resume/", raw)
    for answer in (response, by_correlation):
        assert answer.status_code in (400, 404, 409), answer.content
        if answer.status_code == 409:
            assert answer.json()["code"] == "not_waiting"
    assert ledger.calls == []
    assert_untouched(execution_id)


# ---------------------------------------------------------------------------- 48-49: policy


def test_resume_auth_per_reactor_refuses_the_other_credentials(
    anonymous: APIClient, operator: APIClient, settings: Any
) -> None:
    settings.REACTOR = {
        **settings.REACTOR,
        "RESUME_AUTH": {"default": ["user"], "tests.ApiRefund": ["webhook"]},
    }
    refund = paused_run()
    background = ApiRefundInBackground.run({}).execution_id
    raw = resume_body(PAYLOAD)
    refused = {
        "user on ApiRefund": post(operator, url(refund), raw),
        "token on ApiRefund": post(
            anonymous,
            "/reactor/resume/",
            raw,
            **{"Reactor-Resume-Token": services.issue_resume_token(refund, "approval")},
        ),
        "webhook on the default": post(anonymous, url(background), raw, **signed_headers(raw)),
        "token on the default": post(
            anonymous,
            url(background),
            raw,
            **{"Reactor-Resume-Token": services.issue_resume_token(background, "approval")},
        ),
    }
    for label, response in refused.items():
        assert response.status_code == 401, (label, response.content)
        assert response.json()["code"] == "credential_not_accepted", label
    assert_untouched(refund)  # a refused credential is not remembered: a retry is checked again
    assert Execution.objects.get(pk=background).status == "paused"
    accepted = post(anonymous, url(refund), raw, **signed_headers(raw))
    assert accepted.status_code == 200
    assert post(operator, url(background), raw).status_code == 202


def test_a_webhook_secret_of_another_reactor_is_401(anonymous: APIClient, settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "WEBHOOK_SECRETS": {"tests.Other": [SECRET]}}
    execution_id = paused_run()
    raw = resume_body(PAYLOAD)
    response = post(anonymous, url(execution_id), raw, **signed_headers(raw))
    assert response.status_code == 401
    assert response.json()["code"] == "bad_signature"
    assert "tests.ApiRefund" in response.json()["detail"]
    # The refusal is remembered under the webhook id; nothing else changed.
    assert Execution.objects.get(pk=execution_id).status == "paused"
    assert ("run", "refund") not in ledger.calls
    settings.REACTOR = {**settings.REACTOR, "WEBHOOK_SECRETS": {"tests.ApiRefund": [SECRET]}}
    assert post(anonymous, url(execution_id), raw, **signed_headers(raw)).status_code == 200


@pytest.mark.parametrize(
    "resume_auth",
    [
        {"ApiRefund": ["user"]},  # a class name, and no "default": all three, until now
        {"default": ["user", "webhook", "token"], "tests.ApiRefnd": ["user"]},  # a typo
    ],
    ids=["class-name-no-default", "misspelt-with-default"],
)
def test_a_resume_auth_key_that_names_no_reactor_never_widens_access(
    anonymous: APIClient,
    operator: APIClient,
    settings: Any,
    resume_auth: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.REACTOR = {**settings.REACTOR, "RESUME_AUTH": resume_auth}
    refund = paused_run()
    background = ApiRefundInBackground.run({}).execution_id
    raw = resume_body(PAYLOAD)
    with caplog.at_level(logging.ERROR, logger="django_reactor.api"):
        answers = {
            "token on ApiRefund": post(
                anonymous,
                "/reactor/resume/",
                raw,
                **{"Reactor-Resume-Token": services.issue_resume_token(refund, "approval")},
            ),
            "webhook on ApiRefund": post(anonymous, url(refund), raw, **signed_headers(raw)),
            "user on ApiRefund": post(operator, url(refund), raw),
            "user on another reactor": post(operator, url(background), raw),
        }
    for label, response in answers.items():
        assert response.status_code == 401, (label, response.content)
        body = response.json()
        assert body["code"] == "credential_not_accepted", label
        assert "REACTOR['RESUME_AUTH']" in body["detail"], label
    assert_untouched(refund)  # a refusal is not remembered: once fixed, a retry is answered
    assert Execution.objects.get(pk=background).status == "paused"
    logged = [r.getMessage() for r in caplog.records if r.name == "django_reactor.api"]
    assert len(logged) == 4
    bad_key = next(k for k in resume_auth if k != "default")
    assert all(repr(bad_key) in message and "E011" in message for message in logged)
    # Keyed by the registered name, the entry applies; the others use "default" (all three).
    settings.REACTOR = {**settings.REACTOR, "RESUME_AUTH": {"tests.ApiRefund": ["user"]}}
    token = services.issue_resume_token(background, "approval")
    assert (
        post(anonymous, url(background), raw, **{"Reactor-Resume-Token": token}).status_code == 202
    )
    assert post(operator, url(refund), raw).status_code == 200


def test_a_webhook_secret_under_a_key_that_names_no_reactor_resumes_nothing(
    anonymous: APIClient, settings: Any
) -> None:
    settings.REACTOR = {
        **settings.REACTOR,
        "WEBHOOK_SECRETS": {"ApiRefund": [SECRET], "default": [OLD_SECRET]},
    }
    execution_id = paused_run()
    raw = resume_body(PAYLOAD)
    refused = post(anonymous, url(execution_id), raw, **signed_headers(raw))
    assert refused.status_code == 401
    assert refused.json()["code"] == "bad_signature"
    assert Execution.objects.get(pk=execution_id).status == "paused"
    assert ("run", "refund") not in ledger.calls
    # The "default" secrets stay good for every reactor, as documented.
    accepted = post(anonymous, url(execution_id), raw, **signed_headers(raw, secret=OLD_SECRET))
    assert accepted.status_code == 200, accepted.content


# ---------------------------------------------------------------------------- concurrency


def _race(count: int, send: Any) -> list[Any]:
    """Call ``send(index)`` from ``count`` threads released together; their responses."""
    barrier = threading.Barrier(count, timeout=10)
    responses: list[Any] = []
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait()
            responses.append(send(index))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a delivery hung"
    assert not errors, errors
    return responses


@pytest.mark.postgres  # threads racing on one row: SQLite locks the whole table
def test_eight_keys_racing_for_one_interrupt_resume_once() -> None:
    execution_id = paused_run()
    user = make_user("racer", "resume_interrupt")
    clients = [client_for(User.objects.get(pk=user.pk)) for _ in range(8)]
    raw = resume_body(PAYLOAD)
    responses = _race(
        8, lambda i: post(clients[i], url(execution_id), raw, **{"Idempotency-Key": f"key-{i}"})
    )
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] + [409] * 7, [r.content for r in responses]
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {"already_resumed"}
    (winner,) = [r for r in responses if r.status_code == 200]
    assert winner.json()["status"] == "completed"
    assert ledger.calls.count(("run", "refund")) == 1
    assert ExecutionEvent.objects.filter(execution_id=execution_id, kind="payload").count() == 1
    assert Interrupt.objects.get(execution_id=execution_id).status == "resumed"


@pytest.mark.postgres  # threads racing on one row: SQLite locks the whole table
def test_one_key_sent_four_times_at_once_resumes_once() -> None:
    execution_id = paused_run()
    user = make_user("retrier", "resume_interrupt")
    clients = [client_for(User.objects.get(pk=user.pk)) for _ in range(4)]
    raw = resume_body(PAYLOAD)
    responses = _race(
        4, lambda i: post(clients[i], url(execution_id), raw, **{"Idempotency-Key": "same-key"})
    )
    first = [r for r in responses if r.status_code == 200 and "Idempotent-Replayed" not in r]
    assert len(first) == 1, [(r.status_code, r.content) for r in responses]
    for response in responses:
        if response is first[0]:
            continue
        if response.status_code == 200:
            assert response.headers["Idempotent-Replayed"] == "true"
            assert response.json() == first[0].json()
        else:
            assert response.status_code == 409, response.content
            assert response.json()["code"] == "in_flight"
            assert response.headers["Retry-After"] == "1"
    assert first[0].json()["status"] == "completed"
    assert ledger.calls.count(("run", "refund")) == 1
    assert ExecutionEvent.objects.filter(execution_id=execution_id, kind="payload").count() == 1
    assert ApiRequest.objects.filter(key="same-key").count() == 1
    # Sent again later, the key gets the stored answer.
    late = post(client_for(user), url(execution_id), raw, **{"Idempotency-Key": "same-key"})
    assert late.status_code == 200
    assert late.headers["Idempotent-Replayed"] == "true"
