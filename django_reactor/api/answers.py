"""What the API's endpoints document of their answers (drf-spectacular), shared by the views:
an answer's description, the error shape, the refusals every execution endpoint can give."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse

from .errors import ErrorSerializer
from .serializers import ExecutionDetailSerializer


def described(description: str) -> OpenApiResponse:
    """A documented answer whose body is a JSON object."""
    return OpenApiResponse(OpenApiTypes.OBJECT, description=description)


def error_answer(description: str) -> OpenApiResponse:
    """A documented error answer: ``{"detail", "code", ...}`` (see ``api.errors``)."""
    return OpenApiResponse(ErrorSerializer, description=description)


# The refusals every executions endpoint can answer (DRF's authentication and permissions).
ACCESS_ANSWERS = {
    401: error_answer(
        "No credential, or a wrong one (code not_authenticated or authentication_failed)."
    ),
    403: error_answer("The user lacks the action's permission (code permission_denied)."),
    404: error_answer("No such run, a malformed id, or a run outside the user's API_SCOPE."),
    405: error_answer("The method is not one the endpoint takes (code method_not_allowed)."),
}
STEER_REFUSED = error_answer(
    "The run's status does not allow it (code invalid_transition, with its status), another "
    "process holds the run (busy, Retry-After), or another refusal (refused)."
)


# The answers of a steering action whose optional body gives a reason (cancel, pause).
REASON_ANSWERS = {
    200: ExecutionDetailSerializer,
    400: error_answer(
        "The body is not JSON or holds what cannot be stored (code parse_error, with "
        'errors {"reason": ["why"]} when the reason holds it), the body is not an '
        'object, or reason is not a string (code invalid, errors {"reason": ["why"]}), '
        "or the Authorization header holds a NUL (code invalid_header)."
    ),
    **ACCESS_ANSWERS,
    409: STEER_REFUSED,
    415: error_answer("The body is not application/json (code unsupported_media_type)."),
}
