"""The steering actions of ``/executions/{id}/``: cancel, undo, retry, pause, unpause and fork,
each through ``django_reactor.services`` behind its permission (``permissions``), as a mixin of
the executions' view set."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from .. import services
from ..engine.actors import acting_as
from ..engine.outcomes import Dispatched, outcome_data
from ..exceptions import ReactorError
from ..models import Execution
from .answers import (
    ACCESS_ANSWERS,
    REASON_ANSWERS,
    described,
    error_answer,
)
from .credentials import user_actor
from .errors import ApiError, api_error_for, error_response
from .serializers import (
    CancelRequestSerializer,
    ExecutionDetailSerializer,
    ForkRequestSerializer,
    SteerRequestSerializer,
)

#: A fork's outcome that is not the end of its run: it waits for a worker, or for the undo.
_WAITING = frozenset({"pending", "suspended"})


class ExecutionSteering:
    """The actions that change a run (mixed into ``ExecutionViewSet``, whose ``get_object``
    finds the run within the user's scope)."""

    request: Request
    get_object: Callable[[], Execution]
    get_queryset: Callable[[], Any]
    get_serializer_context: Callable[[], dict[str, Any]]

    @extend_schema(request=CancelRequestSerializer, responses=REASON_ANSWERS)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Stop the run without rolling anything back (a running run stops after its step)."""
        row = self.get_object()
        reason = _reason(request)
        return self._steer(lambda: services.cancel(row.id, reason=reason), row)

    @extend_schema(request=SteerRequestSerializer, responses=REASON_ANSWERS)
    @action(detail=True, methods=["post"])
    def undo(self, request: Request, pk: str | None = None) -> Response:
        """Roll back every completed step, newest first."""
        row = self.get_object()
        reason = _reason(request, SteerRequestSerializer)
        return self._steer(lambda: services.undo(row.id, reason=reason), row)

    @extend_schema(
        request=SteerRequestSerializer,
        responses={
            **REASON_ANSWERS,
            200: described("The new run's outcome (it ran in this process)."),
            202: described("The new run went to a worker."),
        },
    )
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        """Run a failed execution again as a new execution."""
        row = self.get_object()
        reason = _reason(request, SteerRequestSerializer)
        try:
            with acting_as(user_actor(request.user)):
                outcome = services.shown_outcome(services.retry(row.id, reason=reason))
        except ReactorError as exc:
            return error_response(api_error_for(exc))
        code = 202 if isinstance(outcome, Dispatched) else 200
        return Response(outcome_data(outcome), status=code)

    @extend_schema(request=CancelRequestSerializer, responses=REASON_ANSWERS)
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str | None = None) -> Response:
        """Pause the run: it stops at its next step boundary and waits, suspended, until
        unpaused (body: an optional reason)."""
        row = self.get_object()
        reason = _reason(request)
        return self._steer(lambda: services.pause(row.id, reason=reason), row)

    @extend_schema(request=SteerRequestSerializer, responses=REASON_ANSWERS)
    @action(detail=True, methods=["post"])
    def unpause(self, request: Request, pk: str | None = None) -> Response:
        """Let a paused run go on where it stopped (a worker takes it)."""
        row = self.get_object()
        reason = _reason(request, SteerRequestSerializer)
        return self._steer(lambda: services.unpause(row.id, reason=reason), row)

    @extend_schema(
        request=ForkRequestSerializer,
        responses={
            200: described(
                "The fork's outcome (it ran in this process), or with dry_run the plan: "
                "from_step, carried, undo (newest first), again, warnings."
            ),
            202: described("The fork went to a worker (or waits for its original's undo)."),
            400: error_answer(
                "The body is not a JSON object (invalid), from_step names no step "
                "(invalid_fork), or the inputs fail the reactor's Inputs (invalid_inputs)."
            ),
            **ACCESS_ANSWERS,
            409: error_answer(
                "The run is still moving (invalid_transition), was re-run already "
                "(invalid_transition), another process holds it (busy), or forking it "
                "abandons completed steps and undo_abandoned was false (fork_needs_undo, with "
                "the plan)."
            ),
            415: error_answer("The body is not application/json (code unsupported_media_type)."),
        },
    )
    @action(detail=True, methods=["post"])
    def fork(self, request: Request, pk: str | None = None) -> Response:
        """Run the run again from a step as a new run that reuses the results of the steps
        before it (``dry_run``: only say what it would do)."""
        row = self.get_object()
        if not isinstance(request.data, dict):
            raise ApiError(400, 'the body must be a JSON object: {"from_step": "..."}')
        body = ForkRequestSerializer(data=request.data)
        if not body.is_valid():
            raise ValidationError(body.errors)
        data = body.validated_data
        try:
            if data.get("dry_run"):
                return Response(services.fork_plan(row.id, data["from_step"]).as_dict())
            with acting_as(user_actor(request.user)):
                outcome = services.shown_outcome(
                    services.fork(
                        row.id,
                        data["from_step"],
                        inputs=data.get("inputs"),
                        undo_abandoned=data.get("undo_abandoned", False),
                        reason=data.get("reason", ""),
                    )
                )
        except ReactorError as exc:
            return error_response(api_error_for(exc))
        code = 200 if outcome.status not in _WAITING else 202
        return Response(outcome_data(outcome), status=code)

    def _steer(self, operation: Callable[[], object], row: Execution) -> Response:
        """Apply ``operation`` as the request's user (the steering history says who)."""
        try:
            with acting_as(user_actor(self.request.user)):
                operation()
        except ReactorError as exc:
            return error_response(api_error_for(exc))
        fresh = self.get_queryset().get(pk=row.pk)
        return Response(
            ExecutionDetailSerializer(fresh, context=self.get_serializer_context()).data
        )


def _reason(
    request: Request,
    serializer: type[CancelRequestSerializer | SteerRequestSerializer] = CancelRequestSerializer,
) -> str:
    """The reason of a steering request's optional body ``{"reason": "..."}`` (its first 1000
    characters); 400 for any other body."""
    # The parser refused what cannot be stored (NUL, lone surrogates) already.
    if not isinstance(request.data, dict):
        raise ApiError(
            400, 'the body must be a JSON object, such as {"reason": "..."}, or empty',
            code="invalid",
        )  # fmt: skip
    body = serializer(data=request.data)
    if not body.is_valid():
        raise ValidationError(body.errors)
    return str(body.validated_data.get("reason", ""))[:1000]
