"""The read-only list of events emitted (``emit``): what each carried and whether it was
handled (its waits, triggers and cancellations seen to)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import Event
from .display import json_block
from .records import ReadOnlyAdmin

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


class HandledFilter(admin.SimpleListFilter):
    title = _("handled")
    parameter_name = "handled"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Event]
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return [("yes", _("Handled")), ("no", _("Not handled yet"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Event]) -> QuerySet[Event]:
        if self.value() == "yes":
            return queryset.filter(handled_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(handled_at__isnull=True)
        return queryset


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    """Events emitted, read-only: the runs they reached show them in their mailbox."""

    list_display = ("name", "key", "event_id", "source", "created_at", "handled_at", "problems")
    list_filter = (HandledFilter, "created_at")
    search_fields = ("=event_id",)
    search_help_text = _("An event id or a key (exact).")
    ordering = ("-created_at",)
    sortable_by = ("created_at",)
    exclude = ("payload", "errors")
    readonly_fields = ("shown_payload", "shown_errors")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Event], search_term: str
    ) -> tuple[QuerySet[Event], bool]:
        # Exact, so that an index serves it: the event id (with its name) or the key.
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(event_id=term) | queryset.filter(key=term), False

    @admin.display(description=_("payload"))
    def shown_payload(self, obj: Event) -> SafeString:
        return json_block(obj.payload)

    @admin.display(description=_("errors"))
    def shown_errors(self, obj: Event) -> SafeString | str:
        return json_block(obj.errors) if obj.errors else "-"

    @admin.display(description=_("errors"))
    def problems(self, obj: Event) -> str:
        return str(len(obj.errors)) if obj.errors else ""
