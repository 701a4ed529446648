"""``POST /executions/{id}/messages/{topic}/``: a message to a run's mailbox.

The body is the message's payload (any JSON). It takes the credentials of the resume
endpoints (``REACTOR["RESUME_AUTH"]``: a user with the ``resume_interrupt`` permission or a
signed webhook; a resume token names one interrupt, so it is refused here), checked in their
order, with their rate limit, body limit and ``Idempotency-Key`` (or webhook id).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from .. import services, store
from ..engine.constructs.receive import TOPIC_MAX_LENGTH, TOPIC_PATTERN
from ..engine.outcomes import InProgress
from ..exceptions import ReactorError
from .answers import described, error_answer
from .errors import ApiError, api_error_for, error_response
from .views import (
    CREDENTIAL_PARAMETERS,
    IDEMPOTENCY_HEADER,
    RESUME_RESPONSES,
    Credential,
    ResumeView,
    _execution_id,
)

MESSAGE_RESPONSES = {
    **RESUME_RESPONSES,
    200: described("The run was paused at a receive of the topic and went on inline."),
    202: described(
        "Kept: the run takes it at a receive of the topic (status, detail), or a worker runs "
        "the rest of the run."
    ),
    400: error_answer(
        "The body is not JSON or cannot be stored (parse_error), a header is malformed "
        "(invalid_header), or the topic is no topic name (invalid_message)."
    ),
    404: error_answer(
        "No such run (not_found), or its reactor receives nothing on the topic "
        "(unknown_topic, with its topics)."
    ),
    409: error_answer("The run ended (invalid_transition), or it is a composed child."),
    422: error_answer("Idempotency key reused for another message."),
}


@extend_schema(
    tags=["messages"],
    request={"application/json": OpenApiTypes.ANY},
    responses=MESSAGE_RESPONSES,
    parameters=[
        OpenApiParameter("execution_id", OpenApiTypes.UUID, OpenApiParameter.PATH),
        OpenApiParameter(
            "topic",
            {"type": "string", "maxLength": TOPIC_MAX_LENGTH},
            OpenApiParameter.PATH,
            pattern=f"^{TOPIC_PATTERN.pattern}$",
            description="The topic a receive() step of the run's reactor takes.",
        ),
        *CREDENTIAL_PARAMETERS[1:],  # not the resume token
    ],
)
class MessageView(ResumeView):
    """Send a message (the body, any JSON) to a run on a topic; a receive of it takes it."""

    def _respond(
        self, request: Request, body: bytes, credential: Credential, kwargs: dict[str, Any]
    ) -> Response:
        try:
            payload = self._load(body)
            self._refuse_token(credential, "send messages")
            execution_id = _execution_id(kwargs["execution_id"])
            row = store.get_row(execution_id)
            self._authorize_run(request, row.reactor, row.id, credential)
            key = request.headers.get(IDEMPOTENCY_HEADER) or credential.webhook_id
            outcome = services.shown_outcome(
                services.send(row.id, kwargs["topic"], payload, idempotency_key=key)
            )
        except ApiError as error:
            return error_response(error)
        except ReactorError as exc:
            return error_response(api_error_for(exc))
        if isinstance(outcome, InProgress):
            return Response(
                {
                    "execution_id": str(outcome.execution_id),
                    "status": outcome.status,
                    "detail": "kept: the run takes this message at a receive of its topic",
                },
                status=status.HTTP_202_ACCEPTED,
            )
        return self._answer(outcome, credential)
