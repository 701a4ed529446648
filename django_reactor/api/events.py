"""``POST /events/{name}/``: emit an event (``services.emit``) from a signed webhook.

Only signed webhooks emit events: a Standard Webhooks signature with one of the
``REACTOR["WEBHOOK_SECRETS"]`` under ``"default"`` (a secret listed for one reactor signs for
that reactor's runs only, and an event reaches any reactor's). Which events may be emitted is
``REACTOR["EVENT_AUTH"]``, by event name; it accepts none until a project opts events in.

The body is a JSON object with three optional members::

    {"payload": {"refund_id": "re_1", "amount": 500}, "key": "ch_42", "event_id": "evt_9"}

``payload`` is the event's payload (any JSON; null without it), ``key`` what
``wait_for_event(match=...)`` and ``Meta.cancel_on`` compare (a text or an integer), and
``event_id`` the event's id (without it, the ``webhook-id`` header: a sender's redelivery of a
message is the same event). Any other member is refused, so a misspelt one is not lost. The
request's rate limit, body limit and ``Idempotency-Key`` (or webhook id) are the resume
endpoints': a redelivery of a delivery gets its first answer again, with
``Idempotent-Replayed: true``. Answers 202 with what the event did; nothing is written when it
is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils.decorators import method_decorator
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import services
from ..conf import ByEvent, reactor_settings
from ..engine.constructs.events import check_event_name
from ..engine.constructs.receive import TOPIC_MAX_LENGTH, TOPIC_PATTERN
from ..exceptions import InvalidEvent, ReactorError, UnknownEvent
from ..services.events import event_names
from .answers import described, error_answer
from .credentials import Credential
from .errors import ApiError, api_error_for, error_response
from .views import (
    CREDENTIAL_PARAMETERS,
    RESUME_RESPONSES,
    ResumeView,
    _credential_kind,
)

logger = logging.getLogger("django_reactor.api")

#: The members an event's body may have.
EVENT_MEMBERS = ("payload", "key", "event_id")

#: The ``Event.source`` of the events this endpoint emits.
SOURCE = "webhook"

EVENT_RESPONSES = {
    202: described(
        "Emitted (or emitted before with this event id: replay true): event_id, replay, and "
        "the ids of the runs it started, was given to, resumed and cancelled, with errors "
        "(what could not be done, such as a trigger's refused inputs)."
    ),
    400: error_answer(
        "The body is not JSON or cannot be stored (parse_error), is not an object of payload, "
        "key and event_id (invalid, with errors), a header is malformed (invalid_header), or "
        "the event cannot be emitted: a name that is no event name, a key or event id that is "
        "no short text, a payload too large, an event id first emitted with another key or "
        "payload (invalid_event)."
    ),
    401: error_answer(
        "Not a signed webhook (not_authenticated, credential_not_accepted), a signature that "
        "does not verify or a webhook-timestamp outside REACTOR['WEBHOOK_TOLERANCE'] "
        "(bad_signature), or an event REACTOR['EVENT_AUTH'] does not open "
        "(credential_not_accepted)."
    ),
    404: error_answer(
        "No registered reactor waits for, starts on or cancels on the event (unknown_event, "
        "with events: the names they do)."
    ),
    409: error_answer("A request with this webhook id is still being answered (in_flight)."),
    413: RESUME_RESPONSES[413],
    422: error_answer("The webhook id was used for another body (idempotency_key_reused)."),
    429: RESUME_RESPONSES[429],
}


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "minLength": 1, "maxLength": 255},
            {"type": "integer"},
        ]
    }
)
class ShortTextField(serializers.JSONField):
    """A text of at most 255 characters or an integer, as ``services.emit`` takes a key and an
    event id (it refuses any other value: InvalidEvent, answered 400)."""


class EventRequestSerializer(serializers.Serializer[dict[str, object]]):
    """The body of ``POST /events/{name}/``: every member optional, no other allowed."""

    payload = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text="The event's payload: any JSON (null without it).",
    )
    key = ShortTextField(
        required=False,
        allow_null=True,
        help_text="What wait_for_event(match=...) and Meta.cancel_on compare, such as an order "
        "id. Without it, only the waits without match take the event.",
    )
    event_id = ShortTextField(
        required=False,
        allow_null=True,
        help_text="The event's id: the same id again (with the same key and payload) does "
        "nothing new. Default: the webhook-id header.",
    )


@extend_schema(
    tags=["events"],
    request=EventRequestSerializer,
    responses=EVENT_RESPONSES,
    parameters=[
        OpenApiParameter(
            "name",
            {"type": "string", "maxLength": TOPIC_MAX_LENGTH},
            OpenApiParameter.PATH,
            pattern=f"^{TOPIC_PATTERN.pattern}$",
            description="The event's name, as a reactor's wait_for_event() or on_event() "
            "declares it (such as charge.refunded).",
        ),
        *CREDENTIAL_PARAMETERS[1:],  # not the resume token
    ],
)
@method_decorator(transaction.non_atomic_requests, name="dispatch")
class EventView(ResumeView):
    """Emit the event ``name`` from a signed webhook: ``{"payload", "key", "event_id"}``."""

    action = "emit"

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # No database is bound: services.emit keeps the event in each database runs are
        # written to (a trigger starts its run where that reactor's runs are).
        return APIView.dispatch(self, request, *args, **kwargs)

    def _authenticate(self, request: Request, body: bytes) -> Credential:
        kind = _credential_kind(request)
        if kind == "webhook":
            return super()._authenticate(request, body)
        signing = (
            "sign the request with a secret of REACTOR['WEBHOOK_SECRETS'] (Standard Webhooks: "
            "the webhook-id, webhook-timestamp and webhook-signature headers)"
        )
        user = request.user
        if kind == "token" or (user and user.is_authenticated):
            what = "a resume token" if kind == "token" else "a user"
            raise ApiError(
                401,
                f"events are emitted over HTTP by signed webhooks only, not by {what}; "
                f"{signing}, or call django_reactor.emit() in your own view",
                code="credential_not_accepted",
            )
        raise ApiError(
            401, f"events are emitted over HTTP by signed webhooks only: {signing}",
            code="not_authenticated",
        )  # fmt: skip

    def _respond(
        self, request: Request, body: bytes, credential: Credential, kwargs: dict[str, Any]
    ) -> Response:
        try:
            data = self._event_body(body)
            name = check_event_name(kwargs["name"])
            known = event_names()
            if name not in known:
                raise _unknown(name, tuple(sorted(known)))
            self._authorize_event(name, credential)
            event_id = data.get("event_id")
            emitted = services.emit(
                name,
                data.get("payload"),
                key=data.get("key"),
                event_id=credential.webhook_id if event_id is None else event_id,
                source=SOURCE,
            )
        except ApiError as error:
            return error_response(error)
        except UnknownEvent as exc:  # emit looks again; answered as the look above
            return error_response(_unknown(kwargs["name"], exc.known, str(exc)))
        except InvalidEvent as exc:
            return error_response(ApiError(400, str(exc), code="invalid_event"))
        except ReactorError as exc:
            return error_response(api_error_for(exc))
        return Response(
            {
                "name": emitted.name,
                "event_id": emitted.event_id,
                "replay": emitted.replay,
                "started": [str(run) for run in emitted.started],
                "given": [str(run) for run in emitted.given],
                "resumed": [str(run) for run in emitted.resumed],
                "cancelled": [str(run) for run in emitted.cancelled],
                "errors": list(emitted.errors),
            },
            status=status.HTTP_202_ACCEPTED,
        )

    def _event_body(self, body: bytes) -> dict[str, Any]:
        parsed = self._load(body)
        example = '{"payload": {...}, "key": "...", "event_id": "..."}'
        if not isinstance(parsed, dict):
            raise ApiError(
                400, f"the body must be a JSON object: {example}, every member optional",
                code="invalid",
            )  # fmt: skip
        unknown = sorted(set(parsed) - set(EVENT_MEMBERS))
        if unknown:
            raise ApiError(
                400,
                f"the body has members an event does not take: {', '.join(unknown)}; send "
                f"{example} (the event's own data goes in payload)",
                code="invalid",
                errors={member: ["not a member of an event's body"] for member in unknown},
            )
        serializer = EventRequestSerializer(data=parsed)
        if not serializer.is_valid():
            raise ApiError(400, "the request is invalid", code="invalid", errors=serializer.errors)
        return dict(serializer.validated_data)

    def _authorize_event(self, name: str, credential: Credential) -> None:
        allowed = allowed_event_modes(name)
        if credential.kind not in allowed:
            raise ApiError(
                401,
                f"event {name!r} cannot be emitted over the API with a {credential.kind} "
                f"credential (accepted: {', '.join(allowed) or 'none'}); the server's "
                "REACTOR['EVENT_AUTH'] setting says which events may be emitted",
                code="credential_not_accepted",
            )
        if credential.group != ByEvent.DEFAULT_KEY:
            raise ApiError(
                401,
                f"the webhook secret that signed this request is listed for {credential.group} "
                "in REACTOR['WEBHOOK_SECRETS'], and signs for its runs only; events are signed "
                'with the secrets under "default"',
                code="bad_signature",
            )


def allowed_event_modes(name: str) -> list[str]:
    """The credentials ``REACTOR["EVENT_AUTH"]`` accepts for emitting the event ``name``.

    Fails closed: while a key of the dict names no event a registered reactor declares (a typo,
    check E015), the events it does not name accept nothing, for the key may have been meant
    for any of them, and ``"default"`` could accept more than it meant to.
    """
    setting = reactor_settings.EVENT_AUTH
    if not isinstance(setting, Mapping):
        return [str(mode) for mode in setting or ()]
    if name in setting:
        return [str(mode) for mode in setting[name] or ()]
    known = event_names()
    unknown = [key for key in ByEvent.event_keys(setting) if key not in known]
    if unknown:
        logger.error(
            "refused to emit event %r: REACTOR['EVENT_AUTH'] has entries for %s, which no "
            "registered reactor waits for, starts on or cancels on, so no credential is "
            "accepted for the events it does not name (check django_reactor.E015)",
            name,
            ", ".join(repr(key) for key in unknown),
        )
        raise ApiError(
            401,
            f"event {name!r} cannot be emitted through the API until the server's "
            "REACTOR['EVENT_AUTH'] setting is fixed (it names an event no reactor declares; "
            "its operators see check django_reactor.E015)",
            code="credential_not_accepted",
        )
    return [str(mode) for mode in setting.get(ByEvent.DEFAULT_KEY, ()) or ()]


def _unknown(name: str, known: tuple[str, ...], detail: str = "") -> ApiError:
    return ApiError(
        404,
        detail
        or (
            f"no registered reactor waits for, starts on or cancels on event {name!r} (the "
            f"events they do: {', '.join(known) or 'none'})"
        ),
        code="unknown_event",
        events=list(known),
    )
