"""Serializers of the API: executions as read, and the bodies of resume and cancel requests.

Outcomes are answered as ``engine.outcomes.outcome_data`` writes them.
"""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from .. import store
from ..display import duration_seconds
from ..handle import ExecutionHandle, TraceEvent
from ..models import Execution, Interrupt, Message
from ..runtime.maps import displayable
from ..states import StepStatus


class ExecutionSerializer(serializers.ModelSerializer[Execution]):
    """One execution in a list: no inputs, steps or trace."""

    duration_ms = serializers.SerializerMethodField()

    class Meta:
        model = Execution
        fields = [
            "id",
            "reactor",
            "status",
            "current_step",
            "parent",
            "retry_of",
            "fork_step",
            "continued_from",
            "generation",
            "concurrency_key",
            "throttle_key",
            "debounce_key",
            "batch_key",
            "batch_size",
            "queue",
            "priority",
            "created_at",
            "started_at",
            "updated_at",
            "finished_at",
            "duration_ms",
        ]
        read_only_fields = fields

    def get_duration_ms(self, row: Execution) -> float | None:
        """From ``started_at`` to ``finished_at`` in milliseconds; None until both are known."""
        return milliseconds(duration_seconds(row.started_at, row.finished_at))


def milliseconds(seconds: float | None) -> float | None:
    """A :func:`~django_reactor.display.duration_seconds` in milliseconds, to the microsecond."""
    return None if seconds is None else round(seconds * 1000, 3)


class InterruptSerializer(serializers.ModelSerializer[Interrupt]):
    """An interrupt of a run (never its token or payload)."""

    step = serializers.SerializerMethodField(
        help_text="The interrupt's step; for an interrupt of a composed child paused under the "
        "run, its path from the run (checkout.approval), as a resume names it."
    )

    @extend_schema_field(OpenApiTypes.STR)
    def get_step(self, row: Interrupt) -> str:
        return store.interrupts.path_of(row)

    class Meta:
        model = Interrupt
        fields = [
            "step",
            "status",
            "correlation_id",
            "expires_at",
            "invalid_attempts",
            "max_attempts",
            "resume_mode",
            "created_at",
            "closed_at",
        ]
        read_only_fields = fields


class MessageSerializer(serializers.ModelSerializer[Message]):
    """A message of a run's mailbox (never its payload): unread, consumed or invalid."""

    class Meta:
        model = Message
        fields = [
            "id",
            "topic",
            "kind",
            "status",
            "errors",
            "consumed_by_step",
            "created_at",
            "consumed_at",
        ]
        read_only_fields = fields


class ExecutionDetailSerializer(ExecutionSerializer):
    """One execution with its business attributes, redacted inputs, result or failure, what it
    published, steps, trace, interrupts and messages."""

    attributes = serializers.SerializerMethodField()
    inputs = serializers.SerializerMethodField()
    published = serializers.SerializerMethodField()
    steps = serializers.SerializerMethodField()
    trace = serializers.SerializerMethodField()
    interrupts = serializers.SerializerMethodField()
    messages = serializers.SerializerMethodField()
    maps = serializers.SerializerMethodField()
    pause = serializers.SerializerMethodField()
    continued_as = serializers.SerializerMethodField()

    class Meta(ExecutionSerializer.Meta):
        fields = [
            *ExecutionSerializer.Meta.fields,
            "continued_as",
            "pause",
            "idempotency_key",
            "attributes",
            "inputs",
            "result",
            "failure",
            "published",
            "steps",
            "trace",
            "interrupts",
            "messages",
            "maps",
        ]
        read_only_fields = fields

    def _handle(self, row: Execution) -> ExecutionHandle:
        cache = self.context.setdefault("handles", {})
        if row.pk not in cache:
            cache[row.pk] = ExecutionHandle(row)
        return cache[row.pk]

    @extend_schema_field(serializers.UUIDField(allow_null=True))
    def get_continued_as(self, row: Execution) -> str | None:
        """The run this one continued as (a step returned ContinueAsNew), or null."""
        try:
            successor = row.continued_as  # joined by the view when it read the run
        except Execution.DoesNotExist:
            return None
        return str(successor.pk)

    @extend_schema_field(serializers.DictField(child=serializers.CharField()))
    def get_attributes(self, row: Execution) -> dict[str, str]:
        """The run's business attributes (``Meta.attributes``, ``context.set_attribute``) by
        key, each value as text: what ``?attr.<key>=<value>`` finds it by."""
        return self._handle(row).attributes

    # drf-spectacular reads these methods' return types for the schema: Any is "any JSON".
    def get_inputs(self, row: Execution) -> Any:
        return self._handle(row).inputs

    @extend_schema_field(
        inline_serializer(
            "ExecutionPause",
            {
                "reason": serializers.CharField(),
                "by": serializers.CharField(),
                "reactor_paused": serializers.BooleanField(),
            },
            allow_null=True,
        )
    )
    def get_pause(self, row: Execution) -> dict[str, Any] | None:
        """The operator's pause that holds the run (its own, else its reactor's), or null."""
        return self._handle(row).pause_info

    @extend_schema_field(serializers.DictField())
    def get_published(self, row: Execution) -> dict[str, Any]:
        """What the run's steps published (``context.publish``), the latest value by key."""
        return {key: displayable(value) for key, value in self._handle(row).published.items()}

    def get_steps(self, row: Execution) -> list[dict[str, Any]]:
        return [
            {
                "name": s.name,
                "status": s.status,
                "attempts": s.attempts,
                "arguments": s.arguments,
                "result": displayable(s.result),
                "error": s.error.to_dict() if s.error else None,
                "rollback": s.rollback,
                "rollback_error": s.rollback_error,
                "started_at": s.started_at,
                "finished_at": s.finished_at,
                "duration_ms": milliseconds(duration_seconds(s.started_at, s.finished_at)),
            }
            for s in self._handle(row).steps
        ]

    @extend_schema_field(InterruptSerializer(many=True))
    def get_interrupts(self, row: Execution) -> list[dict[str, object]]:
        """The run's interrupts, and those of its composed children paused under it."""
        rows = store.interrupts.of_run(row.pk, paused=False)
        waiting = {s.name for s in self._handle(row).steps if s.status == StepStatus.WAITING}
        if waiting - {i.step for i in rows}:  # a composed child waits at interrupts of its own
            rows = store.interrupts.of_run(row.pk)
        return InterruptSerializer(rows, many=True).data

    @extend_schema_field(MessageSerializer(many=True))
    def get_messages(self, row: Execution) -> list[dict[str, object]]:
        """The messages sent to the run, in send order: those still unread are shown with a
        run that ended without taking them."""
        return MessageSerializer(store.messages.of_run(row.pk), many=True).data

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_maps(self, row: Execution) -> list[dict[str, object]]:
        """Each map step's summary: totals by outcome and up to 25 sampled failures."""
        return self._handle(row).maps

    def get_trace(self, row: Execution) -> list[dict[str, Any]]:
        return [trace_entry(e) for e in self._handle(row).trace]


def trace_entry(entry: TraceEvent) -> dict[str, Any]:
    """One trace entry as the API shows it (a run's detail, its stream)."""
    return {
        "seq": entry.seq,
        "kind": entry.kind,
        "step": entry.step,
        "attempt": entry.attempt,
        "at": entry.at,
        "duration_ms": entry.duration_ms,
        "data": entry.data,
    }


#: Text the database can store: no NUL. DRF's CharField refuses one already; this says so in
#: the OpenAPI schema (a ``pattern``), which schema-driven clients and fuzzers read. It wants a
#: character: a blank value never reaches validators (DRF answers it first), and for a field
#: that may be blank drf-spectacular offers the empty string as the other branch of a oneOf.
NO_NUL_PATTERN = r"^[^\x00]+$"
NO_NUL = RegexValidator(NO_NUL_PATTERN, message="Null characters are not allowed.")


class TextField(serializers.CharField):
    """A CharField that takes a JSON string only (DRF's also turns numbers into text), with
    the schema saying it refuses a NUL."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators.append(NO_NUL)

    def to_internal_value(self, data: object) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


@extend_schema_field(OpenApiTypes.OBJECT)
class PayloadField(serializers.JSONField):
    """A resume payload: any JSON object (not null; other values are invalid payloads)."""


class ResumeRequestSerializer(serializers.Serializer[dict[str, object]]):
    """The body of a resume request."""

    step = TextField(
        required=False,
        min_length=1,
        max_length=255,
        help_text="The interrupt; optional when one waits. An interrupt of a composed child is "
        "named by its path from the run, dotted (checkout.approval).",
    )
    payload = PayloadField(help_text="A JSON object, validated by the interrupt's serializer.")
    reason = TextField(
        required=False,
        allow_blank=True,
        max_length=1000,
        help_text="Why, kept with who delivered it on the run's trace and in the steering history.",
    )


class CorrelationResumeRequestSerializer(ResumeRequestSerializer):
    """The body of a resume by correlation id: a resume request, and the reactor's name."""

    reactor = TextField(
        required=False,
        min_length=1,
        max_length=255,
        help_text="The reactor's registered name, when several reactors share correlation ids.",
    )


class ForkRequestSerializer(serializers.Serializer[dict[str, object]]):
    """The body of a fork request."""

    from_step = TextField(
        max_length=255,
        help_text="The step the fork runs again from (the earlier ones are carried).",
    )
    inputs = serializers.DictField(
        required=False,
        help_text="The fork's inputs (validated by the reactor's Inputs); default: the run's.",
    )
    undo_abandoned = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Undo the abandoned branch (completed steps past from_step whose effects "
        "stand), newest first, before the fork runs; without it such a fork is refused (409).",
    )
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="Only answer the plan; change nothing."
    )
    reason = TextField(
        required=False,
        allow_blank=True,
        help_text="Why, kept with who asked on the run's trace and in the steering history.",
    )


class SteerRequestSerializer(serializers.Serializer[dict[str, object]]):
    """The optional body of an undo or a retry request."""

    reason = TextField(
        required=False,
        allow_blank=True,
        help_text="Why, kept with who asked on the run's trace and in the steering history; "
        "the first 1000 characters are kept.",
    )


class CancelRequestSerializer(serializers.Serializer[dict[str, object]]):
    """The optional body of a cancel or a pause request."""

    reason = TextField(
        required=False,
        allow_blank=True,
        help_text="Why, stored with the run and shown in its trace; the first 1000 characters "
        "are kept.",
    )
