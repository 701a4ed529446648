"""Bulk operations in the admin: act on every run of the filtered list (not only the page),
after a preview, and follow the operation's progress; through ``django_reactor.services``.

The executions list links to :meth:`BulkOperationAdmin.new_view` with its filters; the page
turns them into a :class:`~django_reactor.services.RunFilter`, asks for the action and what it
takes, shows the preview (how many runs by status, a sample, what each would undo), and starts
the operation on a worker once confirmed. The operations' list and pages show where each
stands, its runs' notes, and a Stop button.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, QueryDict
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext_lazy as _

from .. import services
from ..exceptions import ReactorError
from ..models import BulkItem, BulkOperation, ItemStatus
from ..services.bulk import ACTIONS, BulkPreview
from .acting import acting_for
from .console import REFRESH_SECONDS
from .display import APP, MomentsAdmin, moment

#: The executions list's query parameters, as a bulk filter's keys.
LIST_PARAMETERS = {
    "reactor": "reactor",
    "status__exact": "status",
    "created_at__gte": "created_after",
    "created_at__lt": "created_before",
}
#: Items listed on an operation's page: the ones that were not simply done first.
ITEMS_SHOWN = 50


def filter_of_list(query: QueryDict) -> dict[str, str]:
    """The bulk filter of the executions list's query: its filters (a search for a run's id
    too); InvalidFilter names what a bulk operation cannot take."""
    pairs = {key: str(query[name]) for name, key in LIST_PARAMETERS.items() if query.get(name)}
    term = (query.get("q") or "").strip()
    if term:
        try:
            pairs["id"] = str(uuid.UUID(term))
        except ValueError:
            raise services.InvalidFilter(
                f"the list is searched for {term!r}: a bulk operation takes the list's filters "
                "(reactor, status, created), not a search; clear the search box"
            ) from None
    for name, value in query.items():
        if name.startswith("attr.") and value:
            pairs[name] = str(value)
    return pairs


@admin.register(BulkOperation)
class BulkOperationAdmin(MomentsAdmin):
    """Bulk operations: read-only, newest first; started from the executions list."""

    list_display = (
        "action",
        "status",
        "total",
        "done",
        "skipped",
        "failed",
        "created_by",
        "created_at",
    )
    list_filter = ("status", "action")
    ordering = ("-created_at",)
    list_per_page = 50
    change_form_template = "admin/django_reactor/bulkoperation/change_form.html"
    readonly_fields = (
        "id",
        "action",
        "status",
        "filter_json",
        "parameters_json",
        "reason",
        "created_by",
        "total",
        "done",
        "skipped",
        "failed",
        "created_at",
        "started_at",
        "finished_at",
    )
    fields = readonly_fields

    @admin.display(description=_("filter"))
    def filter_json(self, obj: BulkOperation) -> str:
        return json.dumps(obj.run_filter, sort_keys=True)

    @admin.display(description=_("parameters"))
    def parameters_json(self, obj: BulkOperation) -> str:
        return json.dumps(obj.parameters, sort_keys=True, default=str)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.has_perm(f"{APP}.view_execution"))

    def get_urls(self) -> list[URLPattern]:
        def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            def acting(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                with acting_for(request):  # recorded as the signed-in user's
                    return view(request, *args, **kwargs)

            return self.admin_site.admin_view(acting)

        name = f"{APP}_bulkoperation"
        return [
            path("new/", wrap(self.new_view), name=f"{name}_new"),
            path("<path:object_id>/stop/", wrap(self.stop_view), name=f"{name}_stop"),
            *super().get_urls(),
        ]

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: BulkOperation | None = None,
    ) -> HttpResponse:
        if obj is not None:
            items = BulkItem.objects.filter(operation=obj)
            context.update(
                {
                    "bulk_items": list(
                        items.exclude(status=ItemStatus.DONE).order_by("id")[:ITEMS_SHOWN]
                    )
                    or list(items.order_by("id")[:ITEMS_SHOWN]),
                    "bulk_left": max(obj.total - obj.done - obj.skipped - obj.failed, 0),
                    "bulk_may_stop": obj.status in ("pending", "running")
                    and request.user.has_perm(f"{APP}.{ACTIONS[obj.action].permission}"),
                    "reactor_refresh_seconds": REFRESH_SECONDS
                    if obj.status in ("pending", "running")
                    else None,
                }
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def stop_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: stop the operation (the runs not taken care of yet are left alone)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        operation = self.get_object(request, unquote(object_id))
        if operation is None:
            raise Http404(f"no bulk operation with id {object_id!r}")
        if not request.user.has_perm(f"{APP}.{ACTIONS[operation.action].permission}"):
            raise PermissionDenied
        progress = services.stop_bulk(operation.id)
        self.message_user(
            request,
            _("Stopped: %(done)d done, %(left)d left alone.")
            % {"done": progress.done, "left": progress.left},
            messages.SUCCESS,
        )
        return redirect(
            reverse(f"admin:{APP}_bulkoperation_change", args=[quote(str(operation.pk))])
        )

    def new_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the filter of the list it came from, the action to choose and, once chosen, the
        preview; POST: start the operation."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        source = request.POST if request.method == "POST" else request.GET
        action_name = source.get("action", "")
        preview: BulkPreview | None = None
        problem = ""
        pairs: dict[str, str] = {}
        parameters: dict[str, Any] = {}
        try:
            pairs = (
                json.loads(source["filter"]) if "filter" in source else filter_of_list(request.GET)
            )
            run_filter = services.RunFilter.parse(pairs)
            if action_name:
                action = ACTIONS.get(action_name)
                if action is None:
                    raise services.InvalidFilter(f"there is no bulk action {action_name!r}")
                if not request.user.has_perm(f"{APP}.{action.permission}"):
                    raise PermissionDenied
                parameters = _parameters(action_name, source)
                if request.method == "POST" and source.get("post") == "yes":
                    progress = services.start_bulk(
                        action_name,
                        run_filter,
                        parameters,
                        reason=source.get("reason", "")[:1000],
                    )
                    self.message_user(
                        request,
                        _("Started: %(action)s of %(total)d run(s) on a worker.")
                        % {"action": action_name, "total": progress.total},
                        messages.SUCCESS,
                    )
                    return redirect(
                        reverse(f"admin:{APP}_bulkoperation_change", args=[quote(str(progress.id))])
                    )
                preview = services.preview_bulk(action_name, run_filter, parameters)
        except (ReactorError, ValueError) as exc:
            problem = str(exc)
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request,
            "admin/django_reactor/bulkoperation/new.html",
            {
                **self.admin_site.each_context(request),
                "title": _("Act on every run of the list"),
                "opts": self.model._meta,
                "filter": pairs,
                "filter_json": json.dumps(pairs),
                "actions": [
                    {"name": name, "does": action.does, "chosen": name == action_name}
                    for name, action in ACTIONS.items()
                    if request.user.has_perm(f"{APP}.{action.permission}")
                ],
                "action": action_name,
                "parameters": parameters,
                "preview": preview,
                "problem": problem,
                "moment": moment,
                "media": self.media,
            },
        )


def _parameters(action: str, source: QueryDict) -> dict[str, Any]:
    """What the chosen action takes, from the page's fields (payload as a JSON object)."""
    parameters: dict[str, Any] = {}
    for name in ACTIONS[action].takes:
        value = source.get(name, "")
        if not value:
            continue
        if name == "payload":
            parameters[name] = json.loads(value)
        elif name == "undo_abandoned":
            parameters[name] = value in ("yes", "on", "true")
        else:
            parameters[name] = value
    return parameters
