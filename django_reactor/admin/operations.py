"""The operations of the execution admin: bulk actions behind a confirmation page, and the
single-run views (cancel, undo, retry, resume) and the parked runs' page. Every one goes
through ``django_reactor.services`` and is recorded as an admin ``LogEntry``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import (
    Count,
    OuterRef,
    QuerySet,
    Subquery,
)
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import registry, services
from ..exceptions import ReactorError
from ..models import Execution, ExecutionEvent, Interrupt
from ..states import ExecutionStatus, InterruptStatus
from . import resume
from .display import (
    APP,
    execution_link,
    short_reactor,
    status_badge_of,
    waits_for,
)
from .maps import parked_maps, waiting_since
from .paging import CappedPaginator

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    from ..handle import ExecutionHandle

# At most this many per-run error messages after a bulk action (the rest are counted).
MAX_ERROR_MESSAGES = 20
# Runs read per query while a bulk action works through them.
BULK_BATCH = 200
# Rows listed on a bulk action's confirmation page (the count and the states cover the rest).
CONFIRMATION_SAMPLE = 100


OPERATIONS: dict[str, dict[str, StrOrPromise]] = {
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
    "migrate": {
        "title": _("Migrate executions onto the deployed definition"),
        "button": _("Yes, migrate them"),
        "done": _("Migrated"),
        "description": _(
            "Each run parked definition_changed moves onto its reactor's definition in the "
            "deployed code when the steps it recorded exist there unchanged, keeping their "
            "results, and a worker takes it again from where it stopped. Runs whose steps do "
            "not map are refused with the reason; for a renamed step use "
            "`manage.py reactor_migrate REACTOR --map old=new`."
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


# Single-run operations asked for again on a page that says what they will do.
DESTRUCTIVE = frozenset({"cancel", "undo"})
SINGLE_TITLES = {"cancel": _("Cancel this execution?"), "undo": _("Undo this execution?")}
SINGLE_BUTTONS = {"cancel": _("Yes, cancel it"), "undo": _("Yes, undo it")}


def _steps_to_undo(handle: ExecutionHandle) -> list[dict[str, object]]:
    """The run's completed steps not rolled back yet, newest first (the order undo takes),
    each with whether its step declares an undo (a step without one only gets a trace entry)."""
    try:
        definition = registry.get(handle.reactor).definition
    except ReactorError:
        definition = None
    steps = []
    for view in reversed(handle.steps):
        if view.status != "completed" or view.rollback:
            continue
        spec = definition.by_name.get(view.name) if definition is not None else None
        steps.append({"name": view.name, "undo": spec is None or spec.has_undo})
    return steps


class ExecutionOperations(admin.ModelAdmin):
    """The operations part of :class:`~.executions.ExecutionAdmin`: each behind its custom
    permission, through the services."""

    def _perm(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"{APP}.{codename}")

    def has_cancel_execution_permission(
        self, request: HttpRequest, obj: Execution | None = None
    ) -> bool:
        return self._perm(request, "cancel_execution")

    def has_undo_execution_permission(
        self, request: HttpRequest, obj: Execution | None = None
    ) -> bool:
        return self._perm(request, "undo_execution")

    def has_retry_execution_permission(
        self, request: HttpRequest, obj: Execution | None = None
    ) -> bool:
        return self._perm(request, "retry_execution")

    def has_resume_interrupt_permission(
        self, request: HttpRequest, obj: Execution | None = None
    ) -> bool:
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

    @admin.action(
        permissions=["retry_execution"],
        description=_("Migrate selected parked executions onto the deployed definition"),
    )
    def migrate_selected(
        self, request: HttpRequest, queryset: QuerySet[Execution]
    ) -> HttpResponse | None:
        return self._bulk(request, queryset, "migrate")

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
        try:
            if operation == "cancel":
                handle = services.cancel(row.id, reason=reason or "cancelled from the admin")
                message = f"Cancel requested: {handle.status}"
                if reason:
                    message += f" ({reason})"
            elif operation == "undo":
                handle = services.undo(row.id, reason=reason)
                message = f"Undone: {handle.status}"
            elif operation == "retry":
                outcome = services.retry(row.id, reason=reason)
                message = f"Retried as {outcome.execution_id}"
            elif operation == "migrate":
                (migrated,) = services.migrate_parked(
                    row.reactor, execution_ids=[row.id], reason=reason
                )
                if not migrated.moved:
                    return False, f"{row}: {migrated.reason}"
                message = "Migrated onto the deployed definition: a worker takes it again"
            elif operation == "wake":
                handle = services.wake(row.id, reason=reason)
                message = f"Woken: {handle.status}, a worker takes it now"
            elif operation == "pause":
                handle = services.pause(row.id, reason=reason)
                message = (
                    "Paused: suspended"
                    if handle.status == ExecutionStatus.SUSPENDED
                    else "Pause requested: it stops at its next step boundary"
                )
            elif operation == "unpause":
                handle = services.unpause(row.id)
                message = f"Unpaused: {handle.status}"
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
                {"row": row, "badge": status_badge_of(row)}
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
        if operation in DESTRUCTIVE and request.POST.get("post") != "yes":
            return self._single_confirmation(request, row, operation, reason)
        ok, text = self._operate(request, row, operation, reason=reason)
        self.message_user(request, text, messages.SUCCESS if ok else messages.ERROR)
        if ok and operation == "retry":
            retried = Execution.objects.filter(retry_of=row).only("id").first()
            if retried is not None:
                return redirect(
                    reverse(f"admin:{APP}_execution_change", args=[quote(str(retried.pk))])
                )
        return redirect(reverse(f"admin:{APP}_execution_change", args=[quote(str(row.pk))]))

    def _single_confirmation(
        self, request: HttpRequest, row: Execution, operation: str, reason: str
    ) -> TemplateResponse:
        """What cancelling or undoing this run will do, with a button that does it."""
        handle = services.find(row.id)
        undoing: list[dict[str, object]] = []
        maps: list[dict[str, object]] = []
        if operation == "undo":
            undoing = _steps_to_undo(handle)
            maps = [
                {"step": m["step"], "succeeded": m["succeeded"]}
                for m in handle.maps
                if m.get("succeeded")
            ]
        context = {
            **self.admin_site.each_context(request),
            "title": SINGLE_TITLES[operation],
            "opts": self.model._meta,
            "original": row,
            "operation": operation,
            "badge": status_badge_of(row),
            "undoing": undoing,
            "maps": maps,
            "reason": reason,
            "button": SINGLE_BUTTONS[operation],
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/django_reactor/execution/single_confirmation.html", context
        )

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        allowed = self.has_cancel_execution_permission(request)
        return self._single(request, object_id, "cancel", allowed)

    def undo_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._single(request, object_id, "undo", self.has_undo_execution_permission(request))

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        allowed = self.has_retry_execution_permission(request)
        return self._single(request, object_id, "retry", allowed)

    def pause_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        allowed = request.user.has_perm(f"{APP}.pause_execution")
        return self._single(request, object_id, "pause", allowed)

    def unpause_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        allowed = request.user.has_perm(f"{APP}.pause_execution")
        return self._single(request, object_id, "unpause", allowed)

    def wake_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """ "Wake now": end a sleep, or start a scheduled run, at once (as cancelling, it
        steers the run: the same permission)."""
        allowed = self.has_cancel_execution_permission(request)
        return self._single(request, object_id, "wake", allowed)

    def resume_view(self, request: HttpRequest, object_id: str, step: str) -> HttpResponse:
        """An interrupt's resume page (``admin.resume``)."""
        return resume.resume_view(self, request, object_id, step)

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

        # Every park stores a wake-up (the net under a lost message, or the sleep's time):
        # the runs are read through the wake-up index, in its order, and only the page's rows
        # get their last event looked up, not every pending run.
        waking = Execution.objects.filter(
            status__in=[ExecutionStatus.PENDING, ExecutionStatus.ROLLING_BACK],
            wake_at__isnull=False,
        ).order_by("wake_at", "updated_at")
        pending = waking.annotate(
            last_kind=Subquery(last.values("kind")[:1]),
            last_data=Subquery(last.values("data")[:1]),
            last_step=Subquery(last.values("step")[:1]),
            last_at=Subquery(last.values("at")[:1]),
        ).only("id", "reactor", "status", "current_step", "updated_at", "wake_at")
        # Counted up to COUNT_LIMIT rows each, and paged that far.
        interrupts_page = CappedPaginator(waiting, self.list_per_page).get_page(
            request.GET.get("ip")
        )
        # Counted without the order: the planner, which cannot know that only waiting runs
        # have a wake-up, would sort them all to count the first thousand (40 ms at 1,000,000
        # runs, against 12).
        pending_page = CappedPaginator(
            pending, self.list_per_page, counted_by=waking.order_by().only("id")
        ).get_page(request.GET.get("pp"))
        # Annotated rows (last_kind, last_step...): the page's type does not carry them.
        pending_rows: list[Any] = list(pending_page)
        maps = parked_maps(pending_rows)
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
                    "badge": status_badge_of(e),
                    "waits_for": waits_for(e, maps.get((e.id, e.last_step))),
                    "since": waiting_since(e, maps.get((e.id, e.last_step))),
                }
                for e in pending_rows
            ],
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_reactor/execution/parked.html", context)
