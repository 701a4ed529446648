"""The API's one error format, for every endpoint and status.

Every error answer is a JSON object with a human-readable ``detail`` and a stable,
machine-readable ``code``; errors about fields of the request add ``errors`` (field name to
messages), and some codes add fields of their own (``retryable``, ``status``, ``attempts``...).
``docs/reference/api.md`` lists the codes. Authentication follows one rule: no credential, or a
wrong one, is 401 with a ``WWW-Authenticate`` challenge; a valid credential without the
permission is 403.

DRF's own exceptions (validation, parsing, 404, 405, 415, throttling) are reshaped by
:func:`exception_handler`, which the API's views use whatever the project's
``REST_FRAMEWORK["EXCEPTION_HANDLER"]`` is, and any path under the API's prefix that names no
endpoint answers with :func:`endpoint_not_found` instead of Django's HTML page.
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..exceptions import (
    AlreadyResumed,
    ExecutionBusy,
    ExecutionNotFound,
    ForkNeedsUndo,
    IdempotencyKeyReused,
    InterruptClosed,
    InvalidAttribute,
    InvalidFilter,
    InvalidFork,
    InvalidInputs,
    InvalidMessage,
    InvalidPayload,
    InvalidTransition,
    NotWaiting,
    ReactorError,
    ReactorNotRegistered,
    UnknownInterrupt,
    UnknownTopic,
)

#: The challenge of a 401 when no authentication class offers one (session login).
SESSION_CHALLENGE = 'Session realm="django_reactor"'

#: The code of an error DRF raised, by its status, when its own code says less.
CODES_BY_STATUS = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "refused",
    410: "gone",
    413: "too_large",
    415: "unsupported_media_type",
    422: "unprocessable",
    429: "throttled",
}


class ApiError(Exception):
    """Answer the request with ``status_code`` and ``{"detail", "code", ...extra}``."""

    def __init__(self, status_code: int, detail: str, *, code: str = "", **extra: object) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.data: dict[str, object] = {
            "detail": detail,
            "code": code or CODES_BY_STATUS.get(status_code, "error"),
        }
        self.data.update(extra)
        self.headers: dict[str, str] = {}
        if status_code == 401:
            self.headers["WWW-Authenticate"] = SESSION_CHALLENGE


def error_response(error: ApiError) -> Response:
    return Response(error.data, status=error.status_code, headers=error.headers)


class ErrorSerializer(serializers.Serializer[dict[str, object]]):
    """The shape of every error answer, as the OpenAPI schema shows it."""

    detail = serializers.CharField(help_text="What went wrong, for a person.")
    code = serializers.CharField(help_text="What went wrong, for a program: a stable word.")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="With code invalid or invalid_payload: the messages of each field.",
    )
    paths = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="With code unknown_interrupt: the interrupts the run's reactor can wait at, "
        "by path (approval, checkout.approval).",
    )


def exception_handler(exc: Exception, context: dict[str, object]) -> Response | None:
    """DRF's handler, then its answer in the API's error format (see the module)."""
    if isinstance(exc, ApiError):
        return error_response(exc)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # not an API exception: Django's 500 handling
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        # DRF answers 403 when the first authentication class has no challenge (sessions).
        response.status_code = 401
        if "WWW-Authenticate" not in response:
            response["WWW-Authenticate"] = SESSION_CHALLENGE
    response.data = _body(exc, response.status_code, response.data)
    return response


def _body(exc: Exception, status_code: int, data: object) -> dict[str, object]:
    if isinstance(exc, exceptions.ValidationError):
        if isinstance(data, dict) and "detail" in data and "code" in data:
            return data  # raised in this format already (the body parser's refusals)
        errors = data if isinstance(data, dict) else {"non_field_errors": data}
        return {"detail": "the request is invalid", "code": "invalid", "errors": errors}
    if isinstance(data, dict) and isinstance(data.get("detail"), str):
        detail = data["detail"]
        code = data.get("code")
    else:
        detail, code = str(data), None
    if not isinstance(code, str) or not code:
        codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else None
        code = codes if isinstance(codes, str) else CODES_BY_STATUS.get(status_code, "error")
    body = {**data} if isinstance(data, dict) else {}
    body.update(detail=detail, code=code)
    if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
        body["retry_after"] = int(exc.wait) + 1
    return body


def endpoint_not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    """A path under the API's prefix that names no endpoint: a JSON 404, not Django's page."""
    return JsonResponse(
        {"detail": f"no API endpoint at {request.path}", "code": "not_found"}, status=404
    )


class ApiErrorsMixin:
    """Makes a DRF view answer errors in this module's format."""

    def get_exception_handler(self) -> Callable[[Exception, dict[str, object]], Response | None]:
        return exception_handler


#: Seconds a refusal that will not last (busy, not waiting yet) asks a caller to wait.
RETRY_AFTER_SECONDS = "5"


def api_error_for(exc: ReactorError, *, quiet: bool = False) -> ApiError:
    """The HTTP answer to a service's refusal. ``quiet``: no details for outside senders."""
    if isinstance(exc, UnknownInterrupt) and not quiet:
        return ApiError(400, str(exc), code="unknown_interrupt", paths=list(exc.paths))
    if isinstance(exc, UnknownTopic):
        return ApiError(404, str(exc), code="unknown_topic", topics=list(exc.topics))
    if isinstance(exc, InvalidMessage):
        return ApiError(400, str(exc), code="invalid_message")
    if isinstance(exc, InvalidInputs):
        return ApiError(400, str(exc), code="invalid_inputs", errors=exc.errors)
    if isinstance(exc, InvalidAttribute):  # a value from the inputs no attribute can hold
        return ApiError(400, str(exc), code="invalid_attribute")
    if isinstance(exc, ReactorNotRegistered):
        return ApiError(404, str(exc), code="unknown_reactor")
    if isinstance(exc, IdempotencyKeyReused):
        return ApiError(422, str(exc), code="idempotency_key_reused")
    if isinstance(exc, ExecutionNotFound):  # InterruptNotFound too
        return ApiError(404, "not found" if quiet else str(exc), code="not_found")
    if isinstance(exc, NotWaiting):
        error = ApiError(409, str(exc), code="not_waiting", retryable=True)
        error.headers["Retry-After"] = RETRY_AFTER_SECONDS
        return error
    if isinstance(exc, AlreadyResumed):
        return ApiError(409, str(exc), code="already_resumed")
    if isinstance(exc, InterruptClosed):
        return ApiError(410, str(exc), code=exc.reason)
    if isinstance(exc, InvalidPayload):
        return ApiError(
            400,
            str(exc),
            code="invalid_payload",
            errors=exc.errors,
            attempts=exc.attempts,
            max_attempts=exc.max_attempts,
            run_failed=exc.run_failed,
        )
    if isinstance(exc, ExecutionBusy):
        error = ApiError(409, str(exc), code="busy", retryable=True)
        error.headers["Retry-After"] = RETRY_AFTER_SECONDS
        return error
    if isinstance(exc, InvalidFilter):
        return ApiError(400, str(exc), code="invalid_filter")
    if isinstance(exc, InvalidFork):
        return ApiError(400, str(exc), code="invalid_fork")
    if isinstance(exc, ForkNeedsUndo):
        return ApiError(
            409, str(exc), code="fork_needs_undo", status=exc.status, plan=exc.plan.as_dict()
        )
    if isinstance(exc, InvalidTransition):
        return ApiError(409, str(exc), code="invalid_transition", status=exc.status)
    return ApiError(409, str(exc), code="refused")
