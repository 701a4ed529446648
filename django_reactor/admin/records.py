"""Read-only admin lists of interrupts, dispatches, maps and map elements (steer runs from
their page)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.db.models import Model, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import store
from ..engine.serialization import conceal
from ..models import Dispatch, Interrupt, MapResult, MapRun
from ..states import ElementStatus, InterruptStatus, MapStatus

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    from ..engine.serialization import JSONValue
from .display import (
    APP,
    MomentsAdmin,
    admin_url,
    breakable,
    execution_link,
    json_block,
    moment,
    short_reactor,
    status_badge,
    status_badge_of,
)
from .executions import ReactorListFilter
from .paging import KeysetAdmin, KeysetChangeList

# Characters of an element's error message shown in the element list.
SHORT_ERROR = 160


class ReadOnlyAdmin(MomentsAdmin, KeysetAdmin):
    """A read-only list with a capped count and keyset pages (``paging``)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Interrupt)
class InterruptAdmin(ReadOnlyAdmin):
    """Interrupts runs reached, read-only (resume a run from its execution page)."""

    list_display = (
        "step_name",
        "run",
        "reactor_name",
        "status_badge",
        "correlation_id",
        "attempts",
        "created_at",
        "closed_or_expires",
    )
    # No date_hierarchy (a DISTINCT over every row's date); the reactor filter reads the
    # reactors through the (reactor, created_at, id) index, one seek each.
    list_filter = ("status", ReactorListFilter, "created_at")
    search_fields = ("=correlation_id",)
    search_help_text = _("A correlation id (exact).")
    ordering = ("-created_at",)
    sortable_by = ("created_at",)
    # The payload shows with its secret fields redacted (sealed in the row), never as stored.
    exclude = ("token_hash", "payload")
    readonly_fields = ("shown_payload",)

    @admin.display(description=_("step"))
    def step_name(self, obj: Interrupt) -> SafeString:
        return breakable(obj.step)

    @admin.display(description=_("execution"))
    def run(self, obj: Interrupt) -> SafeString:
        return execution_link(obj.execution_id)

    @admin.display(description=_("reactor"))
    def reactor_name(self, obj: Interrupt) -> SafeString:
        return short_reactor(obj.reactor)

    @admin.display(description=_("status"))
    def status_badge(self, obj: Interrupt) -> SafeString:
        return status_badge_of(obj)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Interrupt], search_term: str
    ) -> tuple[QuerySet[Interrupt], bool]:
        # Exact, so the correlation id's index serves it (the admin's "=" is a case-blind
        # comparison no index serves).
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(correlation_id=term), False

    @admin.display(description=_("payload"))
    def shown_payload(self, obj: Interrupt) -> SafeString | str:
        if obj.payload is None:
            return "-"
        return _pre(conceal(obj.payload, store.secrets.Marks()))

    @admin.display(description=_("closed (or expires) at"))
    def closed_or_expires(self, obj: Interrupt) -> SafeString:
        # One column for two times, for the list's width: when an interrupt closed, and when
        # a waiting one will expire (muted: it has not happened).
        if obj.closed_at is not None or obj.status != InterruptStatus.WAITING:
            return moment(obj.closed_at)
        if obj.expires_at is None:
            return format_html('<span class="reactor-muted">{}</span>', _("never expires"))
        return format_html(
            '<span class="reactor-muted" title="{}">{}</span>', _("expires"), moment(obj.expires_at)
        )

    @admin.display(description=_("invalid payloads"))
    def attempts(self, obj: Interrupt) -> str:
        limit = f" / {obj.max_attempts}" if obj.max_attempts else ""
        return f"{obj.invalid_attempts}{limit}"


class SentFilter(admin.SimpleListFilter):
    title = _("sent")
    parameter_name = "sent"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Dispatch]
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return [("yes", _("Sent")), ("no", _("Not sent"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Dispatch]) -> QuerySet[Dispatch]:
        if self.value() == "yes":
            return queryset.filter(sent_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(sent_at__isnull=True)
        return queryset


@admin.register(Dispatch)
class DispatchAdmin(ReadOnlyAdmin):
    """The outbox of Celery tasks, read-only: unsent rows show what a crash left behind."""

    list_display = ("id", "run", "reason", "not_before", "created_at", "sent_at")
    # Newest first by id (the primary key's index; (reason, id) serves the reason filter and
    # the partial index of unsent rows the "not sent" one). No date filter or hierarchy: no
    # index orders the rows by date and id at once.
    list_filter = ("reason", SentFilter)
    search_fields = ("=execution__id",)
    search_help_text = _("An execution id (exact).")
    ordering = ("-id",)
    sortable_by = ("id",)

    @admin.display(description=_("execution"))
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


# ---------------------------------------------------------------------------- maps


def _uuid(term: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(term.strip())
    except ValueError:
        return None


@admin.register(MapRun)
class MapRunAdmin(ReadOnlyAdmin):
    """The map steps runs reached, with their counters (a run's page has their summary)."""

    list_display = ("step_name", "run", "status_badge", "mode", "progress", "created_at")
    list_filter = ("status", "fan_out", "created_at")
    search_fields = ("=execution__id",)
    search_help_text = _("An execution id (exact).")
    ordering = ("-created_at",)
    sortable_by = ("created_at",)
    list_per_page = 50  # wide rows, as the run list: 100 of them took longer to draw than to read
    exclude = ("shared",)
    readonly_fields = ("shared_json",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[MapRun]:
        return super().get_queryset(request).defer("shared")

    @admin.display(description=_("step"))
    def step_name(self, obj: MapRun) -> SafeString:
        return breakable(obj.step)

    @admin.display(description=_("execution"))
    def run(self, obj: MapRun) -> SafeString:
        return execution_link(obj.execution_id)

    @admin.display(description=_("status"))
    def status_badge(self, obj: MapRun) -> SafeString:
        return status_badge_of(obj)

    @admin.display(description=_("runs"))
    def mode(self, obj: MapRun) -> str:
        where = _("on workers") if obj.fan_out else _("inline")
        return f"{where}, {_('atomic') if obj.atomic else _('tolerant')}"

    @admin.display(description=_("elements"))
    def progress(self, obj: MapRun) -> SafeString:
        """How many elements settled of how many, the failed ones, linked to their list."""
        url = admin_url(f"admin:{APP}_mapresult_changelist")
        if obj.size is None:
            settled = _("%(settled)s settled, size not known yet") % {"settled": f"{obj.settled:,}"}
        else:
            settled = _("%(settled)s of %(size)s settled") % {
                "settled": f"{obj.settled:,}",
                "size": f"{obj.size:,}",
            }
        failed = (
            format_html(
                '<br><span class="reactor-error">{}</span>',
                _("%(failed)s failed") % {"failed": f"{obj.failed:,}"},
            )
            if obj.failed
            else ""
        )
        return format_html(
            '<a href="{}?{}">{}</a>{}',
            url,
            urlencode({"map_run__id__exact": str(obj.pk)}),
            settled,
            failed,
        )

    @admin.display(description=_("shared arguments"))
    def shared_json(self, obj: MapRun) -> SafeString:
        return json_block(obj.shared)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[MapRun], search_term: str
    ) -> tuple[QuerySet[MapRun], bool]:
        if not search_term.strip():
            return queryset, False
        execution_id = _uuid(search_term)
        if execution_id is None:
            return queryset.none(), False
        return queryset.filter(execution_id=execution_id), False


class MapFilter(admin.SimpleListFilter):
    """The map whose elements are listed (the link on a run's page sets it); only the chosen
    map is offered, so the sidebar never lists every map."""

    title = _("map")
    parameter_name = "map_run__id__exact"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[MapResult]
    ) -> Iterable[tuple[str, StrOrPromise]]:
        value = self.value()
        if not value:
            return []
        row = (
            MapRun.objects.filter(pk=_uuid(value) or uuid.UUID(int=0))
            .values("step", "execution_id")
            .first()
        )
        if row is None:
            return [(value, _("unknown map"))]
        label = _("%(step)s of run %(run)s") % {
            "step": row["step"],
            "run": str(row["execution_id"])[:8],
        }
        return [(value, label)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[MapResult]) -> QuerySet[MapResult]:
        value = self.value()
        if not value:
            return queryset
        map_id = _uuid(value)
        return queryset.filter(map_run_id=map_id) if map_id else queryset.none()


# Element statuses the list filters by: those of elements with an error, which the partial
# index on (map, index) of slots with an error serves. No index holds an element's status (a
# settle stays a HOT update), so filtering by another status would read the whole map; the
# map's counters on its run's page give those totals.
ERROR_STATUSES = (ElementStatus.FAILED, ElementStatus.HALTED)


class ElementStatusFilter(admin.SimpleListFilter):
    """Failed or halted elements, offered once the list shows one map."""

    title = _("status")
    parameter_name = "status__exact"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[MapResult]
    ) -> Iterable[tuple[str, StrOrPromise]]:
        if not request.GET.get(MapFilter.parameter_name):
            return []
        return [(status.value, status.label) for status in ERROR_STATUSES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[MapResult]) -> QuerySet[MapResult]:
        value = self.value()
        if not value:
            return queryset
        if value not in ERROR_STATUSES:
            raise IncorrectLookupParameters(f"the elements are not listed by status {value!r}")
        return queryset.filter(status=value, error__isnull=False)


class MapResultChangeList(KeysetChangeList):
    """Pages of elements leave items, values, undo data and tracebacks in the database: only
    the error's message is read, through a JSON key lookup."""

    def get_queryset(
        self, request: HttpRequest, exclude_parameters: list[str | None] | None = None
    ) -> QuerySet[MapResult]:
        return (
            super()
            .get_queryset(request, exclude_parameters)
            .only("id", "map_run_id", "index", "status", "attempts", "finished_at")
            .annotate(
                error_message=Coalesce(
                    KT("error__message"),
                    KT("error__reason"),
                    KT("rollback_error__0__message"),
                    KT("rollback_error__message"),
                )
            )
        )


@admin.register(MapResult)
class MapResultAdmin(ReadOnlyAdmin):
    """The elements of a map, by index: status, error message, attempts (read-only)."""

    list_display = (
        "index",
        "status_badge",
        "error_message",
        "element_attempts",
        "element_finished_at",
        "map",
    )
    list_display_links = ("index",)
    list_filter = (MapFilter, ElementStatusFilter)
    list_per_page = 100
    # By map and index only: the unique index on (map, index) serves it at any depth.
    ordering = ("map_run_id", "index")
    sortable_by = ()
    list_select_related = False
    fields = (
        "map_link",
        "index",
        "status_badge",
        "element_attempts",
        "element_finished_at",
        "item_json",
        "value_json",
        "error_json",
        "rollback_error_json",
        "undo_json",
    )
    readonly_fields = fields

    def get_changelist(self, request: HttpRequest, **kwargs: object) -> type[ChangeList]:
        return MapResultChangeList

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, object] | None = None
    ) -> HttpResponse:
        # The map listed (one query): its step and run, above the list.
        map_id = _uuid(request.GET.get(MapFilter.parameter_name, ""))
        row = None
        if map_id is not None:
            row = (
                MapRun.objects.filter(pk=map_id)
                .values("step", "execution_id", "status", "size")
                .first()
            )
        if row is not None:
            labels = dict(MapStatus.choices)
            extra_context = {
                **(extra_context or {}),
                "title": _("Elements of map %(step)s") % {"step": row["step"]},
                "reactor_map": {
                    **row,
                    "run": execution_link(row["execution_id"], str(row["execution_id"])),
                    "badge": status_badge(row["status"], labels.get(row["status"])),
                },
            }
        return super().changelist_view(request, extra_context)

    def get_list_display(self, request: HttpRequest) -> tuple[str, ...]:
        # The map column only when the list spans maps (the filter names the one shown).
        if request.GET.get(MapFilter.parameter_name):
            return self.list_display[:-1]
        return self.list_display

    @admin.display(description=_("status"))
    def status_badge(self, obj: MapResult) -> SafeString:
        return status_badge_of(obj)

    @admin.display(description=_("attempts"))
    def element_attempts(self, obj: MapResult) -> str:
        # An element that never started was only written down as such when its map stopped:
        # it had no attempt and did not finish.
        if obj.status == ElementStatus.NOT_STARTED:
            return "-"
        return str(obj.attempts)

    @admin.display(description=_("finished at"))
    def element_finished_at(self, obj: MapResult) -> SafeString:
        if obj.status == ElementStatus.NOT_STARTED:
            return moment(None)
        return moment(obj.finished_at)

    @admin.display(description=_("error"))
    def error_message(self, obj: MapResult) -> str:
        if hasattr(obj, "error_message"):  # the list's JSON lookup
            message = obj.error_message
        else:
            message = _message(obj.error) or _message(obj.rollback_error)
        message = str(message or "")
        if len(message) > SHORT_ERROR:
            message = message[: SHORT_ERROR - 1] + "…"
        return message

    @admin.display(description=_("map"))
    def map(self, obj: MapResult) -> SafeString:
        url = admin_url(f"admin:{APP}_mapresult_changelist")
        return format_html(
            '<a href="{}?{}">{}</a>',
            url,
            urlencode({"map_run__id__exact": str(obj.map_run_id)}),
            str(obj.map_run_id)[:8],
        )

    @admin.display(description=_("map"))
    def map_link(self, obj: MapResult) -> SafeString:
        run = MapRun.objects.filter(pk=obj.map_run_id).values("step", "execution_id").first()
        if run is None:
            return format_html("{}", obj.map_run_id)
        url = admin_url(f"admin:{APP}_mapresult_changelist")
        return format_html(
            '<a href="{}?{}">{}</a> · {}',
            url,
            urlencode({"map_run__id__exact": str(obj.map_run_id)}),
            _("%(step)s: all elements") % {"step": run["step"]},
            execution_link(run["execution_id"]),
        )

    @admin.display(description=_("item"))
    def item_json(self, obj: MapResult) -> SafeString:
        return _pre(obj.item)

    @admin.display(description=_("value"))
    def value_json(self, obj: MapResult) -> SafeString:
        return _pre(obj.value)

    @admin.display(description=_("error"))
    def error_json(self, obj: MapResult) -> SafeString:
        return _pre(obj.error)

    @admin.display(description=_("rollback error"))
    def rollback_error_json(self, obj: MapResult) -> SafeString:
        return _pre(obj.rollback_error)

    @admin.display(description=_("undo data"))
    def undo_json(self, obj: MapResult) -> SafeString:
        return _pre(obj.undo)


def _pre(value: JSONValue) -> SafeString:
    if value is None:
        return format_html("{}", "-")
    return json_block(value)


def _message(error: JSONValue) -> str:
    if isinstance(error, list):
        error = error[0] if error else None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("reason") or "")
    return ""
