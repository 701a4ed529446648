"""Bodies and headers the database cannot store: every endpoint answers 400 (never 500),
with the API's error shape ``{"detail": ..., "code": ...}``, and nothing changes.

What cannot be stored: a lone surrogate (``\\udc00``) or a NUL (``\\u0000``) in a string or a
key, NaN and infinities, integers over Python's 4,300 digits and nesting deeper than the
stored values allow.
"""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import pytest
from rest_framework.exceptions import ParseError
from rest_framework.test import APIClient

from django_reactor import Paused, services
from django_reactor.api import signatures
from django_reactor.models import ApiRequest, Execution, ExecutionEvent, Interrupt
from tests.api.conftest import client_for, resume_body, signed_headers, user_with
from tests.api.reactors import ApiRefund
from tests.integration.reactors import ledger

pytestmark = pytest.mark.django_db(transaction=True)

APPROVED = b'{"approved": true'


def _payload(extra: bytes) -> bytes:
    """A resume body whose payload is valid but for ``extra`` (a JSON member, unstorable)."""
    return b'{"payload": ' + APPROVED + b", " + extra + b"}}"


# Each body, and a word the answer's detail must use to name the problem.
UNSTORABLE_BODIES = {
    "surrogate-value": (_payload(b'"v": "\\udc00"'), "surrogate"),
    "surrogate-pair-half": (_payload(b'"note": "ok \\ud800"'), "surrogate"),
    "surrogate-key": (_payload(b'"\\udfff": 1'), "surrogate"),
    "nul-value": (_payload(b'"v": "a\\u0000b"'), "NUL"),
    "nul-key": (_payload(b'"a\\u0000": 1'), "NUL"),
    "nul-step": (b'{"step": "approval\\u0000", "payload": {"approved": true}}', "NUL"),
    "deep-201": (_payload(b'"v": ' + b"[" * 201 + b"]" * 201), "levels deep"),
    "deep-10000": (_payload(b'"v": ' + b"[" * 10_000 + b"]" * 10_000), "deep"),
    "int-4301-digits": (_payload(b'"v": ' + b"9" * 4301), "4301 digits"),
    "negative-int-5000-digits": (_payload(b'"v": -' + b"9" * 5000), "5000 digits"),
    "nan": (_payload(b'"v": NaN'), "NaN"),
    "infinity": (_payload(b'"v": -Infinity'), "Infinity"),
    "float-overflow": (_payload(b'"v": 1e999999'), "1e999999"),
    "invalid-utf-8": (b'{"payload": {"approved": true, "v": "\xff"}}', "UTF-8"),
}


def paused_run(order: str = "A1") -> uuid.UUID:
    outcome = ApiRefund.run({"order": order, "card": "4242"})
    assert isinstance(outcome, Paused), outcome
    assert outcome.execution_id is not None
    return outcome.execution_id


def post(client: APIClient, path: str, raw: bytes, **headers: Any) -> Any:
    return client.post(path, raw, content_type="application/json", headers=headers)


def assert_refused(response: Any, code: str, word: str, label: str = "") -> None:
    """A 400 with exactly the API's error shape, whose detail names the problem; when the
    problem is a member of the body's object, ``errors`` names that member too."""
    assert response.status_code == 400, (label, response.content[:300])
    assert response["Content-Type"] == "application/json", label
    body = response.json()
    assert set(body) - {"errors"} == {"detail", "code"}, (label, body)
    assert body["code"] == code, (label, body)
    assert word in body["detail"], (label, body["detail"])
    for messages in body.get("errors", {}).values():
        assert messages, (label, body["errors"])
        assert all(word in m for m in messages), (label, body["errors"])


def assert_untouched(execution_id: uuid.UUID) -> None:
    """Still paused, no invalid attempt counted, no step run, no payload recorded."""
    assert Execution.objects.get(pk=execution_id).status == "paused"
    interrupt = Interrupt.objects.get(execution_id=execution_id)
    assert (interrupt.status, interrupt.invalid_attempts) == ("waiting", 0)
    assert ("run", "refund") not in ledger.calls
    assert not ExecutionEvent.objects.filter(
        execution_id=execution_id, kind__in=["payload", "invalid_payload"]
    ).exists()


@pytest.fixture
def loose() -> APIClient:
    """A user who may do everything; a server error comes back as a 500, not raised."""
    return client_for(
        user_with("resume_interrupt", "cancel_execution"), raise_request_exception=False
    )


# ---------------------------------------------------------------------------- bodies


@pytest.mark.parametrize(("raw", "word"), UNSTORABLE_BODIES.values(), ids=UNSTORABLE_BODIES)
def test_an_unstorable_resume_body_is_400_on_every_resume_endpoint(
    loose: APIClient, raw: bytes, word: str, settings: Any
) -> None:
    settings.REACTOR = {**settings.REACTOR, "API_MAX_BODY_BYTES": 100_000}
    execution_id = paused_run()
    token = services.issue_resume_token(execution_id, "approval")
    anonymous = APIClient(raise_request_exception=False)
    answers = {
        "execution": post(loose, f"/reactor/executions/{execution_id}/resume/", raw),
        "correlation": post(loose, "/reactor/correlations/api-refund-A1/resume/", raw),
        "token": post(anonymous, "/reactor/resume/", raw, **{"Reactor-Resume-Token": token}),
        "webhook": post(
            anonymous, f"/reactor/executions/{execution_id}/resume/", raw, **signed_headers(raw)
        ),
    }
    for label, response in answers.items():
        assert_refused(response, "parse_error", word, label)
    assert_untouched(execution_id)


def test_an_unstorable_body_under_an_idempotency_key_is_remembered_as_its_400(
    loose: APIClient,
) -> None:
    execution_id = paused_run()
    raw, _ = UNSTORABLE_BODIES["surrogate-value"]
    path = f"/reactor/executions/{execution_id}/resume/"
    first = post(loose, path, raw, **{"Idempotency-Key": "bad-body"})
    again = post(loose, path, raw, **{"Idempotency-Key": "bad-body"})
    assert_refused(first, "parse_error", "surrogate")
    assert_refused(again, "parse_error", "surrogate")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert_untouched(execution_id)
    # The corrected body, under a key of its own, resumes the run.
    corrected = post(loose, path, resume_body({"approved": True}), **{"Idempotency-Key": "new"})
    assert corrected.status_code == 200


CANCEL_BODIES = {
    "surrogate-reason": (b'{"reason": "\\udc00"}', "surrogate"),
    "nul-reason": (b'{"reason": "a\\u0000b"}', "NUL"),
    "nul-key": (b'{"reason": "x", "y\\u0000": 1}', "NUL"),
    "deep-201": (b'{"reason": "x", "y": ' + b"[" * 201 + b"]" * 201 + b"}", "levels deep"),
    "deep-10000": (b'{"reason": "x", "y": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", "deep"),
    "int-5000-digits": (b'{"reason": "x", "y": ' + b"9" * 5000 + b"}", "5000 digits"),
    "nan": (b'{"reason": "x", "y": NaN}', "NaN"),
    "not-json": (b'{"reason": ', "not valid JSON"),
    "invalid-utf-8": (b'{"reason": "\xff"}', "UTF-8"),
}


@pytest.mark.parametrize(("raw", "word"), CANCEL_BODIES.values(), ids=CANCEL_BODIES)
def test_an_unstorable_cancel_body_is_400_and_the_run_is_not_cancelled(
    loose: APIClient, raw: bytes, word: str
) -> None:
    execution_id = paused_run()
    response = post(loose, f"/reactor/executions/{execution_id}/cancel/", raw)
    assert_refused(response, "parse_error", word)
    assert_untouched(execution_id)


UNSTORABLE_MEMBERS = {
    "reason": (b'{"reason": "a\\u0000b"}', "reason"),
    "step": (b'{"step": "approval\\u0000", "payload": {"approved": true}}', "step"),
    "payload": (_payload(b'"v": "\\udc00"'), "payload"),
    "member-name": (b'{"reason": "x", "y\\u0000": 1}', "non_field_errors"),
}


@pytest.mark.parametrize(("raw", "member"), UNSTORABLE_MEMBERS.values(), ids=UNSTORABLE_MEMBERS)
def test_an_unstorable_member_is_named_as_a_field_error(
    loose: APIClient, raw: bytes, member: str
) -> None:
    execution_id = paused_run()
    action = "cancel" if b"reason" in raw else "resume"
    response = post(loose, f"/reactor/executions/{execution_id}/{action}/", raw)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "parse_error"
    assert list(body["errors"]) == [member], body
    assert "NUL character" in body["errors"][member][0] or "surrogate" in body["errors"][member][0]
    assert_untouched(execution_id)


def test_a_cancel_body_nested_200_levels_deep_is_accepted(loose: APIClient) -> None:
    execution_id = paused_run()
    raw = b'{"reason": "deep", "y": ' + b"[" * 199 + b"]" * 199 + b"}"  # 200 levels in all
    response = post(loose, f"/reactor/executions/{execution_id}/cancel/", raw)
    assert response.status_code == 200, response.content[:300]
    assert Execution.objects.get(pk=execution_id).cancel_reason == "deep"


def test_a_cancel_body_in_another_charset_is_read_and_a_non_text_charset_is_400(
    loose: APIClient,
) -> None:
    first, second = paused_run("C1"), paused_run("C2")
    latin = loose.post(
        f"/reactor/executions/{first}/cancel/",
        '{"reason": "caf\u00e9"}'.encode("latin-1"),
        content_type="application/json; charset=latin-1",
    )
    assert latin.status_code == 200, latin.content
    assert Execution.objects.get(pk=first).cancel_reason == "caf\u00e9"
    zipped = loose.post(
        f"/reactor/executions/{second}/cancel/",
        b'{"reason": "x"}',
        content_type="application/json; charset=bz2_codec",
    )
    assert_refused(zipped, "parse_error", "bz2_codec")
    assert_untouched(second)


def test_a_form_body_is_refused_with_415_not_read(loose: APIClient) -> None:
    execution_id = paused_run()
    response = loose.post(f"/reactor/executions/{execution_id}/cancel/", {"reason": "form"})
    assert response.status_code == 415, response.content
    assert_untouched(execution_id)


# ---------------------------------------------------------------------------- headers


@pytest.mark.parametrize("key", ["a\x00b", "a\udc00b", "\ud800"], ids=["nul", "low", "high"])
def test_an_unstorable_idempotency_key_is_400(loose: APIClient, key: str) -> None:
    execution_id = paused_run()
    raw = resume_body({"approved": True})
    response = post(
        loose, f"/reactor/executions/{execution_id}/resume/", raw, **{"Idempotency-Key": key}
    )
    assert_refused(response, "invalid_header", "Idempotency-Key")
    assert_untouched(execution_id)
    assert not ApiRequest.objects.exists()


def test_a_webhook_id_that_cannot_be_stored_is_400() -> None:
    anonymous = APIClient(raise_request_exception=False)
    execution_id = paused_run()
    raw = resume_body({"approved": True})
    path = f"/reactor/executions/{execution_id}/resume/"
    # Signed correctly over an id with a NUL; a surrogate cannot even be signed (not UTF-8).
    nul = post(anonymous, path, raw, **signed_headers(raw, webhook_id="msg_\x00"))
    surrogate = post(anonymous, path, raw, **{**signed_headers(raw), "webhook-id": "msg_\udc00"})
    for response in (nul, surrogate):
        assert_refused(response, "invalid_header", "webhook-id")
    assert_untouched(execution_id)
    assert not ApiRequest.objects.exists()


def test_verify_refuses_a_webhook_id_or_signature_that_is_not_text() -> None:
    raw = b"{}"
    good = signed_headers(raw, webhook_id="msg_1")
    for spoiled in (
        {**good, "webhook-id": "msg_\udc00"},
        {**good, "webhook-signature": "v1,\udc00"},
        {**good, "webhook-signature": "v1,\u00e9t\u00e9 " + good["webhook-signature"] + "x"},
    ):
        with pytest.raises(signatures.SignatureError):
            signatures.verify(spoiled, raw)
    assert signatures.verify(good, raw).webhook_id == "msg_1"


def test_a_signature_or_token_header_that_is_not_text_is_401() -> None:
    anonymous = APIClient(raise_request_exception=False)
    execution_id = paused_run()
    raw = resume_body({"approved": True})
    path = f"/reactor/executions/{execution_id}/resume/"
    bad_signature = post(
        anonymous, path, raw, **{**signed_headers(raw), "webhook-signature": "v1,\udc00"}
    )
    assert bad_signature.status_code == 401, bad_signature.content
    assert bad_signature.json()["code"] == "bad_signature"
    for token in ("\udc00" * 30, "a" * 29 + "\x00"):
        response = post(anonymous, "/reactor/resume/", raw, **{"Reactor-Resume-Token": token})
        assert response.status_code == 401, response.content
        assert "Reactor-Resume-Token" in response.json()["detail"]
    assert_untouched(execution_id)


# ---------------------------------------------------------------------------- the parser


def test_the_parser_reads_storable_json_and_refuses_the_rest() -> None:
    from django_reactor.api.parsers import StorableJSONParser

    parser = StorableJSONParser()
    body = {"reason": "caf\u00e9 \U0001f600", "n": 10**50, "f": 1.5, "list": [[[]]]}
    assert parser.parse(io.BytesIO(json.dumps(body).encode()), "application/json", {}) == body
    with pytest.raises(ParseError) as refused:
        parser.parse(io.BytesIO(b'{"v": "\\u0000"}'), "application/json", {})
    assert refused.value.status_code == 400
    assert refused.value.detail["code"] == "parse_error"  # type: ignore[index]
    assert "NUL" in refused.value.detail["detail"]  # type: ignore[index]
