"""The schedules' tables: ``Schedule`` (a reactor to run on a cron expression or an interval)
and ``ScheduleFire`` (what became of each tick).

Only :mod:`django_reactor.store.schedules` writes them.

Exactly-once firing lives in the schema: ``ScheduleFire`` is unique on (schedule, fire time),
and a tick's fire row and the run it starts commit in one transaction, so however many sweepers
race for a tick, one row (and one run) wins.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..states import CatchUp, FireOutcome, Overlap
from .choices import max_length_of
from .routing import RoutedManager


class Schedule(models.Model):
    """A reactor run on a cron expression or an interval, in a time zone."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(_("name"), max_length=200, help_text=_("Unique; not a number."))
    reactor = models.CharField(
        _("reactor"), max_length=255, help_text=_("Registered name of the reactor class.")
    )
    inputs = models.JSONField(
        _("inputs"),
        default=dict,
        blank=True,
        help_text=_("Passed to every run, validated by the reactor's Inputs serializer."),
    )
    cron = models.CharField(
        _("cron expression"),
        max_length=255,
        blank=True,
        default="",
        help_text=_("Five fields (minute hour day month weekday) or @daily, @hourly, ..."),
    )
    every = models.DurationField(
        _("interval"),
        null=True,
        blank=True,
        help_text=_("Instead of a cron expression: ticks at multiples of it since the epoch."),
    )
    timezone = models.CharField(
        _("time zone"),
        max_length=64,
        default="UTC",
        help_text=_("IANA name (Europe/Berlin) in which the cron expression is read."),
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    catch_up = models.CharField(
        _("catch-up"),
        max_length=max_length_of(CatchUp),
        choices=CatchUp.choices,
        default=CatchUp.ONCE,
        help_text=_("What happens to ticks missed while nothing swept."),
    )
    overlap = models.CharField(
        _("overlap"),
        max_length=max_length_of(Overlap),
        choices=Overlap.choices,
        default=Overlap.SKIP,
        help_text=_("What a tick does while the previous run has not finished."),
    )
    next_fire_at = models.DateTimeField(
        _("next fire"), null=True, blank=True, help_text=_("The next tick; empty while paused.")
    )
    last_fire_at = models.DateTimeField(
        _("last fire"), null=True, blank=True, help_text=_("The latest tick handled.")
    )
    last_execution = models.ForeignKey(
        "django_reactor.Execution",
        verbose_name=_("last run"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text=_("The latest run the schedule started (the overlap policy looks at it)."),
    )
    queued_fire = models.ForeignKey(
        "django_reactor.ScheduleFire",
        verbose_name=_("queued fire"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,  # reactor_schedule_queued_idx, for queued fires only
        help_text=_("A tick waiting for the previous run to finish (overlap: queue)."),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["name"], name="reactor_schedule_name_uniq"),
            models.CheckConstraint(
                condition=(Q(cron="") & Q(every__isnull=False))
                | (~Q(cron="") & Q(every__isnull=True)),
                name="reactor_schedule_cron_xor_every",
            ),
        ]
        indexes = [
            # The sweeper's query: enabled schedules whose next tick has come, oldest first.
            models.Index(
                fields=["next_fire_at"], condition=Q(enabled=True), name="reactor_schedule_due_idx"
            ),
            models.Index(
                fields=["queued_fire"],
                condition=Q(queued_fire__isnull=False),
                name="reactor_schedule_queued_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ScheduleFire(models.Model):
    """One tick of a schedule (or a range of missed ticks recorded at once) and what became of
    it: the run it started, or why it started none."""

    id = models.BigAutoField(primary_key=True)
    schedule = models.ForeignKey(
        Schedule,
        verbose_name=_("schedule"),
        on_delete=models.CASCADE,
        related_name="fires",
        db_index=False,  # reactor_schedule_fire_uniq (schedule, fire_at) serves lookups
    )
    fire_at = models.DateTimeField(
        _("fire time"), help_text=_("The tick (the first one of a range of skipped ticks).")
    )
    until = models.DateTimeField(
        _("until"),
        null=True,
        blank=True,
        help_text=_("For a range of ticks skipped at once: the last one."),
    )
    outcome = models.CharField(
        _("outcome"), max_length=max_length_of(FireOutcome), choices=FireOutcome.choices
    )
    manual = models.BooleanField(
        _("manual"), default=False, help_text=_("Started by run now, not by a tick.")
    )
    execution = models.ForeignKey(
        "django_reactor.Execution",
        verbose_name=_("run"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="schedule_fires",
    )
    note = models.TextField(_("note"), blank=True, default="", help_text=_("Why, in words."))
    created_at = models.DateTimeField(_("recorded at"), auto_now_add=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("schedule fire")
        verbose_name_plural = _("schedule fires")
        ordering = ["schedule", "-fire_at"]
        constraints = [
            # Each tick fires once, however many sweepers race for it.
            models.UniqueConstraint(
                fields=["schedule", "fire_at"], name="reactor_schedule_fire_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} at {self.fire_at.isoformat()}: {self.outcome}"
