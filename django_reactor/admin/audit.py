"""The steering history, read-only: every cancel, undo, retry, payload delivered, wake,
schedule paused or run now, subject forgotten and ordered lock skipped or reset, with who (and
from which face), when and why. A run's page lists its own (``executions``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import AuditAction, AuditEntry
from .display import execution_link, json_block, moment, short_reactor
from .records import ReadOnlyAdmin

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

#: Characters of a reason shown in the list (the entry's page shows it whole).
SHORT_REASON = 120


class ActionFilter(admin.SimpleListFilter):
    """Filter by steering action (the known ones: the column has no choices of its own)."""

    title = _("action")
    parameter_name = "action"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[AuditEntry]
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return AuditAction.choices

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[AuditEntry]
    ) -> QuerySet[AuditEntry]:
        value = self.value()
        return queryset.filter(action=value) if value else queryset


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    """The steering history, newest first, paged by keyset over the (at, id) index."""

    list_display = ("when", "action_label", "who", "via", "run", "reactor_name", "target", "why")
    list_display_links = ("when",)
    list_filter = (ActionFilter, "via", "at")
    sortable_by = ("when",)
    ordering = ("-at",)
    search_fields = ("who",)
    search_help_text = _("An execution id (exact), or part of who or what was steered.")
    list_per_page = 50
    fields = (
        "at",
        "action",
        "who",
        "via",
        "run",
        "reactor",
        "target",
        "reason",
        "shown_detail",
    )
    readonly_fields = fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[AuditEntry], search_term: str
    ) -> tuple[QuerySet[AuditEntry], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(execution_id=uuid.UUID(term)), False
        except ValueError:
            pass
        # A part of a name: no index serves it, but the history holds one row per person's
        # act (not per step), and the list counts and pages it capped as every list does.
        return queryset.filter(who__icontains=term) | queryset.filter(target__icontains=term), False

    @admin.display(description=_("at"), ordering="at")
    def when(self, obj: AuditEntry) -> SafeString:
        return moment(obj.at)

    @admin.display(description=_("action"))
    def action_label(self, obj: AuditEntry) -> str:
        return str(dict(AuditAction.choices).get(obj.action, obj.action))

    @admin.display(description=_("execution"))
    def run(self, obj: AuditEntry) -> SafeString | str:
        return execution_link(obj.execution_id) if obj.execution_id else "-"

    @admin.display(description=_("reactor"))
    def reactor_name(self, obj: AuditEntry) -> SafeString | str:
        return short_reactor(obj.reactor) if obj.reactor else "-"

    @admin.display(description=_("reason"))
    def why(self, obj: AuditEntry) -> str:
        reason = obj.reason
        return reason if len(reason) <= SHORT_REASON else reason[: SHORT_REASON - 1] + "…"

    @admin.display(description=_("detail"))
    def shown_detail(self, obj: AuditEntry) -> SafeString | str:
        return json_block(obj.detail) if obj.detail else "-"
