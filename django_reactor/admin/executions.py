"""Admin pages for operators: read-only runs, their DAG and trace, and the operations on them.

Nothing here changes a row directly: cancel, undo, retry and resume go through
``django_reactor.services`` (which enforce the state machine and the lease), each behind its
custom permission, and each change is recorded as an admin ``LogEntry``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import (
    Count,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..display import short_json
from ..models import Execution, ExecutionEvent, Interrupt, MapRun, StepRecord
from ..states import EventKind, ExecutionStatus, InterruptStatus, MapStatus
from .display import (
    APP,
    FAILURE_EVENTS,
    MAP_WAITS,
    ROLLBACK_EVENTS,
    execution_link,
    failure_fields,
    flatten_errors,
    format_duration,
    pretty_json,
    progress,
    short_reactor,
    status_badge,
    waits_for,
)
from .forms import ResumeForm, serializer_example, serializer_help

# At most this many per-run error messages after a bulk action (the rest are counted).
MAX_ERROR_MESSAGES = 20
# Runs read per query while a bulk action works through them.
BULK_BATCH = 200
# Rows listed on a bulk action's confirmation page (the count and the states cover the rest).
CONFIRMATION_SAMPLE = 100


# Counts shown beside a map's progress bar when not zero (the first four always are).
MAP_COUNTS = (
    ("total", _("Total")),
    ("succeeded", _("Succeeded")),
    ("failed", _("Failed")),
    ("pending", _("Pending or running")),
    ("halted", _("Halted")),
    ("not_started", _("Not started")),
    ("undone", _("Undone")),
    ("undoing", _("Being undone")),
    ("undo_failed", _("Undo failed")),
)


# ---------------------------------------------------------------------------- filters


class ReactorListFilter(admin.SimpleListFilter):
    """Filter by reactor, labelled with the short names."""

    title = _("reactor")
    parameter_name = "reactor"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        from .. import registry

        # The registered reactors (a DISTINCT over the runs would read every row), plus the one
        # chosen, should it be gone from the code.
        names = set(registry.all_reactors())
        if self.value():
            names.add(str(self.value()))
        return [(name, name.rsplit(".", 1)[-1]) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(reactor=value) if value else queryset


# ---------------------------------------------------------------------------- executions


class ExecutionChangeList(ChangeList):
    """The changelist leaves the large JSON columns in the database (pages of 100,000 runs)."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        return (
            super()
            .get_queryset(request, exclude_parameters)
            .defer("inputs", "result", "failure", "definition_shape", "secret_paths")
        )


@admin.register(Execution)
class ExecutionAdmin(admin.ModelAdmin):
    """Runs, read-only; cancel, undo, retry and resume through ``services``."""

    list_display = (
        "run",
        "reactor_name",
        "status_badge",
        "current_step",
        "correlation",
        "created_at",
        "updated_at",
        "duration",
    )
    list_display_links = ("run",)
    # No date_hierarchy: its DISTINCT over every run's date is a full scan of 100,000 rows.
    list_filter = (ReactorListFilter, "status", "created_at")
    search_fields = ("=id", "=idempotency_key", "=interrupts__correlation_id")
    search_help_text = _("An execution id, an idempotency key or a correlation id (exact).")
    list_select_related = False
    show_full_result_count = False
    list_per_page = 50
    ordering = ("-created_at",)
    actions = ("cancel_selected", "undo_selected", "retry_selected")
    change_form_template = "admin/django_reactor/execution/change_form.html"
    readonly_fields = (
        "id",
        "reactor",
        "status_badge",
        "current_step",
        "current_attempt",
        "redacted_inputs",
        "result_json",
        "idempotency_key",
        "correlation_id",
        "definition_hash",
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
                )
            },
        ),
        (
            _("Keys"),
            {"fields": ("idempotency_key", "correlation_id", "definition_hash")},
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
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ExecutionChangeList

    @admin.display(description=_("run"), ordering="id")
    def run(self, obj: Execution) -> str:
        return str(obj.id)[:8]

    @admin.display(description=_("reactor"), ordering="reactor")
    def reactor_name(self, obj: Execution) -> SafeString:
        return short_reactor(obj.reactor)

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Execution) -> SafeString:
        return status_badge(obj.status, obj.get_status_display())

    @admin.display(description=_("correlation id"), ordering="correlation_id")
    def correlation(self, obj: Execution) -> str:
        # The store keeps the latest interrupt's correlation id on the run itself.
        return obj.correlation_id or ""

    @admin.display(description=_("duration"))
    def duration(self, obj: Execution) -> str:
        return format_duration(obj.started_at or obj.created_at, obj.finished_at)

    @admin.display(description=_("inputs"))
    def redacted_inputs(self, obj: Execution) -> SafeString:
        from ..handle import ExecutionHandle

        return format_html("<pre>{}</pre>", pretty_json(ExecutionHandle(obj).inputs))

    @admin.display(description=_("result"))
    def result_json(self, obj: Execution) -> SafeString | str:
        if obj.result is None:
            return "-"
        return format_html("<pre>{}</pre>", pretty_json(obj.result))

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

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _perm(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"{APP}.{codename}")

    def has_cancel_execution_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._perm(request, "cancel_execution")

    def has_undo_execution_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._perm(request, "undo_execution")

    def has_retry_execution_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._perm(request, "retry_execution")

    def has_resume_interrupt_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._perm(request, "resume_interrupt")

    # -- bulk actions (each through services, after a confirmation page)
    @admin.action(permissions=["cancel_execution"], description=_("Cancel selected executions"))
    def cancel_selected(
        self, request: HttpRequest, queryset: QuerySet[Execution]
    ) -> HttpResponse | None:
        return self._bulk(request, queryset, "cancel")

    @admin.action(permissions=["undo_execution"], description=_("Undo selected executions"))
    def undo_selected(
        self, request: HttpRequest, queryset: QuerySet[Execution]
    ) -> HttpResponse | None:
        return self._bulk(request, queryset, "undo")

    @admin.action(permissions=["retry_execution"], description=_("Retry selected executions"))
    def retry_selected(
        self, request: HttpRequest, queryset: QuerySet[Execution]
    ) -> HttpResponse | None:
        return self._bulk(request, queryset, "retry")

    def _bulk(
        self, request: HttpRequest, queryset: QuerySet[Execution], operation: str
    ) -> HttpResponse | None:
        if request.POST.get("post") != "yes":
            return self._confirmation(request, queryset, operation)
        reason = request.POST.get("reason", "").strip()[:500]
        done = 0
        errors: list[str] = []
        # Ids first, rows in small batches: no cursor stays open while step code runs.
        ids = list(queryset.order_by("created_at").values_list("pk", flat=True))
        for start in range(0, len(ids), BULK_BATCH):
            batch = Execution.objects.filter(pk__in=ids[start : start + BULK_BATCH])
            for row in batch.only("id", "reactor", "status").order_by("created_at"):
                ok, text = self._operate(request, row, operation, reason=reason)
                if ok:
                    done += 1
                else:
                    errors.append(text)
        if done:
            self.message_user(
                request,
                ngettext(
                    "%(verb)s %(count)d execution.",
                    "%(verb)s %(count)d executions.",
                    done,
                )
                % {"verb": OPERATIONS[operation]["done"], "count": done},
                messages.SUCCESS,
            )
        for text in errors[:MAX_ERROR_MESSAGES]:
            self.message_user(request, text, messages.ERROR)
        if len(errors) > MAX_ERROR_MESSAGES:
            self.message_user(
                request,
                _("…and %(count)d more refused.") % {"count": len(errors) - MAX_ERROR_MESSAGES},
                messages.ERROR,
            )
        return None

    def _operate(
        self, request: HttpRequest, row: Execution, operation: str, *, reason: str = ""
    ) -> tuple[bool, str]:
        """Run one operation through services; log it. Returns (done, message)."""
        from .. import services
        from ..exceptions import ReactorError

        try:
            if operation == "cancel":
                handle = services.cancel(row.id, reason=reason or "cancelled from the admin")
                message = f"Cancel requested: {handle.status}"
                if reason:
                    message += f" ({reason})"
            elif operation == "undo":
                handle = services.undo(row.id)
                message = f"Undone: {handle.status}"
            elif operation == "retry":
                outcome = services.retry(row.id)
                message = f"Retried as {outcome.execution_id}"
            else:  # pragma: no cover - the URLs name only these
                raise ValueError(operation)
        except (ReactorError, LookupError) as exc:
            return False, f"{row}: {exc}"
        self.log_change(request, row, message)
        return True, message

    def _confirmation(
        self, request: HttpRequest, queryset: QuerySet[Execution], operation: str
    ) -> TemplateResponse:
        opts = self.model._meta
        by_status = (
            queryset.order_by()
            .values("status")
            .annotate(count=Count("pk"))
            .order_by("-count", "status")
        )
        labels = dict(ExecutionStatus.choices)
        states = [
            {"status": s["status"], "label": labels.get(s["status"], s["status"]), **s}
            for s in by_status
        ]
        count = sum(int(s["count"]) for s in by_status)
        context = {
            **self.admin_site.each_context(request),
            "title": OPERATIONS[operation]["title"],
            "opts": opts,
            "operation": operation,
            "description": OPERATIONS[operation]["description"],
            "button": OPERATIONS[operation]["button"],
            "count": count,
            "states": states,
            "sample": [
                {"row": row, "badge": status_badge(row.status, row.get_status_display())}
                for row in queryset[:CONFIRMATION_SAMPLE]
            ],
            "more": max(count - CONFIRMATION_SAMPLE, 0),
            "select_across": request.POST.get("select_across") == "1",
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "action": request.POST.get("action", ""),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/django_reactor/execution/action_confirmation.html", context
        )

    # -- detail page
    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        if obj is not None:
            context.update(self._detail(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _detail(self, request: HttpRequest, obj: Execution) -> dict[str, Any]:
        from .. import registry, services
        from ..engine.outcomes import ErrorInfo
        from ..exceptions import ReactorNotRegistered
        from ..handle import StepView

        records = list(StepRecord.objects.filter(execution=obj).order_by("seq"))
        events = list(ExecutionEvent.objects.filter(execution=obj).order_by("seq"))
        interrupts = list(Interrupt.objects.filter(execution=obj).order_by("id"))
        children = list(
            Execution.objects.filter(parent=obj)
            .order_by("created_at")
            .only("id", "reactor", "status", "parent_step", "detached", "created_at")
        )
        retried_as = Execution.objects.filter(retry_of=obj).only("id", "status").first()

        graph = ""
        graph_problem = ""
        definition = None
        try:
            definition = registry.get(obj.reactor).definition
        except ReactorNotRegistered as exc:
            graph_problem = str(exc)
        if definition is not None:
            try:
                from ..graph import render_svg, step_states
            except ImportError:
                graph_problem = "the graph renderer (django_reactor.graph) is not available"
            else:
                graph = render_svg(definition, step_states(obj, records))

        steps = []
        for record in records:
            view = StepView.from_row(record)
            steps.append(
                {
                    "view": view,
                    "badge": status_badge(view.status, record.get_status_display()),
                    "rollback_label": record.get_rollback_display(),
                    "arguments": short_json(view.arguments, 120),
                    "result": "" if view.result is None else short_json(view.result, 120),
                    "error": str(view.error) if view.error else "",
                    "rollback_error": (view.rollback_error or {}).get("message", "")
                    if view.rollback_error
                    else "",
                    "duration": format_duration(view.started_at, view.finished_at),
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
                }
            )

        can_resume = self.has_resume_interrupt_permission(request, obj)
        waiting = [
            {
                "row": i,
                "badge": status_badge(i.status, i.get_status_display()),
                "resume_url": reverse(
                    f"admin:{APP}_execution_resume", args=[quote(str(obj.pk)), i.step]
                ),
            }
            for i in interrupts
        ]
        composed_child = obj.parent_id is not None and not obj.detached
        buttons = []
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
        failure = ErrorInfo.from_dict(obj.failure) if obj.failure else None
        return {
            "reactor_maps": map_sections(request, obj),
            "reactor_graph": graph,
            "reactor_graph_problem": graph_problem,
            "reactor_steps": steps,
            "reactor_trace": trace,
            "reactor_failure": failure,
            "reactor_failure_fields": failure_fields(failure),
            "reactor_interrupts": waiting,
            "reactor_can_resume": can_resume and obj.status == ExecutionStatus.PAUSED,
            "reactor_children": [
                {"row": c, "badge": status_badge(c.status, c.get_status_display())}
                for c in children
            ],
            "reactor_retried_as": retried_as,
            "reactor_buttons": [
                {
                    "name": name,
                    "label": label,
                    "help": help_text,
                    "url": reverse(f"admin:{APP}_execution_{name}", args=[quote(str(obj.pk))]),
                }
                for name, label, help_text in buttons
            ],
            "reactor_status_badge": status_badge(obj.status, obj.get_status_display()),
        }

    # -- custom URLs
    def get_urls(self) -> list[URLPattern]:
        def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            def call(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                return view(request, *args, **kwargs)

            # Services refuse to run step code inside a request's transaction (ATOMIC_REQUESTS).
            return self.admin_site.admin_view(transaction.non_atomic_requests(call))

        name = f"{APP}_execution"
        custom = [
            path("parked/", wrap(self.parked_view), name=f"{name}_parked"),
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name=f"{name}_cancel"),
            path("<path:object_id>/undo/", wrap(self.undo_view), name=f"{name}_undo"),
            path("<path:object_id>/retry/", wrap(self.retry_view), name=f"{name}_retry"),
            path(
                "<path:object_id>/resume/<str:step>/",
                wrap(self.resume_view),
                name=f"{name}_resume",
            ),
        ]
        return custom + super().get_urls()

    def _get_run(self, request: HttpRequest, object_id: str) -> Execution:
        try:
            obj = self.get_object(request, unquote(object_id))
        except ValueError:
            obj = None
        if obj is None:
            raise Http404(f"no execution with id {object_id!r}")
        return obj

    def _single(
        self, request: HttpRequest, object_id: str, operation: str, allowed: bool
    ) -> HttpResponse:
        if not allowed:
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        row = self._get_run(request, object_id)
        reason = request.POST.get("reason", "").strip()[:500]
        ok, text = self._operate(request, row, operation, reason=reason)
        self.message_user(request, text, messages.SUCCESS if ok else messages.ERROR)
        if ok and operation == "retry":
            retried = Execution.objects.filter(retry_of=row).only("id").first()
            if retried is not None:
                return redirect(
                    reverse(f"admin:{APP}_execution_change", args=[quote(str(retried.pk))])
                )
        return redirect(reverse(f"admin:{APP}_execution_change", args=[quote(str(row.pk))]))

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        allowed = self.has_cancel_execution_permission(request)
        return self._single(request, object_id, "cancel", allowed)

    def undo_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._single(request, object_id, "undo", self.has_undo_execution_permission(request))

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        allowed = self.has_retry_execution_permission(request)
        return self._single(request, object_id, "retry", allowed)

    def resume_view(self, request: HttpRequest, object_id: str, step: str) -> HttpResponse:
        from .. import registry, services
        from ..exceptions import (
            AlreadyResumed,
            InterruptClosed,
            InvalidPayload,
            NotWaiting,
            ReactorError,
            ReactorNotRegistered,
        )

        if not self.has_resume_interrupt_permission(request):
            raise PermissionDenied
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        row = self._get_run(request, object_id)
        change_url = reverse(f"admin:{APP}_execution_change", args=[quote(str(row.pk))])
        interrupt = Interrupt.objects.filter(execution=row, step=step).first()
        if interrupt is None:
            raise Http404(f"execution {row.id} has no interrupt {step!r}")
        serializer_class = None
        definition_problem = ""
        try:
            spec = registry.get(row.reactor).definition.by_name.get(step)
            if spec is not None and spec.interrupt is not None:
                serializer_class = spec.interrupt.payload
            else:
                definition_problem = f"{step!r} is no longer an interrupt of {row.reactor}"
        except ReactorNotRegistered as exc:
            definition_problem = str(exc)
        example = serializer_example(serializer_class()) if serializer_class else {}
        initial = {
            "payload": json.dumps(example, indent=2),
            "background": interrupt.resume_mode == "background",
        }
        payload_errors: list[tuple[str, str]] = []
        if request.method == "POST":
            form = ResumeForm(request.POST, initial=initial)
            if form.is_valid():
                try:
                    services.resume_interrupt(
                        row.id,
                        step=step,
                        payload=form.cleaned_data["payload"],
                        background=form.cleaned_data["background"],
                    )
                except InvalidPayload as exc:
                    payload_errors = flatten_errors(exc.errors)
                    for field_path, message in payload_errors:
                        form.add_error(
                            "payload", f"{field_path}: {message}" if field_path else message
                        )
                    limit = f" of {exc.max_attempts}" if exc.max_attempts else ""
                    self.log_change(
                        request,
                        row,
                        f"Invalid payload for interrupt {step!r} (attempt {exc.attempts}{limit})",
                    )
                    if exc.run_failed:
                        self.message_user(request, str(exc), messages.ERROR)
                        return redirect(change_url)
                    self.message_user(
                        request,
                        _(
                            "The payload was refused (invalid payload %(attempts)s%(limit)s); "
                            "the run stays paused."
                        )
                        % {"attempts": exc.attempts, "limit": limit},
                        messages.WARNING,
                    )
                    interrupt.refresh_from_db()
                except AlreadyResumed as exc:
                    self.message_user(request, str(exc), messages.WARNING)
                    return redirect(change_url)
                except (InterruptClosed, NotWaiting, ReactorError, LookupError) as exc:
                    self.message_user(request, str(exc), messages.ERROR)
                    return redirect(change_url)
                else:
                    status = (
                        Execution.objects.filter(pk=row.pk).values_list("status", flat=True).get()
                    )
                    label = dict(ExecutionStatus.choices).get(status, status)
                    self.log_change(request, row, f"Resumed interrupt {step!r}")
                    self.message_user(
                        request,
                        _("Payload accepted for %(step)s; the run is now %(status)s.")
                        % {"step": step, "status": str(label).lower()},
                        messages.SUCCESS,
                    )
                    return redirect(change_url)
        else:
            form = ResumeForm(initial=initial)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Resume %(step)s") % {"step": step},
            "opts": self.model._meta,
            "original": row,
            "change_url": change_url,
            "interrupt": interrupt,
            "interrupt_badge": status_badge(interrupt.status, interrupt.get_status_display()),
            "waiting": interrupt.status == InterruptStatus.WAITING,
            "form": form,
            "payload_errors": payload_errors,
            "fields": serializer_help(serializer_class),
            "serializer_name": serializer_class.__name__ if serializer_class else "",
            "definition_problem": definition_problem,
            "status_badge": status_badge(row.status, row.get_status_display()),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_reactor/execution/resume.html", context)

    def parked_view(self, request: HttpRequest) -> HttpResponse:
        """Runs waiting: at interrupts, and pending until a wake-up (retry backoff, async unit)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        waiting = (
            Interrupt.objects.filter(status=InterruptStatus.WAITING)
            .select_related("execution")
            .only(
                "id",
                "step",
                "correlation_id",
                "expires_at",
                "invalid_attempts",
                "max_attempts",
                "resume_mode",
                "created_at",
                "execution__id",
                "execution__reactor",
                "execution__status",
                "execution__updated_at",
            )
            .order_by("created_at", "id")
        )
        last = ExecutionEvent.objects.filter(execution=OuterRef("pk")).order_by("-seq")
        pending = (
            Execution.objects.filter(
                status__in=[ExecutionStatus.PENDING, ExecutionStatus.ROLLING_BACK]
            )
            .annotate(
                last_kind=Subquery(last.values("kind")[:1]),
                last_data=Subquery(last.values("data")[:1]),
                last_step=Subquery(last.values("step")[:1]),
                last_at=Subquery(last.values("at")[:1]),
            )
            # Pending runs with a wake-up or parked; runs rolling back parked on a map's undo.
            .filter(
                Q(status=ExecutionStatus.PENDING, wake_at__isnull=False)
                | Q(last_kind=EventKind.PARK)
            )
            .only("id", "reactor", "status", "current_step", "updated_at", "wake_at")
            .order_by(F("wake_at").asc(nulls_last=True), "updated_at")
        )
        interrupts_page = Paginator(waiting, self.list_per_page).get_page(request.GET.get("ip"))
        pending_page = Paginator(pending, self.list_per_page).get_page(request.GET.get("pp"))
        maps = parked_maps(list(pending_page))
        context = {
            **self.admin_site.each_context(request),
            "title": _("Parked executions"),
            "opts": self.model._meta,
            "interrupts_page": interrupts_page,
            "interrupts": [
                {
                    "row": i,
                    "reactor": short_reactor(i.execution.reactor),
                    "link": execution_link(i.execution_id),
                }
                for i in interrupts_page
            ],
            "pending_page": pending_page,
            "pending": [
                {
                    "row": e,
                    "reactor": short_reactor(e.reactor),
                    "link": execution_link(e.id),
                    "badge": status_badge(e.status, e.get_status_display()),
                    "waits_for": waits_for(e, maps.get((e.id, e.last_step))),
                    "since": waiting_since(e, maps.get((e.id, e.last_step))),
                }
                for e in pending_page
            ],
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_reactor/execution/parked.html", context)


# ---------------------------------------------------------------------------- maps


def map_sections(request: HttpRequest, obj: Execution) -> list[dict[str, Any]]:
    """Each map step of the run: its summary (a few aggregate queries), progress and links.

    One query reads the run's maps (without their shared arguments); then, per map,
    ``map_store.summary`` counts the elements by status and samples the first failures.
    """
    from .. import map_store

    runs = list(
        MapRun.objects.filter(execution=obj)
        .order_by("created_at")
        .only(
            "id",
            "step",
            "status",
            "size",
            "fan_out",
            "atomic",
            "max_failures",
            "batch_size",
            "chunk_size",
            "stop_reason",
            "rollback_total",
            "rollback_settled",
            "created_at",
        )
    )
    if not runs:
        return []
    elements_url = ""
    if request.user.has_perm(f"{APP}.view_mapresult"):
        elements_url = reverse(f"admin:{APP}_mapresult_changelist")
    labels = dict(MapStatus.choices)
    sections = []
    for run in runs:
        summary = map_store.summary(run.pk, run)
        if not summary:  # deleted since the first query
            continue
        total = int(summary["total"])
        pending = int(summary["pending"])
        size = run.size if run.size is not None else total
        # Red: failed elements, and undos that failed.
        bad = int(summary["failed"]) + int(summary["undo_failed"])
        other = max(total - pending - int(summary["succeeded"]) - bad, 0)
        bar = progress(total - pending, size)
        segments = []
        for css, count, label in (
            ("succeeded", int(summary["succeeded"]), _("succeeded")),
            ("failed", bad, _("failed")),
            ("other", other, _("halted, not started or undone")),
        ):
            if count and size:
                width = f"{100.0 * count / size:.3f}"
                segments.append({"css": css, "count": count, "label": label, "width": width})
        counts = [
            {"name": name, "label": label, "value": summary[name]}
            for index, (name, label) in enumerate(MAP_COUNTS)
            if index < 4 or summary[name]
        ]
        link = ""
        failed_link = ""
        if elements_url:
            link = f"{elements_url}?{urlencode({'map_run__id__exact': str(run.pk)})}"
            failed_link = (
                f"{elements_url}?"
                f"{urlencode({'map_run__id__exact': str(run.pk), 'status__exact': 'failed'})}"
            )
        rollback = None
        if run.status in (MapStatus.ROLLING_BACK, MapStatus.ROLLED_BACK) and run.rollback_total:
            rollback = progress(run.rollback_settled, run.rollback_total)
        failures = summary["failures"]
        sections.append(
            {
                "run": run,
                "summary": summary,
                "badge": status_badge(run.status, labels.get(run.status, run.status)),
                "size": run.size,
                "progress": bar,
                "segments": segments,
                "counts": counts,
                "rollback": rollback,
                "failures": failures,
                "more_failures": max(int(summary["failed"]) - len(failures), 0)
                if summary["failures_truncated"]
                else 0,
                "elements_url": link,
                "failed_url": failed_link,
            }
        )
    return sections


def parked_maps(rows: list[Execution]) -> dict[tuple[Any, str], dict[str, Any]]:
    """The counters of the maps a page of parked runs waits for, in one query."""
    ids = [
        row.id
        for row in rows
        if getattr(row, "last_kind", None) == EventKind.PARK
        and (getattr(row, "last_data", None) or {}).get("waiting_for") in MAP_WAITS
    ]
    if not ids:
        return {}
    found = MapRun.objects.filter(execution_id__in=ids).values(
        "execution_id",
        "step",
        "size",
        "settled",
        "status",
        "rollback_total",
        "rollback_settled",
        "created_at",
    )
    return {(m["execution_id"], m["step"]): dict(m) for m in found}


def waiting_since(row: Execution, map_run: dict[str, Any] | None) -> Any:
    """When a parked run began to wait: its map's start, its last park, or its last change."""
    last_at = getattr(row, "last_at", None)  # annotated by the parked view's queryset
    if map_run is not None and (getattr(row, "last_data", None) or {}).get("waiting_for") == "map":
        return map_run["created_at"]
    if getattr(row, "last_kind", None) == EventKind.PARK and last_at is not None:
        return last_at
    return row.updated_at


OPERATIONS: dict[str, dict[str, Any]] = {
    "cancel": {
        "title": _("Cancel executions"),
        "button": _("Yes, cancel them"),
        "done": _("Cancelled"),
        "description": _(
            "Each run stops without rolling anything back (undo it for that). A run a live "
            "process is executing is asked to stop after its current step; finished runs are "
            "refused one by one."
        ),
    },
    "undo": {
        "title": _("Undo executions"),
        "button": _("Yes, undo them"),
        "done": _("Undid"),
        "description": _(
            "Each run's completed steps are rolled back, newest first, in this request; the run "
            "ends cancelled (failed if a step had failed). Runs that cannot be undone are "
            "refused one by one."
        ),
    },
    "retry": {
        "title": _("Retry executions"),
        "button": _("Yes, retry them"),
        "done": _("Retried"),
        "description": _(
            "Each failed run starts again as a new execution linked to it, from the first step "
            "with the stored inputs. Only failed runs that were not retried yet qualify."
        ),
    },
}
