"""``GET /executions/{id}/stream/``: a run's progress as server-sent events, until it ends.

The stream sends the run's trace entries as they are recorded (``event: trace``, each with its
sequence number as the event ``id``), the values its steps publish when they change
(``event: published``), its status when it changes (``event: status``) and, once the run has
ended and every entry was sent, ``event: end``. It reads the database: at once when Redis
announces progress (a step published, the run paused, an async unit finished), and at least
every ``REACTOR["STREAM_POLL_SECONDS"]``. After ``REACTOR["STREAM_MAX_SECONDS"]`` it ends with
``event: timeout``; a client (an ``EventSource`` reconnects by itself) sends the last id it got
in ``Last-Event-ID`` (or ``?after=<seq>``) and the stream goes on from there.

Each open stream holds a worker of a WSGI server for its length: serve streams from an ASGI
server, or a few dedicated WSGI workers, when many clients follow runs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import store
from ..conf import reactor_settings
from ..handle import ExecutionHandle
from ..models import Execution
from ..runtime.maps import displayable
from ..runtime.wakeups import Follower
from ..states import TERMINAL_STATUSES
from .answers import ACCESS_ANSWERS
from .authentication import ApiAuthentication
from .databases import ApiDatabaseMixin
from .errors import ApiError, ApiErrorsMixin, ErrorSerializer
from .permissions import permission_classes, scoped
from .serializers import trace_entry

#: Seconds between the comments that keep an idle connection open through proxies.
KEEP_ALIVE_SECONDS = 15.0


class EventStreamRenderer(BaseRenderer):
    """``text/event-stream``, for the content negotiation of a stream's request (its errors are
    JSON: see ``finalize_response``; one rendered here would be an ``error`` event)."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: dict[str, Any] | None = None,
    ) -> bytes:
        return sse("error", data).encode()


def sse(event: str, data: Any, *, event_id: int | None = None) -> str:
    """One server-sent event: its name, its data as one line of JSON, its id if any."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


class StreamEventSerializer(serializers.Serializer[dict[str, str]]):
    """One server-sent event of a run's stream, as the OpenAPI schema shows it."""

    event = serializers.CharField(help_text="trace, published, status, end or timeout.")
    data = serializers.CharField(help_text="The event's data: one line of JSON.")
    id = serializers.CharField(required=False, help_text="A trace entry's sequence number.")


class ExecutionStreamView(ApiDatabaseMixin, ApiErrorsMixin, ApiAuthentication, APIView):
    """Follow one run: its trace, published values and status, as server-sent events."""

    run_keyword = "execution_id"
    renderer_classes = [EventStreamRenderer, JSONRenderer]
    action = "retrieve"  # reading a run: django_reactor.view_execution

    def get_permissions(self) -> list[BasePermission]:
        return [permission() for permission in permission_classes()]

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        # A refusal is a JSON error, as everywhere in the API, whatever the client accepts: an
        # EventSource gets an HTTP error and stops; a program reads the error's code.
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(
        operation_id="executions_stream",
        summary="Follow a run as server-sent events",
        parameters=[
            OpenApiParameter(
                "after",
                OpenApiTypes.INT,
                description="Send only trace entries after this sequence number (as the "
                "Last-Event-ID header does).",
            )
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                StreamEventSerializer,
                description="Events `trace` (id: its sequence number), `published`, `status`, "
                "then `end` once the run has ended, or `timeout` after "
                'REACTOR["STREAM_MAX_SECONDS"]; each event\'s data is one line of JSON.',
            ),
            (400, "application/json"): OpenApiResponse(
                ErrorSerializer, description="Last-Event-ID (or ?after=) is no sequence number."
            ),
            **{(code, "application/json"): answer for code, answer in ACCESS_ANSWERS.items()},
        },
    )
    def get(self, request: Request, execution_id: str) -> StreamingHttpResponse:
        try:
            run_id = uuid.UUID(execution_id)
        except ValueError:
            raise ApiError(404, f"no execution with id {execution_id!r}") from None
        if not scoped(request, Execution.objects.using(store.using())).filter(pk=run_id).exists():
            raise ApiError(404, f"no execution with id {run_id}")
        after = _after(request)
        response = StreamingHttpResponse(
            _follow(run_id, after, store.bound_alias()), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: send each event as it comes
        return response


def _after(request: Request) -> int:
    raw = request.headers.get("Last-Event-ID") or request.query_params.get("after") or "0"
    try:
        after = int(raw)
    except ValueError:
        raise ApiError(
            400,
            f"Last-Event-ID (or ?after=) must be a trace sequence number, got {raw[:40]!r}",
            code="invalid",
        ) from None
    if after < 0:
        raise ApiError(400, "Last-Event-ID (or ?after=) must be 0 or more", code="invalid")
    return after


def _follow(run_id: uuid.UUID, after: int, alias: str | None) -> Iterator[str]:
    """The events of the stream (the generator the response sends)."""
    # The response is sent after the view returned: bind again the database it found the run in.
    if alias is None:
        yield from _events(run_id, after)
        return
    with store.bound(alias):
        yield from _events(run_id, after)


def _events(run_id: uuid.UUID, after: int) -> Iterator[str]:
    poll = reactor_settings.STREAM_POLL_SECONDS
    ends_at = time.monotonic() + reactor_settings.STREAM_MAX_SECONDS
    follower = Follower(run_id)
    sent_status: tuple[str, str] | None = None
    sent_published: dict[str, Any] = {}
    last_word = time.monotonic()
    try:
        yield "retry: 2000\n\n"
        while True:
            row = Execution.objects.using(store.using()).filter(pk=run_id).first()
            if row is None:  # pruned meanwhile
                yield sse("end", {"status": "deleted"})
                return
            handle = ExecutionHandle(row)
            for entry in handle.trace:
                if entry.seq > after:
                    after = entry.seq
                    yield sse("trace", trace_entry(entry), event_id=entry.seq)
            changed = {
                key: displayable(value)
                for key, value in handle.published.items()
                if key not in sent_published or sent_published[key] != value
            }
            if changed:
                sent_published.update(handle.published)
                yield sse("published", changed)
            status = (row.status, row.current_step)
            if status != sent_status:
                sent_status = status
                yield sse("status", {"status": row.status, "current_step": row.current_step})
            if row.status in TERMINAL_STATUSES:
                yield sse("end", {"status": row.status})
                return
            now = time.monotonic()
            if now >= ends_at:
                yield sse("timeout", {"last_event_id": after})
                return
            if now - last_word >= KEEP_ALIVE_SECONDS:
                last_word = now
                yield ": keep-alive\n\n"
            follower.wait(min(poll, ends_at - now))
    finally:
        follower.close()
