"""``POST /reactors/{name}/runs/``: start a run of a reactor on a worker.

The body is the run's inputs (a JSON object), validated by the reactor's ``Inputs``
serializer: invalid inputs answer 400 with the field errors and write nothing. Which
credentials may start runs of which reactor is ``REACTOR["START_AUTH"]`` (a user holding
``django_reactor.start_execution``, a signed webhook for the reactor); it accepts none until
a project opts reactors in. An ``Idempotency-Key`` (or the webhook id) starts at most one run:
the key is kept with the run, so a repeat after a crash finds it. Answers 202 with the run's
summary and its URL (also in ``Location``).
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from typing import TYPE_CHECKING, Any

from django.urls import reverse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from .. import services
from ..exceptions import ReactorError
from ..registry import all_reactors
from ..services.guards import reactor_named
from .answers import described, error_answer
from .credentials import Credential, allowed_modes, check_signed_for
from .errors import ApiError, api_error_for, error_response
from .views import (
    CREDENTIAL_PARAMETERS,
    IDEMPOTENCY_HEADER,
    RESUME_RESPONSES,
    ResumeView,
)

if TYPE_CHECKING:
    from ..reactor import Reactor

START_RESPONSES = {
    202: described(
        "Started on a worker (or, for a repeated Idempotency-Key, the run it started): "
        "execution_id, reactor, status, url (also in the Location header)."
    ),
    400: error_answer(
        "The body is not a JSON object or cannot be stored (parse_error, invalid), a header is "
        "malformed (invalid_header), the inputs fail the reactor's Inputs serializer "
        '(invalid_inputs, with errors {"<field>": ["why"]}), or give a business attribute a '
        "value no attribute can hold (invalid_attribute)."
    ),
    401: RESUME_RESPONSES[401],
    403: error_answer("The user lacks start_execution (code permission_denied)."),
    404: error_answer(
        "No reactor has this name (unknown_reactor, with close names in the detail)."
    ),
    409: error_answer("A request with this key is still being answered (in_flight)."),
    413: RESUME_RESPONSES[413],
    422: error_answer("Idempotency key reused for other inputs (idempotency_key_reused)."),
    429: RESUME_RESPONSES[429],
}


class _StartSchema(AutoSchema):
    """The request body: one of the registered reactors' inputs, read when the schema is made
    (reactors register as their modules load, after this module)."""

    def get_request_serializer(self) -> Any:
        return PolymorphicProxySerializer(
            component_name="ReactorInputs",
            serializers=[
                _inputs_for_schema(reactor) for _name, reactor in sorted(all_reactors().items())
            ],
            resource_type_field_name=None,
        )


@functools.cache
def _inputs_for_schema(reactor: type[Reactor]) -> type:
    """The reactor's ``Inputs`` serializer under a name of its own (``CheckoutInputs``), so that
    reactors whose serializers share a class name get a component each."""
    name = reactor.definition.name
    inputs = reactor.definition.inputs_serializer or serializers.Serializer
    component = "".join(part[:1].upper() + part[1:] for part in name.split(".")) + "Inputs"
    return type(component.replace("_", ""), (inputs,), {"__module__": inputs.__module__})


@extend_schema(
    tags=["runs"],
    responses=START_RESPONSES,
    parameters=[
        OpenApiParameter(
            "name",
            OpenApiTypes.STR,
            OpenApiParameter.PATH,
            description="The reactor: its registered name (as reactor_list shows it).",
        ),
        *CREDENTIAL_PARAMETERS[1:],  # not the resume token
    ],
)
class StartView(ResumeView):
    """Start a run of the reactor on a worker, with the body as its inputs."""

    run_keyword = ""  # no run in the URL: the run goes to its reactor's database
    action = "start"
    schema = _StartSchema()

    def _respond(
        self, request: Request, body: bytes, credential: Credential, kwargs: dict[str, Any]
    ) -> Response:
        try:
            inputs = self._load(body)
            self._refuse_token(credential, "start runs")
            reactor = reactor_named(kwargs["name"])
            name = reactor.definition.name
            self._authorize_start(name, credential)
            if not isinstance(inputs, dict):
                raise ApiError(
                    400,
                    f"the body must be a JSON object of the inputs of {name}",
                    code="invalid",
                )
            key = request.headers.get(IDEMPOTENCY_HEADER) or credential.webhook_id
            outcome = services.start(
                reactor, inputs, idempotency_key=_run_key(credential, key) if key else None
            )
        except ApiError as error:
            return error_response(error)
        except ReactorError as exc:
            return error_response(api_error_for(exc))
        assert outcome.execution_id is not None  # a started run has its id
        url = request.build_absolute_uri(_execution_path(request, outcome.execution_id))
        return Response(
            {
                "execution_id": str(outcome.execution_id),
                "reactor": name,
                "status": outcome.status,
                "url": url,
                "idempotent_replay": outcome.idempotent_replay,
            },
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": url},
        )

    def _authorize_start(self, reactor: str, credential: Credential) -> None:
        allowed = allowed_modes(reactor, "START_AUTH", "start", "started")
        if credential.kind not in allowed:
            raise ApiError(
                403 if credential.kind == "user" and not allowed else 401,
                f"runs of {reactor} cannot be started over the API with a {credential.kind} "
                f"credential (accepted: {', '.join(allowed) or 'none'}); the server's "
                "REACTOR['START_AUTH'] setting says which reactors may be started and how",
                code="credential_not_accepted",
            )
        check_signed_for(credential, reactor)


def _run_key(credential: Credential, key: str) -> str:
    """The run's idempotency key for a request key: scoped to the credential (another caller's
    key starts its own run), short enough for any key a request may carry."""
    digest = hashlib.sha256(f"{credential.scope}\x00{key}".encode()).hexdigest()
    return f"api:{digest}"


def _execution_path(request: Request, execution_id: uuid.UUID) -> str:
    """The path of ``GET /executions/{id}/`` under the prefix (and URL namespace) this
    request came through."""
    match = request.resolver_match
    namespace = match.namespace if match is not None else ""
    name = f"{namespace}:execution-detail" if namespace else "execution-detail"
    return reverse(name, kwargs={"pk": str(execution_id)})
