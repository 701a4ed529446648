"""Patches in the admin: the page of every patch some run decided, with how many unfinished
runs are on each branch (linked to those runs), the run list's filter by branch, and a run's
decisions on its page. Read-only, through ``services.patches`` and ``store.patches``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import services, store
from ..models import Execution
from ..states import TERMINAL_STATUSES
from .console import ConsoleViews

if TYPE_CHECKING:
    import uuid

APP = "django_reactor"
#: The run list's parameter: ``<patch>:new`` or ``<patch>:old``.
PARAMETER = "patch"
#: The run list's parameter that leaves the finished runs out (the page's counts do).
UNFINISHED = "unfinished"


def branch_value(name: str, taken: bool) -> str:
    """The filter's value for the runs on one branch of patch ``name``."""
    return f"{name}:{'new' if taken else 'old'}"


def runs_on_branch_url(name: str, taken: bool) -> str:
    """The run list of the unfinished runs on one branch of patch ``name``."""
    changelist = reverse(f"admin:{APP}_execution_changelist")
    return f"{changelist}?{urlencode({PARAMETER: branch_value(name, taken), UNFINISHED: '1'})}"


class PatchListFilter(admin.SimpleListFilter):
    """The runs on one branch of a patch (``?patch=tax-v2:old``; with ``&unfinished=1``, those
    not finished yet, as the patches page counts them).

    Shown only while it filters (the patches page links to it): listing every branch would
    read every run's decisions on each load of the run list.
    """

    title = _("patch branch")
    parameter_name = PARAMETER

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Execution]
    ) -> list[tuple[str, str]]:
        value = self.value()
        if not value:
            return []
        name, _sep, branch = str(value).rpartition(":")
        return [(str(value), f"{name}: {branch}")]

    def __init__(
        self,
        request: HttpRequest,
        params: dict[str, list[str]],
        model: type[Execution],
        model_admin: admin.ModelAdmin[Execution],
    ) -> None:
        super().__init__(request, params, model, model_admin)
        if UNFINISHED in params:  # its companion: taken here, or the list says it is unknown
            self.used_parameters[UNFINISHED] = params.pop(UNFINISHED)[-1]

    def expected_parameters(self) -> list[str | None]:
        return [PARAMETER, UNFINISHED]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Execution]) -> QuerySet[Execution]:
        value = self.value()
        if not value:
            return queryset
        name, _sep, branch = str(value).rpartition(":")
        queryset = queryset.filter(id__in=store.patches.runs_on_branch(name, branch == "new"))
        if self.used_parameters.get(UNFINISHED):
            queryset = queryset.exclude(status__in=list(TERMINAL_STATUSES))
        return queryset


def decisions_shown(execution_id: uuid.UUID) -> SafeString | str:
    """A run's decisions, one line each: the patch, its branch, the step that decided it."""
    decisions = store.patches.of_run(execution_id)
    if not decisions:
        return "-"
    return format_html_join(
        SafeString("<br>"),
        '<code>{}</code>: {} branch <span class="reactor-muted">(decided in {}, {})</span>',
        (
            (
                d.name,
                _("new") if d.taken else _("old"),
                d.step,
                d.decided_at.strftime("%Y-%m-%d %H:%M:%S"),
            )
            for d in decisions
        ),
    )


class PatchViews(ConsoleViews):
    """The patches page, as a view of the execution admin (read-only: anyone who may view
    executions may open it)."""

    def patches_view(self, request: HttpRequest) -> HttpResponse:
        """Every patch some run decided: its unfinished runs on each branch, linked."""
        patches = [
            {
                "name": patch.name,
                "new": patch.new,
                "old": patch.old,
                "runs": patch.runs,
                "new_url": runs_on_branch_url(patch.name, True),
                "old_url": runs_on_branch_url(patch.name, False),
            }
            for patch in services.patches.branches()
        ]
        return self._console(
            request,
            "admin/django_reactor/execution/patches.html",
            _("Patches"),
            {"patches": patches},
        )
