"""The executions list's filters, as a django-filter ``FilterSet``.

Query parameters: ``reactor``, ``status`` (one or several, comma-separated), ``correlation_id``,
``created_after``, ``created_before`` and ``attr.<key>`` (a business attribute, several ANDed:
``?attr.customer_id=42&attr.tenant=acme``). A wrong value is a 400 in the API's error format,
``errors`` naming the parameter (DRF's ``ValidationError``, reshaped by ``api.errors``). Every
filter keeps the list on an index: ``status`` and ``reactor`` lead an index with
``(created_at, id)``, the dates are a range of ``(created_at, id)``, a correlation id is a
semi-join on the interrupts' index (no join that repeats runs, so no ``DISTINCT``), and
attributes are ``store.with_attributes``: the list is then paged on the attribute index's copy
of ``(created_at, id)`` (``ExecutionPagination``).

Messages carry the value as a parameter (``%(value)s``), never inside the message itself:
django-filter formats every message with its parameters, and a ``%`` typed by the client would
be read as a placeholder.

The OpenAPI schema says what the filters take (:class:`ExecutionFilterScheme`): an empty value
filters nothing (``allowEmptyValue``, as django-filter reads it), and text has no NUL (which a
text field refuses).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import django_filters
from django import forms
from django.apps import apps
from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django_filters.fields import BaseCSVField
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.contrib.django_filters import DjangoFilterExtension
from rest_framework.exceptions import ValidationError as BadRequest

from .. import store
from ..engine import timevalues
from ..engine.attributes import canonical, check_key
from ..exceptions import InvalidAttribute, InvalidTime
from ..models import Execution, Interrupt
from ..states import ExecutionStatus
from .serializers import NO_NUL_PATTERN

if TYPE_CHECKING:
    from drf_spectacular.openapi import AutoSchema
    from rest_framework.request import Request


class StatusesField(BaseCSVField):
    """Comma-separated statuses (spaces around them allowed), each one known."""

    def clean(self, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        names = [part.strip() for part in value if part.strip()]
        unknown = sorted(set(names) - set(ExecutionStatus.values))
        if unknown:
            raise ValidationError(
                "unknown status %(unknown)s; one of %(known)s",
                code="invalid",
                params={"unknown": ", ".join(unknown), "known": ", ".join(ExecutionStatus.values)},
            )
        return list(dict.fromkeys(names))


class StatusFilter(django_filters.BaseInFilter, django_filters.ChoiceFilter):
    """``status=paused,needs_attention``: runs in any of the statuses."""

    base_field_class = StatusesField


class InstantField(forms.DateTimeField):
    """An ISO 8601 date and time; without an offset, in the project's time zone."""

    def to_python(self, value: object) -> dt.datetime | None:
        if value in self.empty_values:
            return None
        text = str(value).strip()
        try:
            parsed = parse_datetime(text)
        except ValueError:  # a well-formed date that does not exist (2024-13-45)
            parsed = None
        if parsed is None:
            raise ValidationError(
                "%(value)r is not an ISO 8601 date and time",
                code="invalid",
                params={"value": text},
            )
        if timezone.is_naive(parsed):
            parsed = timezone.make_aware(parsed)
        try:
            return timevalues.instant(parsed, "the time").astimezone(dt.UTC)
        except InvalidTime as exc:  # year 1 or 9999 shifted by its offset, and beyond
            reason = {"reason": str(exc)}
            raise ValidationError("%(reason)s", code="invalid", params=reason) from None


class InstantFilter(django_filters.IsoDateTimeFilter):
    """A bound on the runs' creation time; on runs narrowed by attributes, on the attribute
    rows' copy of it (the same instant), which their index holds: an old range is then found
    on the index too, not after reading every newer run."""

    field_class = InstantField

    def filter(self, qs: QuerySet[Execution], value: dt.datetime | None) -> QuerySet[Execution]:
        if value is not None and store.attributes.CREATED_AT in qs.query.annotations:
            return qs.filter(**{f"{store.attributes.CREATED_AT}__{self.lookup_expr}": value})
        filtered: QuerySet[Execution] = super().filter(qs, value)
        return filtered


class ExecutionFilterSet(django_filters.FilterSet):
    """The filters of ``GET executions/``."""

    reactor = django_filters.CharFilter(
        field_name="reactor", help_text="Runs of this registered reactor name."
    )
    status = StatusFilter(
        field_name="status",
        choices=ExecutionStatus.choices,
        help_text="Runs in this status, or in one of several, comma-separated "
        "(paused,needs_attention).",
    )
    correlation_id = django_filters.CharFilter(
        method="filter_correlation_id",
        help_text="Runs that reached an interrupt with this correlation id, waiting or not.",
    )
    created_after = InstantFilter(
        field_name="created_at",
        lookup_expr="gte",
        help_text="Runs created at or after this ISO 8601 date and time.",
    )
    created_before = InstantFilter(
        field_name="created_at",
        lookup_expr="lt",
        help_text="Runs created before this ISO 8601 date and time.",
    )

    class Meta:
        model = Execution
        fields = ["reactor", "status", "correlation_id", "created_after", "created_before"]

    def filter_correlation_id(
        self, queryset: QuerySet[Execution], name: str, value: str
    ) -> QuerySet[Execution]:
        interrupts = Interrupt.objects.filter(execution_id=OuterRef("pk"), correlation_id=value)
        return queryset.filter(Exists(interrupts))


#: The prefix of an attribute filter's parameter: ``attr.customer_id=42``.
ATTRIBUTE_PARAMETER = "attr."


def attribute_filters(params: Any) -> dict[str, str]:
    """The ``attr.<key>=<value>`` parameters of a request's query (a ``QueryDict``), as a
    filter for ``store.with_attributes``; an empty value filters nothing, as the other
    filters' do. Raises DRF's ValidationError (a 400) naming the parameter that is wrong."""
    found: dict[str, str] = {}
    for name in params:
        if not name.startswith(ATTRIBUTE_PARAMETER):
            continue
        values = [value for value in params.getlist(name) if value != ""]
        if not values:
            continue
        key = name[len(ATTRIBUTE_PARAMETER) :]
        where = f"?{name[:80]}=..."
        try:
            if len(values) > 1:
                raise InvalidAttribute(
                    f"{where}: a run has one value per attribute; give {name[:80]} once"
                )
            value = canonical(values[0], where)
            found[check_key(key, where)] = str(value)
        except InvalidAttribute as exc:
            raise BadRequest({name[:80]: [str(exc)]}) from None
    return found


class ExecutionFilterBackend(DjangoFilterBackend):
    """django-filter's backend, and the attribute filters (``attr.<key>=<value>``, which no
    declared filter can name); its filter form in DRF's browsable API only when
    ``django_filters`` is an installed app (it brings the form's template)."""

    def filter_queryset(
        self, request: Request, queryset: QuerySet[Execution], view: object
    ) -> QuerySet[Execution]:
        # Narrowed first: the creation-time filters then bound the attribute index's copy.
        wanted = attribute_filters(request.query_params)
        narrowed = store.with_attributes(queryset, wanted) if wanted else queryset
        filtered: QuerySet[Execution] = super().filter_queryset(request, narrowed, view)
        return filtered

    def to_html(self, request: Request, queryset: QuerySet[Execution], view: object) -> str | None:
        if not apps.is_installed("django_filters"):
            return None
        html: str | None = super().to_html(request, queryset, view)
        return html


class ExecutionFilterScheme(DjangoFilterExtension):
    """The filters' parameters in the OpenAPI schema, as drf-spectacular describes a
    django-filter backend's, and what the filters also take or refuse: an empty value (it
    filters nothing) and, in text, no NUL."""

    target_class = "django_reactor.api.filters.ExecutionFilterBackend"
    priority = 1  # over drf-spectacular's own extension for every django-filter backend

    def get_schema_operation_parameters(
        self, auto_schema: AutoSchema, *args: object, **kwargs: object
    ) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(
            auto_schema, *args, **kwargs
        )
        for parameter in parameters:
            parameter["allowEmptyValue"] = True
            schema = parameter["schema"]
            if schema.get("type") == "string" and "format" not in schema:
                schema["pattern"] = NO_NUL_PATTERN
        return parameters
