"""Admin pages for operators: read-only runs, their DAG and trace, and the operations on them.

Nothing here changes a row directly: cancel, undo, retry and resume go through
``django_reactor.services`` (which enforce the state machine and the lease), each behind its
custom permission, and each change is recorded as an admin ``LogEntry``.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db import transaction
from django.db.models import (
    Model,
    QuerySet,
)
from django.db.models.expressions import Combinable
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import registry, services, store
from ..display import duration_seconds, format_duration, short_json
from ..engine.outcomes import ErrorInfo
from ..engine.serialization import conceal
from ..exceptions import ReactorNotRegistered
from ..graph import render_svg, step_states
from ..handle import ExecutionHandle, StepView
from ..models import AuditAction, Execution, Interrupt
from ..services.pausing import SUSPENDABLE
from ..states import MOVING_STATUSES, EventKind, ExecutionStatus, RollbackStatus, StepStatus
from ..store import dialect_for
from . import timeline
from .attributes import PARAMETER as ATTRIBUTE_PARAMETER
from .attributes import AttributeListFilter, attribute_links
from .console import REFRESH_SECONDS, ConsoleViews
from .databases import PARAMETER as DATABASE_PARAMETER
from .display import (
    APP,
    FAILURE_EVENTS,
    ROLLBACK_EVENTS,
    MomentsAdmin,
    breakable,
    execution_link,
    failure_fields,
    json_block,
    moment,
    rollback_badge,
    short_reactor,
    status_badge,
    status_badge_of,
)
from .forks import ForkViews
from .maps import map_sections
from .operations import ExecutionOperations
from .paging import KeysetAdmin, KeysetChangeList
from .patches import PatchListFilter, PatchViews, decisions_shown
from .pauses import PauseViews, paused_banner
from .time import time_facts, waits_for_time

# ---------------------------------------------------------------------------- filters


#: Reactor names the filter reads from the database at most (a project has tens).
FILTER_REACTORS = 500


class ReactorListFilter(admin.SimpleListFilter):
    """Filter by reactor, labelled with the short names: the reactors that have rows in the
    list's database (read as a loose index scan of the ``(reactor, created_at, id)`` index: one
    seek per reactor, whatever the number of runs), those this process knows, and the one
    chosen."""

    title = _("reactor")
    parameter_name = "reactor"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Execution]
    ) -> list[tuple[str, str]]:
        names = set(registry.all_reactors())
        alias = model_admin.get_queryset(request).db
        names.update(
            dialect_for(alias).distinct_values(model_admin.model, "reactor", FILTER_REACTORS)
        )
        if self.value():
            names.add(str(self.value()))
        short = Counter(name.rsplit(".", 1)[-1] for name in names)
        labels = []
        for name in sorted(names, key=lambda n: (n.rsplit(".", 1)[-1].lower(), n)):
            label = name.rsplit(".", 1)[-1]
            labels.append((name, label if short[label] == 1 else name))  # same short name
        return labels

    def queryset(self, request: HttpRequest, queryset: QuerySet[Execution]) -> QuerySet[Execution]:
        value = self.value()
        return queryset.filter(reactor=value) if value else queryset


# ---------------------------------------------------------------------------- executions


class ExecutionChangeList(KeysetChangeList):
    """Pages of runs leave the large JSON columns in the database; filtered by attribute, they
    are ordered by the attribute index's copy of the runs' creation time, and counted one page
    far when another filter (or a search) narrows them further: no index holds both, so every
    run counted is a look at a run's row, and a thousand matches of a rare status among half
    a million runs of a tenant are tens of thousands of them."""

    def get_queryset(
        self, request: HttpRequest, exclude_parameters: list[str | None] | None = None
    ) -> QuerySet[Execution]:
        return (
            super()
            .get_queryset(request, exclude_parameters)
            .defer("inputs", "result", "failure", "published", "secret_paths", "coordination")
        )

    def count_limit(self) -> int:
        limit = super().count_limit()
        if store.attributes.CREATED_AT not in self.queryset.query.annotations:
            return limit
        others = set(self.filter_params) - {ATTRIBUTE_PARAMETER, DATABASE_PARAMETER}
        return min(limit, self.list_per_page) if others or self.query else limit

    def get_ordering(
        self, request: HttpRequest, queryset: QuerySet[Model]
    ) -> list[str | Combinable]:
        ordering = super().get_ordering(request, queryset)
        if store.attributes.CREATED_AT not in queryset.query.annotations:
            return ordering
        # The one sort the list offers, by creation time, on the attribute rows' copy of it.
        oldest_first = isinstance(ordering[0], str) and not ordering[0].startswith("-")
        return list(store.attributes.newest_first(queryset, reverse=oldest_first))


@admin.register(Execution)
class ExecutionAdmin(
    MomentsAdmin,
    KeysetAdmin,
    ExecutionOperations,
    PauseViews,
    ForkViews,
    PatchViews,
    ConsoleViews,
):
    """Runs, read-only; cancel, undo, retry and resume through ``services``.

    The list is newest first, counted up to ``count_limit`` runs, numbered that far and paged
    by keyset beyond (``paging``). Its filters and its one sort, by creation time, are served by
    the indexes on (status, created_at, id), (reactor, created_at, id) and (created_at, id).
    """

    list_display = (
        "run",
        "reactor_name",
        "status_badge",
        "current",
        "correlation",
        "created",
        "updated",
        "duration",
    )
    list_display_links = ("run",)
    # No date_hierarchy: its DISTINCT over every run's date is a full scan of the runs.
    list_filter = (
        ReactorListFilter,
        "status",
        "created_at",
        AttributeListFilter,
        PatchListFilter,
    )
    sortable_by = ("created",)
    search_fields = ("=id", "=idempotency_key", "=interrupts__correlation_id")
    search_help_text = _("An execution id, an idempotency key or a correlation id (exact).")
    list_select_related = False
    list_per_page = 50
    ordering = ("-created_at",)
    actions = ("cancel_selected", "undo_selected", "retry_selected", "migrate_selected")
    change_form_template = "admin/django_reactor/execution/change_form.html"
    readonly_fields = (
        "id",
        "reactor",
        "status_badge",
        "current_step",
        "current_attempt",
        "redacted_inputs",
        "result_json",
        "published_json",
        "idempotency_key",
        "correlation_id",
        "version_shown",
        "definition_hash",
        "attributes",
        "patch_decisions",
        "queue_shown",
        "priority",
        "concurrency",
        "throttle",
        "debounce",
        "batch",
        "created_at",
        "started_at",
        "updated_at",
        "finished_at",
        "duration",
        "wake_at",
        "handed_off",
        "detached",
        "lease_owner",
        "lease_expires_at",
        "fence",
        "recovery_attempts",
        "cancel_requested_at",
        "cancel_reason",
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "reactor",
                    "status_badge",
                    "current_step",
                    "current_attempt",
                    "redacted_inputs",
                    "result_json",
                    "published_json",
                )
            },
        ),
        (
            _("Keys"),
            {
                "fields": (
                    "attributes",
                    "idempotency_key",
                    "correlation_id",
                    "version_shown",
                    "definition_hash",
                    "patch_decisions",
                )
            },
        ),
        (
            _("Where it waits"),
            {
                "fields": (
                    "queue_shown",
                    "priority",
                    "concurrency",
                    "throttle",
                    "debounce",
                    "batch",
                )
            },
        ),
        (
            _("Times"),
            {
                "fields": (
                    "created_at",
                    "started_at",
                    "updated_at",
                    "finished_at",
                    "duration",
                    "wake_at",
                )
            },
        ),
        (
            _("Ownership"),
            {
                "classes": ("collapse",),
                "fields": (
                    "handed_off",
                    "detached",
                    "lease_owner",
                    "lease_expires_at",
                    "fence",
                    "recovery_attempts",
                    "cancel_requested_at",
                    "cancel_reason",
                ),
            },
        ),
    )

    # -- queryset and columns
    def get_changelist(self, request: HttpRequest, **kwargs: object) -> type[ChangeList]:
        return ExecutionChangeList

    @admin.display(description=_("concurrency key"))
    def concurrency(self, obj: Execution) -> str:
        """The run's concurrency key and, queued, what it waits for."""
        if not obj.concurrency_key:
            return "-"
        if obj.status == ExecutionStatus.QUEUED:
            detail = services.flow.waiting_detail(obj.reactor, obj.concurrency_key, obj.created_at)
            return f"{obj.concurrency_key} ({detail})"
        return obj.concurrency_key

    @admin.display(description=_("throttle key"))
    def throttle(self, obj: Execution) -> SafeString:
        """The key its start counted under, and when it was allowed to start."""
        if not obj.throttle_key:
            return format_html("{}", "-")
        return format_html(
            "{} (its start counts at {})", obj.throttle_key, moment(obj.throttle_slot)
        )

    @admin.display(description=_("debounce key"))
    def debounce(self, obj: Execution) -> str:
        """The key whose starts collapse into the run while it waits to start."""
        if not obj.debounce_key:
            return "-"
        if obj.status == ExecutionStatus.SCHEDULED:
            return (
                f"{obj.debounce_key} (starts when its key has been quiet for its period; "
                "another start of the key collapses into it)"
            )
        return obj.debounce_key

    @admin.display(description=_("batch key"))
    def batch(self, obj: Execution) -> str:
        """The key whose starts the run collects as its items, and how many it holds."""
        if not obj.batch_key:
            return "-"
        held = f"{obj.batch_key} ({obj.batch_size} items"
        if obj.status == ExecutionStatus.SCHEDULED:
            return f"{held}; collecting: another start of the key joins it until it is full)"
        return f"{held})"

    @admin.display(description=_("queue"))
    def queue_shown(self, obj: Execution) -> str:
        """The run's Celery queue; the default one named as such."""
        return obj.queue or str(_("the default queue"))

    @admin.display(description=_("version"))
    def version_shown(self, obj: Execution) -> str:
        """The Meta.version the run started on; without one, its fingerprint is its version."""
        if obj.version:
            return obj.version
        return str(_("none declared: its definition hash is its version"))

    @admin.display(description=_("run"))
    def run(self, obj: Execution) -> str:
        return str(obj.id)[:8]

    @admin.display(description=_("reactor"))
    def reactor_name(self, obj: Execution) -> SafeString:
        return short_reactor(obj.reactor)

    @admin.display(description=_("status"))
    def status_badge(self, obj: Execution) -> SafeString:
        return status_badge_of(obj)

    @admin.display(description=_("current step"))
    def current(self, obj: Execution) -> SafeString:
        return breakable(obj.current_step)

    @admin.display(description=_("correlation id"))
    def correlation(self, obj: Execution) -> str:
        # The store keeps the latest interrupt's correlation id on the run itself. It wraps
        # anywhere (CSS), as typed: no break opportunity is added to a value people copy.
        return obj.correlation_id or ""

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: Execution) -> SafeString:
        return moment(obj.created_at)

    @admin.display(description=_("updated"))
    def updated(self, obj: Execution) -> SafeString:
        return moment(obj.updated_at)

    @admin.display(description=_("duration"))
    def duration(self, obj: Execution) -> str:
        return format_duration(duration_seconds(obj.started_at, obj.finished_at))

    @admin.display(description=_("inputs"))
    def redacted_inputs(self, obj: Execution) -> SafeString:
        return json_block(ExecutionHandle(obj).inputs)

    @admin.display(description=_("result"))
    def result_json(self, obj: Execution) -> SafeString | str:
        if obj.result is None:
            return "-"
        return json_block(conceal(obj.result, store.secrets.Marks()))

    @admin.display(description=_("attributes"))
    def attributes(self, obj: Execution) -> SafeString | str:
        return attribute_links(ExecutionHandle(obj).attributes)

    @admin.display(description=_("patch decisions"))
    def patch_decisions(self, obj: Execution) -> SafeString | str:
        return decisions_shown(obj.pk)

    @admin.display(description=_("published"))
    def published_json(self, obj: Execution) -> SafeString | str:
        published = ExecutionHandle(obj).published
        return json_block(published) if published else "-"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, object] | None = None
    ) -> HttpResponse:
        # A list of moving runs reads itself again, as a moving run's page does.
        if request.GET.get("status__exact") in MOVING_STATUSES:
            extra_context = {**(extra_context or {}), "reactor_refresh_seconds": REFRESH_SECONDS}
        extra_context = {**(extra_context or {}), "reactor_paused": paused_banner(request)}
        return super().changelist_view(request, extra_context)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Execution], search_term: str
    ) -> tuple[QuerySet[Execution], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            execution_id = uuid.UUID(term)
        except ValueError:
            execution_id = None
        if execution_id is not None:
            return queryset.filter(pk=execution_id), False
        # Three indexed lookups rather than one OR across columns (a full scan of the runs).
        limit = 1000
        runs = Execution.objects.values_list("pk", flat=True)
        ids = set(runs.filter(idempotency_key=term)[:limit])
        ids.update(runs.filter(correlation_id=term)[:limit])
        by_interrupt = Interrupt.objects.filter(correlation_id=term)
        ids.update(by_interrupt.values_list("execution_id", flat=True)[:limit])
        return queryset.filter(pk__in=ids), False

    # -- permissions: runs are written by the engine only
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Execution | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Execution | None = None) -> bool:
        return False

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, object],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Execution | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context.update(self._detail(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _detail(self, request: HttpRequest, obj: Execution) -> dict[str, object]:
        records = store.step_rows(obj.pk)
        events = store.event_rows(obj.pk)
        interrupts = list(Interrupt.objects.filter(execution=obj).order_by("id"))
        waiting_steps = {r.step for r in records if r.status == StepStatus.WAITING}
        if waiting_steps - {i.step for i in interrupts}:
            # A composed child waits at interrupts of its own: listed here by path.
            interrupts = store.interrupts.of_run(obj.pk)
        children = list(
            Execution.objects.filter(parent=obj)
            .order_by("created_at")
            .only("id", "reactor", "status", "parent_step", "detached", "created_at")
        )
        retried_as = Execution.objects.filter(retry_of=obj).only("id", "status").first()
        continued_as = store.continuation.successor_of(obj.pk) if obj.parent_id is None else None

        graph = ""
        graph_problem = ""
        definition = None
        try:
            definition = registry.of_run(obj.reactor, obj.version).definition
        except ReactorNotRegistered as exc:
            graph_problem = str(exc)
        if definition is not None:
            graph = render_svg(
                definition, step_states(obj, records, store.stored_shape(obj, strict=False))
            )

        steps = []
        step_labels = dict(StepStatus.choices)
        rollback_labels = dict(RollbackStatus.choices)
        marks = store.secrets.Marks().prepare(
            value for record in records for value in (record.arguments, record.result)
        )
        for record in records:
            view = StepView.from_row(record, marks)
            steps.append(
                {
                    "view": view,
                    "badge": status_badge(view.status, step_labels.get(view.status)),
                    "rollback_badge": rollback_badge(
                        view.rollback, rollback_labels.get(view.rollback, view.rollback)
                    )
                    if view.rollback
                    else "",
                    "arguments": short_json(view.arguments, 120),
                    "result": "" if view.result is None else short_json(view.result, 120),
                    "error": str(view.error) if view.error else "",
                    "rollback_error": (view.rollback_error or {}).get("message", "")
                    if view.rollback_error
                    else "",
                    "duration": format_duration(
                        duration_seconds(view.started_at, view.finished_at)
                    ),
                }
            )
        labels = dict(EventKind.choices)
        trace = []
        for event in events:
            css = (
                "fail"
                if event.kind in FAILURE_EVENTS
                else "rollback"
                if event.kind in ROLLBACK_EVENTS
                else "complete"
                if event.kind == EventKind.COMPLETE
                else ""
            )
            trace.append(
                {
                    "event": event,
                    "label": labels.get(event.kind, event.kind),
                    "css": css,
                    "data": short_json(event.data, 160) if event.data else "",
                    "duration": ""
                    if event.duration_ms is None
                    else format_duration(event.duration_ms / 1000),
                }
            )

        moving = obj.status in MOVING_STATUSES
        drawn = timeline.build(
            events,
            records,
            now=timezone.now(),
            moving=moving or obj.status == ExecutionStatus.PAUSED,
            labels=labels,
        )

        can_resume = self.has_resume_interrupt_permission(request, obj)
        composed_child = obj.parent_id is not None and not obj.detached
        # A composed child's interrupts are resumed through the run at the top, by path.
        top = store.interrupts.above(obj.pk, "") if composed_child and interrupts else None
        waiting = [
            {
                "row": i,
                "path": store.interrupts.path_of(i),
                "badge": status_badge_of(i),
                "resume_url": reverse(
                    f"admin:{APP}_execution_resume",
                    args=[quote(str(obj.pk)), store.interrupts.path_of(i)],
                ),
                "through": {"link": execution_link(top.top_id), "path": f"{top.path}{i.step}"}
                if top is not None
                else None,
            }
            for i in interrupts
        ]
        buttons = []
        waits = waits_for_time(obj, records)
        if (
            waits is not None
            and not composed_child
            and self.has_cancel_execution_permission(request, obj)
        ):
            buttons.append(("wake", _("Wake now"), waits["wake_help"]))
        if not composed_child:
            if obj.status in services.CANCELLABLE and self.has_cancel_execution_permission(
                request, obj
            ):
                buttons.append(("cancel", _("Cancel"), _("Stop the run without rolling back.")))
            if obj.status in services.UNDOABLE and self.has_undo_execution_permission(request, obj):
                buttons.append(("undo", _("Undo"), _("Roll back every completed step.")))
        if (
            obj.status == ExecutionStatus.FAILED
            and obj.parent_id is None
            and retried_as is None
            and self.has_retry_execution_permission(request, obj)
        ):
            buttons.append(("retry", _("Retry"), _("Run it again as a new execution.")))
        if (
            obj.status in services.FORKABLE
            and obj.parent_id is None
            and retried_as is None
            and self.has_retry_execution_permission(request, obj)
        ):
            buttons.append(
                ("fork", _("Fork…"), _("Run it again from a step, reusing the steps before it."))
            )
        own_pause = store.pauses.run_pause(obj.pk)
        reactor_pause = store.pauses.reactor_pause(obj.reactor)
        if obj.parent_id is None and self.has_pause_execution_permission(request, obj):
            if own_pause is None and obj.status in (*SUSPENDABLE, ExecutionStatus.PAUSED):
                buttons.append(
                    ("pause", _("Pause"), _("Stop at the next step boundary until unpaused."))
                )
            elif own_pause is not None or (
                obj.status == ExecutionStatus.SUSPENDED and reactor_pause is None
            ):
                buttons.append(("unpause", _("Unpause"), _("Go on where it stopped.")))
        failure = ErrorInfo.from_dict(obj.failure) if obj.failure else None
        steering_labels = dict(AuditAction.choices)
        return {
            "reactor_paused": paused_banner(request, obj.reactor),
            # The run's own pause (its reactor's is the banner).
            "reactor_pause": {
                "reason": own_pause.reason,
                "by": own_pause.paused_by,
                "suspended": obj.status == ExecutionStatus.SUSPENDED,
            }
            if own_pause is not None
            else None,
            "reactor_maps": map_sections(request, obj),
            "reactor_graph": graph,
            "reactor_graph_problem": graph_problem,
            "reactor_steps": steps,
            "reactor_trace": trace,
            "reactor_timeline": timeline.render(drawn),
            "reactor_timeline_cut": drawn.cut,
            "reactor_failure": failure,
            "reactor_failure_fields": failure_fields(failure),
            "reactor_interrupts": waiting,
            "reactor_messages": [
                {
                    "row": message,
                    "payload": short_json(conceal(message.payload), 120),
                    "errors": short_json(message.errors, 200) if message.errors else "",
                }
                for message in store.messages.of_run(obj.pk)
            ],
            "reactor_can_resume": can_resume
            and obj.status == ExecutionStatus.PAUSED
            and not composed_child,
            "reactor_children": [{"row": c, "badge": status_badge_of(c)} for c in children],
            "reactor_retried_as": retried_as,
            "reactor_continued_as": continued_as,
            "reactor_buttons": [
                {
                    "name": name,
                    "label": label,
                    "help": help_text,
                    "url": reverse(f"admin:{APP}_execution_{name}", args=[quote(str(obj.pk))]),
                }
                for name, label, help_text in buttons
            ],
            "reactor_steering": [
                {
                    "entry": entry,
                    "label": steering_labels.get(entry.action, entry.action),
                    "detail": short_json(entry.detail, 160) if entry.detail else "",
                }
                for entry in store.audit.of_run(obj.pk)
            ],
            "reactor_steering_url": self._steering_url(request, obj),
            "reactor_status_badge": status_badge_of(obj),
            "reactor_time": time_facts(obj, waits),
            # A run still moving: the page reads it again every few seconds (see the template).
            "reactor_refresh_seconds": REFRESH_SECONDS if moving else None,
        }

    def _steering_url(self, request: HttpRequest, obj: Execution) -> str:
        """The steering history's list of this run's entries, for those who may read it."""
        if not request.user.has_perm(f"{APP}.view_auditentry"):
            return ""
        url = reverse(f"admin:{APP}_auditentry_changelist", current_app=self.admin_site.name)
        return f"{url}?q={obj.pk}"

    # -- custom URLs
    def get_urls(self) -> list[URLPattern]:
        def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            def call(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
                return view(request, *args, **kwargs)

            # Services refuse to run step code inside a request's transaction (ATOMIC_REQUESTS).
            return self.admin_site.admin_view(transaction.non_atomic_requests(call))

        name = f"{APP}_execution"
        custom = [
            path("parked/", wrap(self.parked_view), name=f"{name}_parked"),
            path("overview/", wrap(self.overview_view), name=f"{name}_overview"),
            path("coordination/", wrap(self.coordination_view), name=f"{name}_coordination"),
            path("patches/", wrap(self.patches_view), name=f"{name}_patches"),
            # Before the run's own URLs, whose id is a path.
            path(
                "reactors/<str:name>/pause/",
                wrap(self.pause_reactor_view),
                name=f"{name}_pause_reactor",
            ),
            path(
                "reactors/<str:name>/unpause/",
                wrap(self.unpause_reactor_view),
                name=f"{name}_unpause_reactor",
            ),
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name=f"{name}_cancel"),
            path("<path:object_id>/undo/", wrap(self.undo_view), name=f"{name}_undo"),
            path("<path:object_id>/retry/", wrap(self.retry_view), name=f"{name}_retry"),
            path("<path:object_id>/wake/", wrap(self.wake_view), name=f"{name}_wake"),
            path("<path:object_id>/pause/", wrap(self.pause_view), name=f"{name}_pause"),
            path("<path:object_id>/fork/", wrap(self.fork_view), name=f"{name}_fork"),
            path("<path:object_id>/unpause/", wrap(self.unpause_view), name=f"{name}_unpause"),
            path(
                "<path:object_id>/resume/<str:step>/",
                wrap(self.resume_view),
                name=f"{name}_resume",
            ),
        ]
        return custom + super().get_urls()
