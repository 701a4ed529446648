"""Forking a run from the admin: choose the step, see the plan (the steps carried, those
undone first, newest first, those run again, what may happen twice), then confirm. Through
``services.fork``, behind the ``retry_execution`` permission."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from .. import registry, services
from ..exceptions import ForkNeedsUndo, ReactorError
from ..models import Execution
from ..states import StepStatus
from .display import APP, status_badge_of


def fork_step_default(row: Execution) -> str:
    """The step a fork of ``row`` starts from unless the operator picks another: the step
    that failed, else the first step."""
    failure = row.failure or {}
    step = failure.get("step") if isinstance(failure, dict) else None
    return str(step) if step else ""


class ForkViews(admin.ModelAdmin):
    """The fork page of the execution admin."""

    def fork_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the steps to fork from and the plan for the one chosen (``?step=``); POST:
        fork (undoing the abandoned branch first when the plan has one)."""
        if not request.user.has_perm(f"{APP}.retry_execution"):
            raise PermissionDenied
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        row = self.get_object(request, unquote(object_id))
        if row is None:
            raise Http404(f"no execution with id {object_id!r}")
        page = reverse(f"admin:{APP}_execution_change", args=[quote(str(row.pk))])
        try:
            steps = [
                spec.name for spec in registry.of_run(row.reactor, row.version).definition.steps
            ]
        except ReactorError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return redirect(page)
        source = request.POST if request.method == "POST" else request.GET
        step = source.get("step") or fork_step_default(row) or steps[0]
        if request.method == "POST":
            return self._fork(request, row, step, page)
        try:
            plan = services.fork_plan(row.id, step)
            problem = ""
        except ReactorError as exc:
            plan, problem = None, str(exc)
        recorded = {s.step: s.status for s in row.steps.all()}
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request,
            "admin/django_reactor/execution/fork.html",
            {
                **self.admin_site.each_context(request),
                "title": _("Fork this execution?"),
                "opts": self.model._meta,
                "original": row,
                "badge": status_badge_of(row),
                "steps": [
                    {"name": name, "status": recorded.get(name, ""), "chosen": name == step}
                    for name in steps
                ],
                "step": step,
                "plan": plan,
                "problem": problem,
                "failed_status": StepStatus.FAILED,
                "media": self.media,
            },
        )

    def _fork(self, request: HttpRequest, row: Execution, step: str, page: str) -> HttpResponse:
        confirmed = request.POST.get("undo_abandoned") == "yes"
        try:
            outcome = services.fork(row.id, step, undo_abandoned=confirmed)
        except ForkNeedsUndo as exc:
            # The plan grew since the page was shown: show it again.
            self.message_user(request, str(exc), messages.WARNING)
            fork_page = reverse(f"admin:{APP}_execution_fork", args=[quote(str(row.pk))])
            return redirect(f"{fork_page}?step={step}")
        except ReactorError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return redirect(page)
        message = f"Forked from {step} as {outcome.execution_id}: {outcome.status}"
        self.log_change(request, row, message)
        self.message_user(request, message, messages.SUCCESS)
        return redirect(
            reverse(f"admin:{APP}_execution_change", args=[quote(str(outcome.execution_id))])
        )
