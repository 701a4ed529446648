"""Credentials the database could never hold: a NUL in a Basic user name or password (base64
hides it) is refused with 400 before any authentication backend queries, on every endpoint and
on the project's schema view, never a 500."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from rest_framework.test import APIClient

from django_reactor import Paused, services
from django_reactor.models import Execution
from tests.api.conftest import ALL_PERMISSIONS, make_user, resume_body
from tests.api.reactors import ApiRefund

pytestmark = pytest.mark.django_db(transaction=True)


def basic(username: str, password: str = "pw") -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


@pytest.fixture
def paused() -> Any:
    outcome = ApiRefund.run({"order": "N1", "card": "4242"})
    assert isinstance(outcome, Paused)
    return outcome.execution_id


@pytest.fixture
def client() -> APIClient:
    """Anonymous; a server error comes back as a 500 response instead of being raised."""
    return APIClient(raise_request_exception=False)


NUL_CREDENTIALS = {
    "username": basic("ops\x00"),
    "password": basic("ops", "p\x00w"),
    "latin-1": "Basic " + base64.b64encode("op\xe9\x00:pw".encode("latin-1")).decode(),
    "token-scheme": "Token abc\x00def",
}


@pytest.mark.parametrize("header", NUL_CREDENTIALS.values(), ids=NUL_CREDENTIALS)
def test_a_nul_in_the_credentials_is_400_on_every_endpoint(
    client: APIClient, paused: Any, header: str
) -> None:
    make_user("ops", *ALL_PERMISSIONS)
    answers = {
        "list": client.get("/reactor/executions/", HTTP_AUTHORIZATION=header),
        "detail": client.get(f"/reactor/executions/{paused}/", HTTP_AUTHORIZATION=header),
        "cancel": client.post(
            f"/reactor/executions/{paused}/cancel/", {}, format="json", HTTP_AUTHORIZATION=header
        ),
        "resume": client.post(
            f"/reactor/executions/{paused}/resume/",
            resume_body({"approved": True}),
            content_type="application/json",
            HTTP_AUTHORIZATION=header,
        ),
    }
    for label, response in answers.items():
        assert response.status_code == 400, (label, response.content)
        body = response.json()
        assert body["code"] == "invalid_header", label
        assert "NUL character" in body["detail"], label
        assert "\x00" not in response.content.decode(), label  # never echoed back
    assert Execution.objects.get(pk=paused).status == "paused"


def test_the_schema_view_refuses_a_nul_in_a_basic_user_name(client: APIClient) -> None:
    # /api/schema/ is the project's own DRF view: django_reactor's BasicAuthentication guards it.
    response = client.get("/api/schema/", HTTP_AUTHORIZATION=basic("a\x00b"))
    assert response.status_code == 400, response.content
    assert b"NUL character" in response.content  # rendered by the schema view's renderer
    assert client.get("/api/schema/", HTTP_AUTHORIZATION=basic("ops")).status_code == 403
    assert client.get("/api/schema/").status_code == 200


def test_a_resume_token_is_judged_alone_beside_a_nul_basic_header(
    client: APIClient, paused: Any
) -> None:
    token = services.issue_resume_token(paused, "approval")
    response = client.post(
        "/reactor/resume/",
        resume_body({"approved": True}),
        content_type="application/json",
        HTTP_AUTHORIZATION=basic("a\x00b"),
        **{"HTTP_REACTOR_RESUME_TOKEN": token},
    )
    assert response.status_code == 200, response.content
    assert Execution.objects.get(pk=paused).status == "completed"


def test_good_and_merely_wrong_credentials_are_answered_as_before(client: APIClient) -> None:
    make_user("ops", *ALL_PERMISSIONS)
    assert client.get("/reactor/executions/", HTTP_AUTHORIZATION=basic("ops")).status_code == 200
    wrong = client.get("/reactor/executions/", HTTP_AUTHORIZATION=basic("ops", "nope"))
    assert (wrong.status_code, wrong.json()["code"]) == (401, "authentication_failed")
    garbled = client.get("/reactor/executions/", HTTP_AUTHORIZATION="Basic !!!not-base64")
    assert garbled.status_code == 401
