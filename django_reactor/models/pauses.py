"""Operators' pauses: ``Pause``, one row per paused reactor or paused run.

A run whose reactor or which itself has a row stops at its next step boundary (its checkpoint
and a worker's claim read the rows) and waits, ``suspended``, holding no worker, until the row
is gone and it is released. Only :mod:`django_reactor.store.pauses` writes them.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .routing import RoutedManager


class Pause(models.Model):
    """A pause of a whole reactor (``execution`` empty) or of one run of it."""

    id = models.BigAutoField(primary_key=True)
    reactor = models.CharField(
        _("reactor"), max_length=255, help_text=_("Registered name of the reactor.")
    )
    execution = models.ForeignKey(
        "django_reactor.Execution",
        verbose_name=_("execution"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="pauses",
        db_index=False,  # reactor_pause_run_uniq serves lookups
        help_text=_("The paused run; empty: every run of the reactor is paused."),
    )
    waits_for = models.ForeignKey(
        "django_reactor.Execution",
        verbose_name=_("waits for"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text=_(
            "For a fork: the run it re-runs, whose abandoned branch is being undone; the fork "
            "is released when that run has ended its undo."
        ),
    )
    reason = models.TextField(_("reason"), blank=True, default="")
    paused_by = models.CharField(
        _("paused by"),
        max_length=255,
        blank=True,
        default="",
        help_text=_("Who paused it, and from where (the admin, the API, a command)."),
    )
    created_at = models.DateTimeField(_("paused at"), auto_now_add=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("pause")
        verbose_name_plural = _("pauses")
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["reactor"],
                condition=Q(execution__isnull=True),
                name="reactor_pause_reactor_uniq",
            ),
            models.UniqueConstraint(
                fields=["execution"],
                condition=Q(execution__isnull=False),
                name="reactor_pause_run_uniq",
            ),
        ]
        indexes = [
            # A checkpoint and a claim ask whether a run's reactor or the run is paused.
            models.Index(fields=["reactor", "execution"], name="reactor_pause_lookup_idx"),
            # The sweeper's forks waiting for their original's undo.
            models.Index(
                fields=["waits_for"],
                name="reactor_pause_waits_idx",
                condition=Q(waits_for__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        what = f"run {self.execution_id}" if self.execution_id else "every run"
        return f"{self.reactor.rsplit('.', 1)[-1]}: {what} paused"
