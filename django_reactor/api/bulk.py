"""``/bulk/``: one steering action on every run a filter matches, previewed and durable.

``POST /bulk/`` with ``{"action", "filter", "parameters", "reason", "dry_run"}`` answers the
preview (``dry_run``) or starts the operation on a worker (202, with its URL); ``GET
/bulk/{id}/`` says where it stands; ``POST /bulk/{id}/stop/`` stops it. Starting and stopping
need the permission the action needs on one run (``retry_execution`` for a retry or a fork,
``cancel_execution``, ...); reading needs ``view_execution``. ``REACTOR["API_SCOPE"]`` narrows
the runs a user's filter can reach, as it narrows the executions list.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.urls import reverse
from django.utils.decorators import method_decorator
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotAuthenticated, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import services
from ..engine.actors import acting_as
from ..exceptions import ReactorError
from ..services.bulk import ACTIONS, BulkProgress
from .answers import described, error_answer
from .authentication import ApiAuthentication
from .credentials import user_actor
from .errors import ApiError, ApiErrorsMixin, api_error_for, error_response
from .parsers import StorableJSONParser
from .permissions import scoped
from .serializers import TextField

ANSWERS = {
    401: error_answer("No credential, or a wrong one (not_authenticated, authentication_failed)."),
    403: error_answer("The user lacks the permission the action needs (permission_denied)."),
}


class BulkRequestSerializer(serializers.Serializer[dict[str, object]]):
    """The body of ``POST /bulk/``."""

    action = serializers.ChoiceField(choices=sorted(ACTIONS), help_text="What to do to each run.")
    filter = serializers.DictField(
        help_text="Which runs: reactor, status (a text or a list), step, error, created_after, "
        "created_before, id (a list), attr.<name>; at least one.",
    )
    parameters = serializers.DictField(
        required=False,
        default=dict,
        help_text="fork: from_step, undo_abandoned; cancel, pause: reason; resume: step, payload.",
    )
    reason = TextField(required=False, allow_blank=True, default="", max_length=1000)
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="Only answer the preview; change nothing."
    )


def _user(request: Request, permission: str) -> None:
    user = request.user
    if not (user and user.is_authenticated):
        raise NotAuthenticated()
    if not user.has_perm(f"django_reactor.{permission}"):
        raise PermissionDenied(f"you lack the django_reactor.{permission} permission")


def _answer(request: Request, progress: BulkProgress, status: int = 200) -> Response:
    url = request.build_absolute_uri(reverse("django_reactor:bulk-detail", args=[progress.id]))
    return Response({**progress.as_dict(), "url": url}, status=status, headers={"Location": url})


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class BulkView(ApiErrorsMixin, ApiAuthentication, APIView):
    """Preview or start a bulk operation."""

    parser_classes = [StorableJSONParser]
    permission_classes: list[Any] = []

    @extend_schema(
        tags=["bulk"],
        request=BulkRequestSerializer,
        responses={
            200: described(
                "The preview (dry_run): count, by_status, does, and a sample with what each "
                "run would undo."
            ),
            202: described("Started on a worker: the operation (id, status, total, url)."),
            400: error_answer(
                "The body is wrong (invalid, with errors), or the filter or the parameters "
                "(invalid_filter)."
            ),
            **ANSWERS,
        },
    )
    def post(self, request: Request) -> Response:
        if not (request.user and request.user.is_authenticated):
            raise NotAuthenticated()  # before the body: its errors are for who may send it
        if not isinstance(request.data, dict):
            raise ApiError(400, "the body must be a JSON object: {action, filter, ...}")
        body = BulkRequestSerializer(data=request.data)
        if not body.is_valid():
            raise ValidationError(body.errors)
        data = body.validated_data
        action = ACTIONS[data["action"]]
        _user(request, action.permission)
        try:
            run_filter = services.RunFilter.parse(data["filter"])
            run_filter = _scoped(request, run_filter)
            if data["dry_run"]:
                preview = services.preview_bulk(action.name, run_filter, data["parameters"])
                return Response(preview.as_dict())
            with acting_as(user_actor(request.user)):
                progress = services.start_bulk(
                    action.name, run_filter, data["parameters"], reason=data["reason"]
                )
        except ReactorError as exc:
            return error_response(api_error_for(exc))
        return _answer(request, progress, status=202)


class BulkDetailView(ApiErrorsMixin, ApiAuthentication, APIView):
    """Where a bulk operation stands."""

    permission_classes: list[Any] = []

    @extend_schema(
        tags=["bulk"],
        responses={
            200: described("The operation: status, total, done, skipped, failed, left."),
            **ANSWERS,
            404: error_answer("No bulk operation has this id (not_found)."),
        },
    )
    def get(self, request: Request, operation_id: str) -> Response:
        _user(request, "view_execution")
        return _answer(request, _progress(operation_id))


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class BulkStopView(ApiErrorsMixin, ApiAuthentication, APIView):
    """Stop a bulk operation: the runs not taken care of yet are left alone."""

    permission_classes: list[Any] = []

    @extend_schema(
        tags=["bulk"],
        request=None,
        responses={
            200: described("The operation, stopped (or as it ended, when it had)."),
            **ANSWERS,
            404: error_answer("No bulk operation has this id (not_found)."),
        },
    )
    def post(self, request: Request, operation_id: str) -> Response:
        progress = _progress(operation_id)
        _user(request, ACTIONS[progress.action].permission)
        with acting_as(user_actor(request.user)):
            return _answer(request, services.stop_bulk(progress.id))


def _progress(operation_id: str) -> BulkProgress:
    try:
        return services.bulk_progress(uuid.UUID(operation_id))
    except (ValueError, ReactorError):
        raise ApiError(404, f"no bulk operation with id {operation_id}") from None


def _scoped(request: Request, run_filter: services.RunFilter) -> services.RunFilter:
    """The filter, narrowed by ``API_SCOPE`` for this request's user."""
    from dataclasses import replace

    return replace(run_filter, narrow=lambda runs: scoped(request, runs))
