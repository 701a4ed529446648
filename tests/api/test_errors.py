"""One error format for every endpoint and status: ``{"detail", "code", ...}`` in JSON, 401 for
no credential or a wrong one, 403 for a valid one without the permission."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.api.conftest import client_for, user_with
from tests.api.reactors import ApiRefund

pytestmark = pytest.mark.django_db

MISSING = "00000000-0000-0000-0000-000000000000"


def error_of(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert isinstance(body["detail"], str), body
    assert body["detail"], body
    return body


def test_a_malformed_or_unknown_execution_id_is_a_json_404(operator: APIClient) -> None:
    for path in ("/reactor/executions/not-a-uuid/", "/reactor/executions/not-a-uuid/cancel/"):
        method = operator.get if path.endswith("uuid/") else operator.post
        body = error_of(method(path), 404, "not_found")
        assert "'not-a-uuid' is not an execution id" in body["detail"]
    body = error_of(operator.get(f"/reactor/executions/{MISSING}/"), 404, "not_found")
    assert body["detail"] == f"no execution with id {MISSING}"
    resume = operator.post("/reactor/executions/nope/resume/", {"payload": {}}, format="json")
    assert "is not an execution id" in error_of(resume, 404, "not_found")["detail"]


def test_a_path_under_the_prefix_that_names_no_endpoint_is_a_json_404(
    operator: APIClient,
) -> None:
    body = error_of(operator.get("/reactor/nothing/here/"), 404, "not_found")
    assert body["detail"] == "no API endpoint at /reactor/nothing/here/"


def test_a_method_or_media_type_the_endpoint_does_not_take(operator: APIClient) -> None:
    error_of(operator.post("/reactor/executions/", {}, format="json"), 405, "method_not_allowed")
    error_of(operator.delete(f"/reactor/executions/{uuid.uuid4()}/"), 405, "method_not_allowed")
    paused = ApiRefund.run({"order": "E1", "card": "4242"})
    refused = operator.post(
        f"/reactor/executions/{paused.execution_id}/cancel/", "reason=x", content_type="text/plain"
    )
    error_of(refused, 415, "unsupported_media_type")


def test_no_credential_is_401_with_a_challenge_and_no_permission_is_403() -> None:
    anonymous = APIClient()
    for path in ("/reactor/executions/", f"/reactor/executions/{MISSING}/"):
        refused = anonymous.get(path)
        error_of(refused, 401, "not_authenticated")
        assert refused["WWW-Authenticate"]
    resume = anonymous.post(
        f"/reactor/executions/{MISSING}/resume/", {"payload": {}}, format="json"
    )
    error_of(resume, 401, "not_authenticated")
    assert resume["WWW-Authenticate"]
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Basic bm9ib2R5Om5vcGU=")  # nobody:nope
    error_of(wrong.get("/reactor/executions/"), 401, "authentication_failed")
    without = client_for(user_with("cancel_execution"))
    body = error_of(without.get("/reactor/executions/"), 403, "permission_denied")
    assert "django_reactor.view_execution" in body["detail"]


def test_field_errors_name_their_fields_under_errors(operator: APIClient) -> None:
    body = error_of(operator.get("/reactor/executions/?created_after=soon"), 400, "invalid")
    assert body["detail"] == "the request is invalid"
    assert "ISO 8601" in body["errors"]["created_after"][0]
    bad_cursor = error_of(operator.get("/reactor/executions/?cursor=zzz"), 404, "not_found")
    assert bad_cursor["detail"]
