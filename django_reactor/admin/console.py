"""The console pages of the execution admin: the overview and the coordination panel.

Both are read-only: anyone who may view executions may open them. The overview reads through
``store.overview``; the panel through the coordination backend's ``inspect()``.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _

from .. import services
from .coordination import coordination_context
from .health import health_context
from .overview import WINDOWS, overview_context
from .pauses import paused_banner

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

#: How often a page of runs in flight reads itself again, in seconds (unless someone types or
#: has an expander open): a run's page while it moves, the overview, a list of moving runs.
REFRESH_SECONDS = 5


class ConsoleViews(admin.ModelAdmin):
    """The overview and the coordination panel, as views of the execution admin."""

    def _console(
        self, request: HttpRequest, template: str, title: StrOrPromise, context: dict[str, object]
    ) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request,
            template,
            {
                **self.admin_site.each_context(request),
                "title": title,
                "opts": self.model._meta,
                "reactor_refresh_seconds": REFRESH_SECONDS,
                **context,
            },
        )

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        """Runs by status over the last hour or day, throughput, failure rate, stuck runs,
        runs needing attention, waiting interrupts, the outbox's depth, and the fleet's health
        (workers, sweeper, late work, each reactor's last hour)."""
        window = request.GET.get("window", "hour")
        if window not in WINDOWS:
            window = "hour"
        paused = paused_banner(request)
        return self._console(
            request,
            "admin/django_reactor/execution/overview.html",
            _("Overview"),
            {
                **overview_context(window),
                **health_context(),
                "reactor_paused": paused,
                "health_paused": {p["reactor"] for p in paused},
                "health_may_pause": request.user.has_perm("django_reactor.pause_execution"),
            },
        )

    def coordination_view(self, request: HttpRequest) -> HttpResponse:
        """What the coordination backend holds now: locks, semaphores, rate limits, periods
        and ordered locks."""
        context = {
            **coordination_context(),
            "concurrency_keys": services.flow.keys_in_use(),
            "delayed_keys": services.flow.delayed_keys(),
        }
        if "at" in context:
            context["at"] = dt.datetime.fromtimestamp(context["at"], tz=dt.UTC)
        return self._console(
            request,
            "admin/django_reactor/execution/coordination.html",
            _("Coordination"),
            context,
        )
