"""The OpenAPI schema: it renders and documents the resume answers, and a schemathesis run
against the WSGI application finds no operation that answers 5xx."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis.configuration import set_hypothesis_home_dir
from rest_framework.test import APIClient
from schemathesis import GenerationMode
from schemathesis.checks import (
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from django_reactor import Paused, services
from django_reactor.models import Execution
from tests.api.conftest import ALL_PERMISSIONS, make_user
from tests.api.reactors import ApiRefund, ApiRefundInBackground
from tests.integration.reactors import FAIL_AT

pytestmark = pytest.mark.django_db(transaction=True)

RESUME_PATHS = [
    "/reactor/executions/{execution_id}/resume/",
    "/reactor/correlations/{correlation_id}/resume/",
    "/reactor/resume/",
]
# Examples per operation: valid requests, invalid ones, and valid ones aimed at each stored run.
# The whole run takes seconds, and the same examples every time (derandomized).
EXAMPLES = 20
NEGATIVE_EXAMPLES = 10
AIMED_EXAMPLES = 8
OPERATIONS = {
    "GET /reactor/executions/",
    "GET /reactor/executions/{id}/",
    "POST /reactor/executions/{id}/cancel/",
    "POST /reactor/executions/{id}/undo/",
    "POST /reactor/executions/{id}/retry/",
    "POST /reactor/executions/{id}/pause/",
    "POST /reactor/executions/{id}/unpause/",
    "POST /reactor/executions/{id}/fork/",
    "POST /reactor/executions/{execution_id}/resume/",
    "POST /reactor/correlations/{correlation_id}/resume/",
    "POST /reactor/resume/",
    "POST /reactor/executions/{execution_id}/messages/{topic}/",
    "POST /reactor/events/{name}/",
    "POST /reactor/bulk/",
    "GET /reactor/bulk/{operation_id}/",
    "POST /reactor/bulk/{operation_id}/stop/",
}
START_PATH = "/reactor/reactors/{name}/runs/"
MESSAGE_PATH = "/reactor/executions/{execution_id}/messages/{topic}/"
EVENT_PATH = "/reactor/events/{name}/"


def test_the_schema_renders_as_openapi_3(anonymous: APIClient) -> None:
    response = anonymous.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    for path in (
        "/reactor/executions/",
        "/reactor/executions/{id}/",
        "/reactor/executions/{id}/cancel/",
        "/reactor/executions/{id}/undo/",
        "/reactor/executions/{id}/retry/",
        *RESUME_PATHS,
    ):
        assert path in paths, sorted(paths)
    listed = {p["name"] for p in paths["/reactor/executions/"]["get"]["parameters"]}
    assert {"reactor", "status", "correlation_id", "created_after", "created_before"} <= listed
    assert {"cursor", "page_size"} <= listed
    yaml = anonymous.get("/api/schema/")
    assert yaml.status_code == 200
    assert yaml.content.startswith(b"openapi: 3.")


def test_the_resume_endpoints_document_their_answers(anonymous: APIClient) -> None:
    paths = anonymous.get("/api/schema/", {"format": "json"}).json()["paths"]
    for path in RESUME_PATHS:
        operation = paths[path]["post"]
        codes = set(operation["responses"])
        assert {
            "200",
            "202",
            "400",
            "401",
            "403",
            "404",
            "409",
            "410",
            "413",
            "422",
            "429",
        } == codes
        for code in ("202", "400", "409", "410"):
            assert operation["responses"][code]["description"], (path, code)
        headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
        assert headers == {
            "Reactor-Resume-Token",
            "Idempotency-Key",
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
        }
        assert "requestBody" in operation
    assert "reactor" in str(paths["/reactor/correlations/{correlation_id}/resume/"])


# The answers each operation really gives (besides the resume endpoints' above).
EXECUTION_RESPONSES = {
    ("/reactor/executions/", "get"): {"200", "400", "401", "403", "404", "405"},
    ("/reactor/executions/{id}/", "get"): {"200", "401", "403", "404", "405"},
    ("/reactor/executions/{id}/cancel/", "post"): {
        "200", "400", "401", "403", "404", "405", "409", "415",
    },
    ("/reactor/executions/{id}/undo/", "post"): {
        "200", "400", "401", "403", "404", "405", "409", "415",
    },
    ("/reactor/executions/{id}/retry/", "post"): {
        "200", "202", "400", "401", "403", "404", "405", "409", "415",
    },
    ("/reactor/executions/{id}/pause/", "post"): {
        "200", "400", "401", "403", "404", "405", "409", "415",
    },
    ("/reactor/executions/{id}/unpause/", "post"): {
        "200", "400", "401", "403", "404", "405", "409", "415",
    },
    ("/reactor/executions/{id}/fork/", "post"): {
        "200", "202", "400", "401", "403", "404", "405", "409", "415",
    },
}  # fmt: skip


def _schema(client: APIClient) -> dict[str, Any]:
    schema: dict[str, Any] = client.get("/api/schema/", {"format": "json"}).json()
    return schema


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        node = schema["components"]["schemas"][name]
    return node


def test_every_execution_operation_documents_its_error_answers(anonymous: APIClient) -> None:
    paths = _schema(anonymous)["paths"]
    for (path, method), codes in EXECUTION_RESPONSES.items():
        responses = paths[path][method]["responses"]
        assert set(responses) == codes, (path, method, sorted(responses))
        for code in codes - {"200"}:
            assert responses[code]["description"], (path, method, code)


def test_every_error_answer_has_the_one_error_shape(anonymous: APIClient) -> None:
    schema = _schema(anonymous)
    error = schema["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"detail", "code"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for code, answer in operation["responses"].items():
                if not code.startswith("4"):
                    continue
                body = answer["content"]["application/json"]["schema"]
                assert body == {"$ref": "#/components/schemas/Error"}, (path, method, code)


def test_request_bodies_are_json_only_and_match_the_serializers(anonymous: APIClient) -> None:
    schema = _schema(anonymous)
    paths = schema["paths"]
    with_body = {
        (p, m) for p, item in paths.items() for m, op in item.items() if "requestBody" in op
    }
    assert with_body == {
        ("/reactor/executions/{id}/cancel/", "post"),
        ("/reactor/executions/{id}/pause/", "post"),
        ("/reactor/executions/{id}/fork/", "post"),
        ("/reactor/executions/{id}/undo/", "post"),
        ("/reactor/executions/{id}/retry/", "post"),
        ("/reactor/executions/{id}/unpause/", "post"),
        *((path, "post") for path in RESUME_PATHS),
        (MESSAGE_PATH, "post"),
        (START_PATH, "post"),
        (EVENT_PATH, "post"),
        ("/reactor/bulk/", "post"),
    }
    for path, method in with_body:
        content = paths[path][method]["requestBody"]["content"]
        assert set(content) == {"application/json"}, (path, sorted(content))
    for operation in ("cancel", "undo", "retry"):
        steer = paths[f"/reactor/executions/{{id}}/{operation}/"]["post"]["requestBody"]
        assert not steer.get("required", False)  # the body is optional
        reason = _resolve(schema, steer["content"]["application/json"]["schema"])
        # A reason without a NUL, or blank.
        assert reason["properties"]["reason"]["oneOf"] == [
            {"type": "string", "pattern": "^[^\\u0000]+$"},
            {"type": "string", "maxLength": 0},
        ]
        assert not reason.get("required")
    for path in RESUME_PATHS:
        body = paths[path]["post"]["requestBody"]
        assert body["required"] is True
        request = _resolve(schema, body["content"]["application/json"]["schema"])
        assert request["required"] == ["payload"]
        step = request["properties"]["step"]
        assert (step["type"], step["minLength"], step["maxLength"]) == ("string", 1, 255)
        payload = request["properties"]["payload"]
        assert payload["type"] == "object"
        assert not payload.get("nullable", False)
    correlation = paths["/reactor/correlations/{correlation_id}/resume/"]["post"]
    request = _resolve(schema, correlation["requestBody"]["content"]["application/json"]["schema"])
    assert request["properties"]["reactor"]["minLength"] == 1
    # A message's body is its payload, any JSON; its topic is a topic name.
    message = paths[MESSAGE_PATH]["post"]
    assert message["requestBody"]["content"]["application/json"]["schema"] == {}
    (topic,) = [p for p in message["parameters"] if p["name"] == "topic"]
    assert topic["schema"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9._:-]*$"
    assert topic["schema"]["maxLength"] == 255
    # A run's inputs: one of the registered reactors' Inputs serializers.
    start = paths[START_PATH]["post"]["requestBody"]["content"]["application/json"]["schema"]
    inputs = _resolve(schema, start)
    assert inputs["oneOf"], inputs


def test_the_schema_says_what_the_validation_refuses(anonymous: APIClient) -> None:
    schema = _schema(anonymous)
    paths = schema["paths"]
    (page_size,) = [
        p for p in paths["/reactor/executions/"]["get"]["parameters"] if p["name"] == "page_size"
    ]
    assert page_size["schema"] == {"type": "integer", "minimum": 1}
    assert "500" in page_size["description"]
    # An empty filter filters nothing (django-filter), and text filters take no NUL.
    filters = {
        p["name"]: p
        for p in paths["/reactor/executions/"]["get"]["parameters"]
        if p["name"] not in ("cursor", "page_size", "database")
    }
    assert set(filters) == {
        "reactor",
        "status",
        "correlation_id",
        "created_after",
        "created_before",
    }
    assert all(p["allowEmptyValue"] is True for p in filters.values())
    assert filters["reactor"]["schema"]["pattern"] == filters["correlation_id"]["schema"]["pattern"]
    assert "\\x00" in filters["reactor"]["schema"]["pattern"]
    no_nul = "^[^\\u0000]+$"
    for name in ("ResumeRequest", "CorrelationResumeRequest"):
        properties = schema["components"]["schemas"][name]["properties"]
        assert properties["step"]["pattern"] == no_nul
    correlation = schema["components"]["schemas"]["CorrelationResumeRequest"]["properties"]
    assert correlation["reactor"]["pattern"] == no_nul
    # The resume endpoints document a closed interrupt's 410 (expired, cancelled, failed).
    for path in RESUME_PATHS:
        gone = paths[path]["post"]["responses"]["410"]
        assert gone["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }


def test_the_resume_endpoints_answer_an_empty_step_and_a_null_payload_with_400(
    anonymous: APIClient,
) -> None:
    user = make_user("schema-checker", "resume_interrupt")
    client = APIClient()
    client.force_authenticate(user)
    paused = ApiRefund.run({"order": "S1", "card": "4242"})
    path = f"/reactor/executions/{paused.execution_id}/resume/"
    for body in ({"step": "", "payload": {"approved": True}}, {"payload": None}):
        response = client.post(path, body, format="json")
        assert response.status_code == 400, (body, response.content)
        assert response.json()["code"] == "invalid"
    assert Execution.objects.get(pk=paused.execution_id).status == "paused"


# ---------------------------------------------------------------------------- schemathesis


def _fuzz(
    operation: Any,
    auth: dict[str, str],
    failures: list[str],
    examples: int,
    mode: GenerationMode = GenerationMode.POSITIVE,
    **fixed: Any,
) -> None:
    @hypothesis_settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(mode, **fixed))
    def check(case: Any) -> None:
        response = case.call(headers=auth)
        # No 5xx, every answer is one the schema documents for the operation, in its shape.
        case.validate_response(
            response,
            checks=[not_a_server_error, status_code_conformance, response_schema_conformance],
        )

    try:
        check()
    except Exception as exc:
        failures.append(f"{operation.label} ({mode.value}) {fixed}: {exc}")


@pytest.fixture
def hypothesis_home(tmp_path: Path) -> Iterator[None]:
    """Hypothesis's files (its constants cache) under tmp_path, not in the repository."""
    set_hypothesis_home_dir(tmp_path / ".hypothesis")
    yield
    set_hypothesis_home_dir(None)


@pytest.mark.usefixtures("hypothesis_home")
def test_no_operation_answers_a_server_error() -> None:
    user = make_user("fuzzer", *ALL_PERMISSIONS)
    auth = {"Authorization": "Basic " + base64.b64encode(f"{user.username}:pw".encode()).decode()}
    # Runs to steer: paused (inline and background), completed, failed.
    paused = ApiRefund.run({"order": "P1", "card": "4242"})
    assert isinstance(paused, Paused)
    ApiRefund.run({"order": "P2", "card": "4242"})
    ApiRefundInBackground.run({})
    done = ApiRefund.run({"order": "D1", "card": "4242"})
    services.resume_interrupt(done.execution_id, step="approval", payload={"approved": True})
    FAIL_AT.add("request")
    failed = ApiRefund.run({"order": "F1", "card": "4242"})
    FAIL_AT.clear()
    assert Execution.objects.get(pk=failed.execution_id).status == "failed"

    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", WSGIHandler())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert OPERATIONS <= {operation.label for operation in operations}
    targets = {
        "execution_id": [str(paused.execution_id), str(uuid.uuid4())],
        "id": [str(paused.execution_id), str(done.execution_id), str(failed.execution_id)],
        "correlation_id": ["api-refund-P2"],
    }
    failures: list[str] = []
    for operation in operations:
        # Every parameter generated: valid requests, then invalid ones.
        _fuzz(operation, auth, failures, EXAMPLES)
        _fuzz(operation, auth, failures, NEGATIVE_EXAMPLES, GenerationMode.NEGATIVE)
        names = {p.name for p in operation.path_parameters}
        for name in names & set(targets):  # and aimed at the stored runs
            for value in targets[name]:
                _fuzz(operation, auth, failures, AIMED_EXAMPLES, path_parameters={name: value})
    assert not failures, "\n\n".join(failures)
