"""Admin pages for schedules: the list (next and last fire, policies), the form (every field
checked by ``services.schedules``, each problem under its field), the actions pause, resume and
run now, and each schedule's page: its next fires, a "Run now" button (after a confirmation)
and its latest fires with links to their runs.

Nothing here writes a row: adding, changing and deleting a schedule go through
``services.schedules`` like the actions, and each change is recorded as an admin ``LogEntry``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.forms.utils import ErrorList
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone as django_timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import registry, services
from ..display import short_json
from ..exceptions import InvalidSchedule, ReactorError
from ..models import Schedule, ScheduleFire
from ..services.cadence import check_zone, format_every
from ..states import FireOutcome
from .databases import DatabaseAdmin
from .display import APP, MomentsAdmin, execution_link, moment, short_reactor, status_badge
from .paging import KeysetAdmin

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec

#: Fires listed on a schedule's page (the fires list has them all).
RECENT_FIRES = 20
#: Fires to come listed on a schedule's page.
UPCOMING_FIRES = 10
#: How each outcome's badge is coloured (the execution statuses' colours).
OUTCOME_COLOURS: dict[str, str] = {
    FireOutcome.STARTED: "completed",
    FireOutcome.QUEUED: "paused",
    FireOutcome.SKIPPED: "halted",
    FireOutcome.REFUSED: "failed",
}
#: The form's fields, in the order ``services.schedules`` checks them.
FORM_FIELDS = (
    "name",
    "reactor",
    "inputs",
    "cron",
    "every",
    "timezone",
    "catch_up",
    "overlap",
    "enabled",
)


def in_zone(value: dt.datetime | None, zone: str) -> SafeString:
    """A fire time as the admin writes times (:func:`~.display.moment`), in the schedule's time
    zone and followed by its name: ``2025-05-02 02:30:00 CEST``; ``-`` for none."""
    try:
        tz: dt.tzinfo = check_zone(zone)
    except ValueError:
        tz = dt.UTC
    return moment(value, tz)


def fire_time(moment_at: dt.datetime, until: dt.datetime | None, zone: str) -> SafeString:
    """When a fire's tick was, and the last tick it stood for (a catch-up of several)."""
    if until is None:
        return in_zone(moment_at, zone)
    return format_html("{} .. {}", in_zone(moment_at, zone), in_zone(until, zone))


def outcome_badge(outcome: str) -> SafeString:
    return status_badge(OUTCOME_COLOURS.get(outcome, outcome), FireOutcome(outcome).label)


class ScheduleForm(forms.ModelForm):
    """A schedule's fields, checked by ``services.schedules.validate``: an unknown reactor, a
    cron expression that does not parse, an unknown time zone, neither or both of a cron
    expression and an interval, inputs the reactor's serializer refuses, a taken name."""

    reactor = forms.ChoiceField(
        label=_("Reactor"),
        help_text=_("The reactor each tick runs (the reactors this process knows)."),
        error_messages={
            "invalid_choice": _(
                "No reactor named %(value)s is known to this process; choose one of the list."
            )
        },
    )
    every = forms.CharField(
        label=_("Interval"),
        required=False,
        help_text=_(
            "Instead of a cron expression: 90s, 15m, 1h30m, 2d, 1w (or seconds). Ticks at the "
            "multiples of it since the epoch, in UTC."
        ),
    )
    inputs = forms.JSONField(
        label=_("Inputs"),
        required=False,
        initial=dict,
        help_text=_(
            "A JSON object, checked by the reactor's Inputs serializer. Secret fields show as "
            "[REDACTED]: leave them so to keep the stored value."
        ),
    )

    class Meta:
        model = Schedule
        fields = FORM_FIELDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = sorted(registry.all_reactors())
        current = self.instance.reactor if self.instance.pk else ""
        if current and current not in names:
            names.append(current)  # gone from the code: shown, refused on save
        reactor = self.fields["reactor"]
        assert isinstance(reactor, forms.ChoiceField)
        reactor.choices = [("", "---------")] + [
            (n, f"{n.rsplit('.', 1)[-1]} ({n})") for n in names
        ]
        if "timezone" in self.fields:  # not on the read-only page of a viewer
            self.fields["timezone"].initial = self.fields["timezone"].initial or "UTC"
        if self.instance.pk:
            row = services.schedules.get(self.instance.pk)
            self.initial["inputs"] = services.schedules.shown_inputs(row)
            if row.every is not None:
                self.initial["every"] = format_every(row.every)
        else:
            self.initial.setdefault("timezone", django_timezone.get_default_timezone_name())

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data  # a field refused its text (such as JSON that does not parse)
        inputs = data.get("inputs")
        current = services.schedules.get(self.instance.pk) if self.instance.pk else None
        if current is not None:
            inputs = services.schedules.keep_secrets(current, inputs)
        try:
            checked = services.schedules.validate(
                name=data.get("name"),
                reactor=data.get("reactor"),
                cron=data.get("cron"),
                every=data.get("every"),
                timezone=data.get("timezone"),
                inputs={} if inputs is None else inputs,
                catch_up=data.get("catch_up"),
                overlap=data.get("overlap"),
                enabled=data.get("enabled", True),
                current=current,
            )
        except InvalidSchedule as exc:
            for field, problems in exc.errors.items():
                self.add_error(field if field in self.fields else None, ErrorList(problems))
            return data
        data.update(checked)
        return data

    def _post_clean(self) -> None:
        # The services check everything the model would, and write the row themselves.
        pass


@admin.register(Schedule)
class ScheduleAdmin(MomentsAdmin, DatabaseAdmin):
    """Schedules: added, changed, paused, resumed, run and removed through
    ``services.schedules``."""

    form = ScheduleForm
    list_display = (
        "name",
        "reactor_name",
        "cadence",
        "enabled",
        "next_fire",
        "last_fire",
        "last_run",
        "policies",
    )
    # No filters: a project has tens of schedules, and the columns need the width.
    search_fields = ("name", "reactor")
    ordering = ("name",)
    actions = ("pause_selected", "resume_selected", "run_now_selected")
    readonly_fields = (
        "next_fire",
        "upcoming_fires",
        "last_fire",
        "last_run",
        "queued",
        "created_at",
        "updated_at",
        "recent_fires",
    )
    fieldsets = (
        (None, {"fields": ("name", "reactor", "inputs")}),
        (
            _("When"),
            {
                "fields": ("cron", "every", "timezone"),
                "description": _(
                    "A cron expression (minute hour day-of-month month day-of-week, such as "
                    "30 2 * * *, or @daily) read in the time zone, or an interval."
                ),
            },
        ),
        (_("Policies"), {"fields": ("catch_up", "overlap", "enabled")}),
        (
            _("Fires"),
            {
                "fields": (
                    "next_fire",
                    "upcoming_fires",
                    "last_fire",
                    "last_run",
                    "queued",
                    "recent_fires",
                    "created_at",
                    "updated_at",
                )
            },
        ),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> _FieldsetSpec:
        fieldsets = super().get_fieldsets(request, obj)
        return fieldsets if obj is not None else fieldsets[:-1]  # no fires before it exists

    # -- columns

    @admin.display(description=_("reactor"), ordering="reactor")
    def reactor_name(self, obj: Schedule) -> SafeString:
        return short_reactor(obj.reactor)

    @admin.display(description=_("when"))
    def cadence(self, obj: Schedule) -> str:
        if obj.every is not None:
            return f"every {format_every(obj.every)}"
        return f"{obj.cron} ({obj.timezone})"

    @admin.display(description=_("next fire"), ordering="next_fire_at")
    def next_fire(self, obj: Schedule) -> SafeString:
        if obj.pk and not obj.enabled:
            return format_html("{}", _("paused"))
        return in_zone(obj.next_fire_at, obj.timezone)

    @admin.display(description=_("last fire"), ordering="last_fire_at")
    def last_fire(self, obj: Schedule) -> SafeString:
        return in_zone(obj.last_fire_at, obj.timezone)

    @admin.display(description=_("policies"))
    def policies(self, obj: Schedule) -> SafeString:
        return format_html(
            '<span title="{}">{} / {}</span>',
            _("catch-up / overlap"),
            obj.catch_up,
            obj.overlap,
        )

    @admin.display(description=_("last run"))
    def last_run(self, obj: Schedule) -> SafeString | str:
        return execution_link(obj.last_execution_id) if obj.last_execution_id else "-"

    @admin.display(description=_("queued tick"))
    def queued(self, obj: Schedule) -> SafeString | str:
        if obj.queued_fire_id is None:
            return "-"
        fire = ScheduleFire.objects.filter(pk=obj.queued_fire_id).values("fire_at").first()
        return in_zone(fire["fire_at"] if fire else None, obj.timezone)

    @admin.display(description=_("fires to come"))
    def upcoming_fires(self, obj: Schedule) -> SafeString:
        if not obj.pk:
            return format_html("{}", "-")
        if not obj.enabled:
            return format_html(
                "{}",
                _("None while it is paused: resumed, it fires from the first tick after then."),
            )
        fires = services.schedules.upcoming(obj.pk, UPCOMING_FIRES)
        if not fires:
            return format_html("{}", _("None (its cadence gives no time a date can hold)."))
        return format_html(
            '<ol class="reactor-upcoming" id="reactor-upcoming">{}</ol>',
            format_html_join("", "<li>{}</li>", ((in_zone(f, obj.timezone),) for f in fires)),
        )

    @admin.display(description=_("latest fires"))
    def recent_fires(self, obj: Schedule) -> SafeString | str:
        if not obj.pk:
            return "-"
        fires = services.schedules.fires(obj.pk, limit=RECENT_FIRES)
        if not fires:
            return str(_("No fires yet."))
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    format_html(
                        "{}{}",
                        fire_time(f.fire_at, f.until, obj.timezone),
                        _(" (run now)") if f.manual else "",
                    ),
                    outcome_badge(f.outcome),
                    execution_link(f.execution_id) if f.execution_id else "-",
                    f.note,
                )
                for f in fires
            ),
        )
        every = reverse(f"admin:{APP}_schedulefire_changelist")
        return format_html(
            '<table class="reactor-fires"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
            "<th>{}</th></tr></thead><tbody>{}</tbody></table>"
            '<p><a href="{}?{}">{}</a></p>',
            _("fire time"),
            _("outcome"),
            _("run"),
            _("note"),
            rows,
            every,
            urlencode({"schedule__id__exact": obj.pk}),
            _("All fires of this schedule"),
        )

    # -- saving through the services

    def save_model(
        self, request: HttpRequest, obj: Schedule, form: ScheduleForm, change: bool
    ) -> None:
        fields = {f: form.cleaned_data[f] for f in FORM_FIELDS}
        if change:
            row = services.schedules.update(obj.pk, **fields)
        else:
            reactor = fields.pop("reactor")
            row = services.schedules.create(reactor, **fields)
        # The admin's messages and log entries describe ``obj``: make it the stored schedule.
        for field in (*FORM_FIELDS, "id", "next_fire_at", "last_fire_at"):
            setattr(obj, field, getattr(row, field))

    def save_related(
        self, request: HttpRequest, form: object, formsets: object, change: bool
    ) -> None:
        pass  # nothing related is edited here

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        services.schedules.remove(obj.pk)

    def get_deleted_objects(
        self, objs: Sequence[Schedule] | QuerySet[Schedule], request: HttpRequest
    ) -> Any:  # as Django's: its counts are keyed by the models' (lazy) plural names
        """What a delete removes: the schedules, and their fires counted (not listed one by
        one, nor asked a permission of their own: fires go with their schedule)."""
        schedules = list(objs)
        fires = ScheduleFire.objects.filter(schedule__in=schedules).count()
        listed: list[str] = [f"{Schedule._meta.verbose_name}: {s}" for s in schedules]
        if fires:
            listed.append(
                ngettext("%(n)d fire of theirs", "%(n)d fires of theirs", fires) % {"n": fires}
            )
        counts = {Schedule._meta.verbose_name_plural: len(schedules)}
        if fires:
            counts[ScheduleFire._meta.verbose_name_plural] = fires
        return listed, counts, set(), []

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for pk in queryset.values_list("pk", flat=True):
            services.schedules.remove(pk)

    # -- actions

    @admin.action(description=_("Pause the selected schedules"), permissions=["change"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        done = self._each(request, queryset, services.schedules.pause, "paused")
        self.message_user(
            request,
            ngettext("Paused %(n)d schedule.", "Paused %(n)d schedules.", done) % {"n": done},
        )

    @admin.action(description=_("Resume the selected schedules"), permissions=["change"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        done = self._each(request, queryset, services.schedules.resume, "resumed")
        self.message_user(
            request,
            ngettext("Resumed %(n)d schedule.", "Resumed %(n)d schedules.", done) % {"n": done},
        )

    @admin.action(description=_("Run the selected schedules now"), permissions=["change"])
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for obj in queryset.order_by("name"):
            self._run_now(request, obj)

    # -- the page's "Run now" button

    def get_urls(self) -> list[URLPattern]:
        run_now = self.admin_site.admin_view(self.run_now_view)
        name = f"{APP}_schedule_run_now"
        return [path("<path:object_id>/run-now/", run_now, name=name), *super().get_urls()]

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: what running the schedule now does, and a button; POST: run it
        (``services.schedules.run_now``), then back to its page with a link to the run."""
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(f"no schedule with the id {object_id!r}")
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        change_url = reverse(f"admin:{APP}_schedule_change", args=[obj.pk])
        if request.method == "POST" and request.POST.get("post") == "yes":
            self._run_now(request, obj)
            return redirect(change_url)
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        context = {
            **self.admin_site.each_context(request),
            "title": _("Run %(name)s now?") % {"name": obj.name},
            "opts": self.model._meta,
            "original": obj,
            "reactor": obj.reactor,
            "inputs": short_json(services.schedules.shown_inputs(services.schedules.get(obj.pk))),
            "next_fire": in_zone(obj.next_fire_at, obj.timezone) if obj.enabled else None,
            "change_url": change_url,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/django_reactor/schedule/run_now_confirmation.html", context
        )

    def _run_now(self, request: HttpRequest, obj: Schedule) -> bool:
        """Run one schedule now, log it and say what happened; whether a run started."""
        try:
            fire = services.schedules.run_now(obj.pk)
        except ReactorError as exc:
            self.message_user(request, f"{obj.name}: {exc}", messages.ERROR)
            return False
        if fire.execution_id is None:
            self.message_user(
                request,
                format_html("{}: {} ({})", obj.name, _("no run started"), fire.note),
                messages.ERROR,
            )
            return False
        self.log_change(request, obj, f"Ran now: execution {fire.execution_id}")
        self.message_user(
            request,
            format_html("{}: {} {}", obj.name, _("started run"), execution_link(fire.execution_id)),
        )
        return True

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[Schedule],
        operation: Callable[[int], object],
        verb: str,
    ) -> int:
        done = 0
        for obj in queryset.order_by("name"):
            try:
                operation(obj.pk)
            except ReactorError as exc:
                self.message_user(request, f"{obj.name}: {exc}", messages.ERROR)
                continue
            self.log_change(request, obj, f"{verb.capitalize()}.")
            done += 1
        return done


@admin.register(ScheduleFire)
class ScheduleFireAdmin(MomentsAdmin, KeysetAdmin):
    """What became of schedules' ticks, read-only, newest first."""

    list_display = ("fire_time", "schedule", "outcome_badge", "manual", "run", "note")
    list_filter = ("outcome", "manual", "schedule")
    ordering = ("-fire_at",)
    sortable_by = ("fire_at",)
    list_select_related = ("schedule",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ScheduleFire | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: ScheduleFire | None = None) -> bool:
        return False

    @admin.display(description=_("fire time"), ordering="fire_at")
    def fire_time(self, obj: ScheduleFire) -> SafeString:
        return fire_time(obj.fire_at, obj.until, obj.schedule.timezone)

    @admin.display(description=_("outcome"))
    def outcome_badge(self, obj: ScheduleFire) -> SafeString:
        return outcome_badge(obj.outcome)

    @admin.display(description=_("run"))
    def run(self, obj: ScheduleFire) -> SafeString | str:
        return execution_link(obj.execution_id) if obj.execution_id else "-"


__all__ = ["ScheduleAdmin", "ScheduleFireAdmin", "ScheduleForm"]
