"""Pausing reactors from the admin: the banner every console page shows while a reactor is
paused, and the views that pause and unpause one (through ``django_reactor.services``, behind
the ``pause_execution`` permission). Single runs are paused from their page
(:mod:`.operations`)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext_lazy as _

from .. import services, store
from ..exceptions import ReactorError
from ..models import Execution
from ..services.guards import reactor_named
from ..states import ExecutionStatus
from .display import APP, moment


def paused_banner(request: HttpRequest, reactor: str | None = None) -> list[dict[str, Any]]:
    """The paused reactors as the banner lists them (only ``reactor``'s on a run's page), each
    with the URL that unpauses it when the user may."""
    may = request.user.has_perm(f"{APP}.pause_execution")
    paused = [p for p in services.paused_reactors() if reactor is None or p.reactor == reactor]
    return [
        {
            "reactor": pause.reactor,
            "short": _plain(pause.reactor),
            "reason": pause.reason,
            "by": pause.paused_by,
            "since": moment(pause.paused_at),
            "suspended": store.pauses.suspended_count(pause.reactor),
            "unpause_url": reverse(f"admin:{APP}_execution_unpause_reactor", args=[pause.reactor])
            if may
            else None,
        }
        for pause in paused
    ]


class PauseViews(admin.ModelAdmin):
    """Pause and unpause a reactor, as views of the execution admin."""

    def has_pause_execution_permission(
        self, request: HttpRequest, obj: Execution | None = None
    ) -> bool:
        return bool(request.user.has_perm(f"{APP}.pause_execution"))

    def pause_reactor_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """GET: what pausing the reactor does, with a reason to give; POST: pause it."""
        if not self.has_pause_execution_permission(request):
            raise PermissionDenied
        overview = reverse(f"admin:{APP}_execution_overview")
        if request.method == "POST":
            try:
                paused = services.pause_reactor(name, reason=request.POST.get("reason", "")[:500])
            except ReactorError as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return redirect(overview)
            text = (
                _("%(reactor)s is paused: its runs stop at their next step, new ones wait.")
                if paused.new
                else _("%(reactor)s was paused already; the first pause stands.")
            ) % {"reactor": _plain(paused.reactor)}
            self.message_user(request, text, messages.SUCCESS if paused.new else messages.INFO)
            return redirect(overview)
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET", "POST"])
        try:
            reactor = reactor_named(name).definition.name
        except ReactorError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return redirect(overview)
        runs = Execution.objects.filter(reactor=reactor, parent__isnull=True)
        in_flight = {
            status: runs.filter(status=status).values("pk")[:10_001].count()
            for status in (
                ExecutionStatus.RUNNING,
                ExecutionStatus.PENDING,
                ExecutionStatus.SCHEDULED,
                ExecutionStatus.PAUSED,
            )
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request,
            "admin/django_reactor/execution/pause_reactor.html",
            {
                **self.admin_site.each_context(request),
                "title": _("Pause %(reactor)s?") % {"reactor": _plain(reactor)},
                "opts": self.model._meta,
                "reactor": reactor,
                "in_flight": [
                    {"status": status, "label": ExecutionStatus(status).label, "count": count}
                    for status, count in in_flight.items()
                ],
                "media": self.media,
            },
        )

    def unpause_reactor_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """POST: let the reactor's runs go on (released at ``UNPAUSE_RATE`` a second)."""
        if not self.has_pause_execution_permission(request):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            done = services.unpause_reactor(name)
        except ReactorError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.message_user(
                request,
                _("%(reactor)s is unpaused; %(count)d suspended run(s) released, oldest first.")
                % {"reactor": _plain(done.reactor), "count": done.released},
                messages.SUCCESS,
            )
        back = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
            back = reverse(f"admin:{APP}_execution_overview")
        return redirect(back)


def _plain(reactor: str) -> str:
    """A reactor's short name as text (for messages and titles)."""
    return reactor.rsplit(".", 1)[-1]
