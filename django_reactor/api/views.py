"""API views: executions (read, cancel, undo, retry) and interrupt resumes.

Every change goes through :mod:`django_reactor.services`. Resume endpoints take one of three
credentials (``REACTOR["RESUME_AUTH"]``): a user with the ``resume_interrupt`` permission, a
signed webhook, or a resume token in the ``Reactor-Resume-Token`` header. They check, in order:
the rate limit, the body size, the credential (the signature over the raw body before anything
is parsed), the ``Idempotency-Key`` (or webhook id), then the body, then the interrupt.

Every view parses JSON only, with :class:`~django_reactor.api.parsers.StorableJSONParser`: a
body the database could not store is a 400 before anything runs.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.utils.decorators import method_decorator
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_view,
)
from rest_framework import status, viewsets
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from .. import services, store
from ..conf import reactor_settings
from ..engine.actors import acting_as
from ..engine.outcomes import Dispatched, InProgress, Outcome, outcome_data
from ..engine.serialization import unstorable
from ..exceptions import (
    NotWaiting,
    ReactorError,
)
from ..models import Execution, Interrupt
from ..services.databases import across_databases
from . import signatures
from .answers import ACCESS_ANSWERS, described, error_answer
from .authentication import ApiAuthentication
from .credentials import Credential, allowed_modes, check_signed_for, user_actor
from .databases import DATABASE_PARAMETER, ApiDatabaseMixin
from .errors import ApiError, ApiErrorsMixin, api_error_for, error_response
from .filters import ExecutionFilterBackend, ExecutionFilterSet
from .parsers import BodyRefused, StorableJSONParser, load
from .permissions import permission_classes, scoped
from .serializers import (
    CorrelationResumeRequestSerializer,
    ExecutionDetailSerializer,
    ExecutionSerializer,
    ResumeRequestSerializer,
)
from .steering import ExecutionSteering
from .throttling import ResumeRateThrottle

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from rest_framework.permissions import BasePermission


TOKEN_HEADER = "Reactor-Resume-Token"
# Answers a repeat of the request (same key, same body) gets again. Others (401, 403, 404, a
# retryable 409, 429, 5xx) may change: a run reaches its interrupt, a secret is added.
FINAL_ANSWERS = frozenset({200, 202, 400, 409, 410, 413})
MAX_JSON_DEPTH = 32
IDEMPOTENCY_HEADER = "Idempotency-Key"
# ---------------------------------------------------------------------------- executions


class ExecutionPagination(CursorPagination):
    """Newest first by a cursor on the creation time: each page is an index range on
    (created_at, id), never a count or an offset over the runs (the id breaks ties); a list
    narrowed by attributes pages on the attribute index's copy of them
    (``store.attributes.newest_first``)."""

    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def paginate_queryset(
        self, queryset: QuerySet[Execution], request: Request, view: object = None
    ) -> list[Execution] | None:
        try:
            return super().paginate_queryset(queryset, request, view)
        except DjangoValidationError:  # a forged cursor whose position is not a date
            raise NotFound(self.invalid_cursor_message) from None

    def get_ordering(
        self, request: Request, queryset: QuerySet[Execution], view: object
    ) -> tuple[str, ...]:
        return tuple(store.attributes.newest_first(queryset))

    def get_page_size(self, request: Request) -> int:
        """``page_size`` when given: a whole number of at least 1 (a 400 naming the parameter
        otherwise, never a silent default), at most ``max_page_size``."""
        name = self.page_size_query_param
        raw = request.query_params.get(name)
        if raw is None:
            return self.page_size
        if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
            raise ValidationError(
                {name: [f"must be a whole number from 1 (up to {self.max_page_size} are "
                        f"returned), got {raw[:40]!a}"]}
            )  # fmt: skip
        return min(int(raw), self.max_page_size)

    def get_schema_operation_parameters(self, view: object) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1}
                parameter["description"] = (
                    f"Runs per page (default {self.page_size}); more than "
                    f"{self.max_page_size} gives {self.max_page_size}."
                )
        return parameters


@extend_schema(tags=["executions"])
@extend_schema_view(
    retrieve=extend_schema(responses={200: ExecutionDetailSerializer, **ACCESS_ANSWERS}),
)
@method_decorator(transaction.non_atomic_requests, name="dispatch")
class ExecutionViewSet(
    ExecutionSteering,
    ApiDatabaseMixin,
    ApiErrorsMixin,
    ApiAuthentication,
    viewsets.ReadOnlyModelViewSet[Execution],
):
    """Read executions; cancel, undo, retry, pause, unpause or fork one (each needs its
    permission)."""

    run_keyword = "pk"

    parser_classes = [StorableJSONParser]
    pagination_class = ExecutionPagination
    filter_backends = [ExecutionFilterBackend]
    filterset_class = ExecutionFilterSet
    lookup_value_regex = "[^/]+"  # a malformed id is a JSON 404 from get_object

    def get_permissions(self) -> list[BasePermission]:
        return [permission() for permission in permission_classes()]

    def get_queryset(self) -> QuerySet[Execution]:
        # The list is filtered by ExecutionFilterSet (filter_queryset); a run's detail reads its
        # interrupts itself (those of its paused composed children too, by path).
        return scoped(self.request, Execution.objects.all())

    def get_serializer_class(self) -> type[ExecutionSerializer | ExecutionDetailSerializer]:
        return ExecutionSerializer if self.action == "list" else ExecutionDetailSerializer

    def get_object(self) -> Execution:
        execution_id = _execution_id(str(self.kwargs[self.lookup_field]))
        try:
            # Its successor (continue-as-new) joined, not read by the serializer on its own.
            row: Execution = self.get_queryset().select_related("continued_as").get(pk=execution_id)
        except Execution.DoesNotExist:
            raise ApiError(404, f"no execution with id {execution_id}") from None
        self.check_object_permissions(self.request, row)
        return row

    @extend_schema(
        parameters=[
            OpenApiParameter(
                DATABASE_PARAMETER,
                OpenApiTypes.STR,
                description="When REACTOR['DATABASE'] routes reactors to several databases: "
                "the one to list (default: the database of ?reactor=, else the default one).",
            )
        ],
        responses={
            200: ExecutionSerializer(many=True),
            400: error_answer(
                'A filter or page_size is wrong: code invalid, errors {"<parameter>": ["why"]}; '
                "or the Authorization header holds a NUL (code invalid_header)."
            ),
            **ACCESS_ANSWERS,
            404: error_answer("The cursor is not one the API made."),
        },
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Executions, newest first (cursor pagination), filtered by the query parameters.

        Besides the parameters below, ``attr.<key>=<value>`` keeps the runs whose business
        attribute ``<key>`` (``Meta.attributes``, ``context.set_attribute``) is ``<value>``
        (``?attr.customer_id=42``; several are ANDed; a wrong key or value is a 400 naming
        the parameter)."""
        return super().list(request, *args, **kwargs)


def _execution_id(text: str) -> uuid.UUID:
    """An execution id from the URL; anything else is a 404 (no run has that id)."""
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ApiError(
            404, f"{text!r} is not an execution id (a UUID such as {uuid.UUID(int=0)})"
        ) from None


# ---------------------------------------------------------------------------- resume


RESUME_RESPONSES = {
    200: described("Resumed inline: the run's outcome."),
    202: described("Accepted: a worker runs the rest."),
    400: error_answer(
        "The body is not JSON or cannot be stored (parse_error), the request is "
        "invalid (invalid), a header is malformed (invalid_header), the step names no "
        "interrupt of the run's reactor (unknown_interrupt, with the valid paths), or the "
        "payload is invalid (invalid_payload, with field errors).",
    ),
    401: error_answer("No credential, or a wrong one (with a WWW-Authenticate challenge)."),
    403: error_answer(
        "The user lacks resume_interrupt (code permission_denied).",
    ),
    404: error_answer("No such run, interrupt or token."),
    409: error_answer("Already resumed, or not waiting yet."),
    410: error_answer("Expired or cancelled."),
    413: error_answer("Body too large."),
    422: error_answer("Idempotency key reused."),
    429: error_answer("Too many requests."),
}
CREDENTIAL_PARAMETERS = [
    OpenApiParameter(TOKEN_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER),
    OpenApiParameter(IDEMPOTENCY_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER),
    OpenApiParameter(signatures.ID_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER),
    OpenApiParameter(signatures.TIMESTAMP_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER),
    OpenApiParameter(signatures.SIGNATURE_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER),
]


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class ResumeView(ApiDatabaseMixin, ApiErrorsMixin, ApiAuthentication, APIView):
    """Deliver a payload to an interrupt (base of the three resume endpoints)."""

    run_keyword = "execution_id"

    permission_classes: list[type[BasePermission]] = []
    throttle_classes = [ResumeRateThrottle]
    parser_classes = [StorableJSONParser]  # _parse reads the raw body the same way
    request_serializer: type = ResumeRequestSerializer
    action = "resume"

    def post(self, request: Request, **kwargs: str) -> Response:
        try:
            body = self._read_body(request)
            credential = self._authenticate(request, body)
        except ApiError as error:
            return error_response(error)
        key = request.headers.get(IDEMPOTENCY_HEADER) or credential.webhook_id
        if not key:
            return self._respond(request, body, credential, kwargs)
        try:
            _check_header(IDEMPOTENCY_HEADER, key)
        except ApiError as error:
            return error_response(error)
        reservation = store.request_keys.reserve(
            credential.scope,
            key,
            store.request_keys.fingerprint(request.method, request.path, body),
        )
        if reservation.state == "replay":
            return Response(
                reservation.response,
                status=reservation.status_code,
                headers={"Idempotent-Replayed": "true"},
            )
        if reservation.state == "in_flight":
            busy = ApiError(
                409, "a request with this key is still being answered", code="in_flight"
            )
            busy.headers["Retry-After"] = "1"
            return error_response(busy)
        if reservation.state == "mismatch":
            return error_response(
                ApiError(
                    422,
                    "this key was used for a request with another body; use a new key",
                    code="idempotency_key_reused",
                )
            )
        assert reservation.row_id is not None
        try:
            # Kept alive while the request runs (an inline resume runs the rest of the run),
            # so a repeat gets in_flight; only a dead process's reservation is taken over.
            with store.request_keys.kept(reservation.row_id):
                response = self._respond(request, body, credential, kwargs)
        except BaseException:
            store.request_keys.release(reservation.row_id)
            raise
        if response.status_code in FINAL_ANSWERS and "Retry-After" not in response:
            store.request_keys.finish(reservation.row_id, response.status_code, response.data)
        else:
            store.request_keys.release(reservation.row_id)  # a retry may be answered differently
        return response

    # -- the steps, in order

    def _read_body(self, request: Request) -> bytes:
        limit = reactor_settings.API_MAX_BODY_BYTES
        try:
            declared = int(request.headers.get("Content-Length") or 0)
        except ValueError:
            raise ApiError(
                400, "the Content-Length header is not a number", code="invalid_header"
            ) from None
        too_big = ApiError(413, f"the body is larger than {limit} bytes", code="too_large")
        if declared > limit:
            raise too_big
        try:
            body = request.body
        except RequestDataTooBig:
            raise too_big from None
        if len(body) > limit:
            raise too_big
        return body

    def _authenticate(self, request: Request, body: bytes) -> Credential:
        kind = _credential_kind(request)
        if kind == "token":
            token = request.headers[TOKEN_HEADER]
            # Tokens are URL-safe base64; anything else (NUL, surrogates) cannot be one.
            if not (20 <= len(token) <= 200 and token.isascii() and token.isprintable()):
                raise ApiError(
                    401, f"the {TOKEN_HEADER} header is not a resume token", code="bad_token"
                )
            return Credential(
                "token",
                f"token:{store.interrupts.token_hash(token)}",
                token=token,
                who="resume token",
            )
        if kind == "webhook":
            webhook_id = request.headers.get(signatures.ID_HEADER)
            if webhook_id:  # signed, then stored as the key: it must be storable text
                _check_header(signatures.ID_HEADER, webhook_id, max_length=None)
            try:
                verified = signatures.verify(request.headers, body)
            except signatures.SignatureError as exc:
                raise ApiError(401, str(exc), code="bad_signature") from None
            return Credential(
                "webhook",
                f"webhook:{verified.group}",
                group=verified.group,
                webhook_id=verified.webhook_id,
                who=f"webhook signed with the {verified.group!r} secrets",
            )
        user = request.user
        if not (user and user.is_authenticated):
            raise ApiError(
                401,
                "authenticate: a resume token, a signed webhook or a user with the "
                "resume_interrupt permission",
                code="not_authenticated",
            )
        for permission in [p() for p in permission_classes()]:
            if not permission.has_permission(request, self):
                message = getattr(permission, "message", "") or "permission denied"
                raise ApiError(403, str(message), code="permission_denied")
        return Credential("user", f"user:{user.pk}", who=user_actor(user).who)

    def perform_authentication(self, request: Request) -> None:
        """Authenticate the user only when the user is the credential.

        The documented order is the resume token, then the webhook signature, then the user:
        a request with a token or a signature is judged by it alone, so user credentials beside
        it (a wrong password, a stale session) refuse nothing, and its rate limit counts per
        client address.
        """
        if _credential_kind(request) == "user":
            super().perform_authentication(request)
            return
        anonymous = api_settings.UNAUTHENTICATED_USER
        request.user = anonymous() if anonymous else None
        request.auth = None

    def _respond(
        self, request: Request, body: bytes, credential: Credential, kwargs: dict[str, Any]
    ) -> Response:
        try:
            data = self._parse(body)
            try:
                row = self._interrupt(request, data, credential, kwargs)
            except NotWaiting:
                # Kept until the run reaches the interrupt: the run's reactor says who may.
                execution = store.get_row(kwargs["execution_id"])
                self._authorize_run(request, execution.reactor, execution.id, credential)
                with acting_as(credential.actor):
                    kept = services.keep_delivery(
                        execution.id,
                        data.get("step"),
                        data["payload"],
                        background=None,
                        reason=data.get("reason", ""),
                    )
                return self._answer(services.shown_outcome(kept), credential)
            # Found by correlation id or token in whichever database holds it: work there.
            with store.bound_to(row):
                self._authorize(request, row, credential)
                with acting_as(credential.actor):
                    delivered = services.deliver(
                        row, data["payload"], reason=data.get("reason", "")
                    )
                outcome = services.shown_outcome(delivered)
        except ApiError as error:
            return error_response(error)
        except ReactorError as exc:
            return error_response(api_error_for(exc, quiet=credential.kind == "token"))
        return self._answer(outcome, credential)

    def _load(self, body: bytes) -> Any:
        """The body's JSON: the raw body (its signature was checked over these bytes),
        whatever the Content-Type says, through the parser every view uses."""
        try:
            return load(body, max_depth=MAX_JSON_DEPTH)
        except BodyRefused as exc:
            fields = {"errors": exc.errors} if exc.errors else {}
            raise ApiError(400, exc.message, code="parse_error", **fields) from None

    def _refuse_token(self, credential: Credential, action: str) -> None:
        """Refuse a resume token where it does not apply: it names one interrupt."""
        if credential.kind == "token":
            raise ApiError(
                401,
                f"a resume token names one interrupt; {action} with a user or a signed "
                "webhook credential",
                code="credential_not_accepted",
            )

    def _parse(self, body: bytes) -> dict[str, Any]:
        parsed = self._load(body)
        if not isinstance(parsed, dict):
            raise ApiError(
                400, 'the body must be a JSON object: {"step": ..., "payload": {...}}',
                code="invalid",
            )  # fmt: skip
        serializer = self.request_serializer(data=parsed)
        if not serializer.is_valid():
            raise ApiError(400, "the request is invalid", code="invalid", errors=serializer.errors)
        return dict(serializer.validated_data)

    def _interrupt(
        self, request: Request, data: dict[str, Any], credential: Credential, kwargs: dict[str, Any]
    ) -> Interrupt:
        raise NotImplementedError  # each endpoint names the run its own way

    def _authorize(self, request: Request, row: Interrupt, credential: Credential) -> None:
        # The run that resumes: for an interrupt of a composed child, the run at the top.
        where = store.interrupts.nesting(row)
        self._authorize_run(request, where.reactor, where.top_id, credential, also=row.reactor)

    def _authorize_run(
        self,
        request: Request,
        reactor: str,
        execution_id: uuid.UUID,
        credential: Credential,
        *,
        also: str = "",
    ) -> None:
        """Whether ``credential`` may deliver to the run ``execution_id`` of ``reactor`` (a
        webhook may be signed for ``also``, the reactor of the composed child it names)."""
        allowed = allowed_modes(reactor)
        if credential.kind not in allowed:
            raise ApiError(
                401,
                f"runs of {reactor} cannot be resumed with a {credential.kind} credential "
                f"(accepted: {', '.join(allowed) or 'none'})",
                code="credential_not_accepted",
            )
        if credential.kind == "user" and not _visible(request, execution_id):
            raise ApiError(404, f"no execution with id {execution_id}", code="not_found")
        check_signed_for(credential, reactor, also=also)

    def _answer(self, outcome: Outcome, credential: Credential) -> Response:
        if isinstance(outcome, Dispatched):
            return Response(
                {
                    "execution_id": str(outcome.execution_id),
                    "status": outcome.status,
                    "detail": "accepted: a worker runs the rest of the run",
                },
                status=status.HTTP_202_ACCEPTED,
            )
        if isinstance(outcome, InProgress):
            return Response(
                {
                    "execution_id": str(outcome.execution_id),
                    "status": outcome.status,
                    "detail": "accepted: the run is already moving and records this payload",
                },
                status=status.HTTP_202_ACCEPTED,
            )
        if credential.kind != "user":  # outside senders see where the run stands, no more
            return Response({"execution_id": str(outcome.execution_id), "status": outcome.status})
        return Response(outcome_data(outcome))


def _credential_kind(request: Request) -> str:
    """Which credential a resume request carries, in the documented order."""
    if request.headers.get(TOKEN_HEADER) is not None:
        return "token"
    if request.headers.get(signatures.SIGNATURE_HEADER) is not None:
        return "webhook"
    return "user"


def _check_header(name: str, value: str, *, max_length: int | None = 255) -> None:
    """Refuse (400) a key header too long or holding what the database cannot store."""
    if max_length is not None and len(value) > max_length:
        raise ApiError(
            400, f"the {name} header is longer than {max_length} characters; send a shorter key",
            code="invalid_header",
        )  # fmt: skip
    reason = unstorable(value)
    if reason is not None:
        raise ApiError(
            400, f"the {name} header cannot be stored ({reason}); send a key of plain text",
            code="invalid_header",
        )  # fmt: skip


def _visible(request: Request, execution_id: uuid.UUID) -> bool:
    return bool(scoped(request, Execution.objects.filter(pk=execution_id)).exists())


@extend_schema(
    tags=["interrupts"],
    request=ResumeRequestSerializer,
    responses=RESUME_RESPONSES,
    parameters=CREDENTIAL_PARAMETERS,
)
class ExecutionResumeView(ResumeView):
    """Resume a paused run by its execution id: ``{"step": ..., "payload": {...}}``."""

    def _interrupt(
        self, request: Request, data: dict[str, Any], credential: Credential, kwargs: dict[str, Any]
    ) -> Interrupt:
        execution_id = _execution_id(kwargs["execution_id"])
        if credential.kind == "user" and not _visible(request, execution_id):
            raise ApiError(404, f"no execution with id {execution_id}", code="not_found")
        if credential.kind == "token":
            row = _by_token(credential)
            if store.interrupts.nesting(row).top_id != execution_id or not _names(row, data):
                raise ApiError(404, "not found", code="not_found")
            return row
        return services.find_interrupt(execution_id=execution_id, step=data.get("step"))


@extend_schema(
    tags=["interrupts"],
    request=CorrelationResumeRequestSerializer,
    responses=RESUME_RESPONSES,
    parameters=CREDENTIAL_PARAMETERS,
)
class CorrelationResumeView(ResumeView):
    """Resume the run waiting under a correlation id: ``{"step", "reactor", "payload"}``."""

    request_serializer = CorrelationResumeRequestSerializer

    def _interrupt(
        self, request: Request, data: dict[str, Any], credential: Credential, kwargs: dict[str, Any]
    ) -> Interrupt:
        correlation_id = kwargs["correlation_id"]
        if credential.kind == "token":
            row = _by_token(credential)
            if row.correlation_id != correlation_id or not _names(row, data):
                raise ApiError(404, "not found", code="not_found")
            return row
        return services.find_interrupt(
            correlation_id=correlation_id, reactor=data.get("reactor"), step=data.get("step")
        )


@extend_schema(
    tags=["interrupts"],
    request=ResumeRequestSerializer,
    responses=RESUME_RESPONSES,
    parameters=CREDENTIAL_PARAMETERS,
)
class TokenResumeView(ResumeView):
    """Resume the interrupt a resume token was issued for (the token names the run)."""

    def _interrupt(
        self, request: Request, data: dict[str, Any], credential: Credential, kwargs: dict[str, Any]
    ) -> Interrupt:
        if credential.kind != "token":
            raise ApiError(
                401, f"this endpoint takes a resume token in the {TOKEN_HEADER} header",
                code="not_authenticated",
            )  # fmt: skip
        row = _by_token(credential)
        if not _names(row, data):
            raise ApiError(404, "not found", code="not_found")
        return row


def _by_token(credential: Credential) -> Interrupt:
    assert credential.token is not None
    return across_databases(store.interrupts.find_by_token)(credential.token)


def _names(row: Interrupt, data: dict[str, Any]) -> bool:
    """Whether the body's ``step`` (if any) names the interrupt ``row``: its step, or its path
    from the run that paused for it."""
    step = data.get("step")
    return step is None or step in (row.step, store.interrupts.nesting(row).path)
