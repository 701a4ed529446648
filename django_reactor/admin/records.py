"""Read-only admin lists of interrupts and dispatches (steer runs from their page)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.db.models import (
    QuerySet,
)
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import Dispatch, Interrupt
from .display import execution_link, short_reactor, status_badge


class _ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Interrupt)
class InterruptAdmin(_ReadOnlyAdmin):
    """Interrupts runs reached, read-only (resume a run from its execution page)."""

    list_display = (
        "step",
        "run",
        "reactor_name",
        "status_badge",
        "correlation_id",
        "attempts",
        "expires_at",
        "created_at",
        "closed_at",
    )
    list_filter = ("status", "reactor", "created_at")
    date_hierarchy = "created_at"
    search_fields = ("=correlation_id", "=step")
    show_full_result_count = False
    exclude = ("token_hash",)

    @admin.display(description=_("execution"), ordering="execution_id")
    def run(self, obj: Interrupt) -> SafeString:
        return execution_link(obj.execution_id)

    @admin.display(description=_("reactor"), ordering="reactor")
    def reactor_name(self, obj: Interrupt) -> SafeString:
        return short_reactor(obj.reactor)

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Interrupt) -> SafeString:
        return status_badge(obj.status, obj.get_status_display())

    @admin.display(description=_("invalid payloads"))
    def attempts(self, obj: Interrupt) -> str:
        limit = f" / {obj.max_attempts}" if obj.max_attempts else ""
        return f"{obj.invalid_attempts}{limit}"


class SentFilter(admin.SimpleListFilter):
    title = _("sent")
    parameter_name = "sent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, Any]]:
        return [("yes", _("Sent")), ("no", _("Not sent"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(sent_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(sent_at__isnull=True)
        return queryset


@admin.register(Dispatch)
class DispatchAdmin(_ReadOnlyAdmin):
    """The outbox of Celery tasks, read-only: unsent rows show what a crash left behind."""

    list_display = ("id", "run", "reason", "not_before", "created_at", "sent_at")
    list_filter = ("reason", SentFilter, "created_at")
    date_hierarchy = "created_at"
    search_fields = ("=execution__id",)
    show_full_result_count = False

    @admin.display(description=_("execution"), ordering="execution_id")
    def run(self, obj: Dispatch) -> SafeString:
        return execution_link(obj.execution_id)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Dispatch], search_term: str
    ) -> tuple[QuerySet[Dispatch], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(execution_id=uuid.UUID(term)), False
        except ValueError:
            return queryset.none(), False
