"""The steering history: ``AuditEntry``, one row per steering action applied.

Written by :mod:`django_reactor.store.audit` only, in the transaction of the change it records
(or right after it, where the change is not the database's: an ordered lock on Redis), and
never changed after. Rows name their run by id, without a foreign key: the history outlives
the runs ``reactor_prune`` deletes, until ``REACTOR["AUDIT_RETENTION"]``.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..engine.actors import VIA


class AuditAction(models.TextChoices):
    """The steering actions the history records.

    Not the column's ``choices`` (a new action needs no migration): the admin's filter and
    ``services.audit.steering`` read them from here.
    """

    CANCEL = "cancel", _("Cancel")
    UNDO = "undo", _("Undo")
    RETRY = "retry", _("Retry")
    RESUME = "resume", _("Payload delivered")
    WAKE = "wake", _("Wake now")
    SCHEDULE_PAUSE = "schedule_pause", _("Schedule paused")
    SCHEDULE_RESUME = "schedule_resume", _("Schedule resumed")
    SCHEDULE_RUN_NOW = "schedule_run_now", _("Schedule run now")
    FORGET_SUBJECT = "forget_subject", _("Subject forgotten")
    LOCK_SKIP = "lock_skip", _("Ordered lock: run skipped")
    LOCK_RESET = "lock_reset", _("Ordered lock reset")
    PAUSE = "pause", _("Paused")
    UNPAUSE = "unpause", _("Unpaused")
    PAUSE_REACTOR = "pause_reactor", _("Reactor paused")
    UNPAUSE_REACTOR = "unpause_reactor", _("Reactor unpaused")
    FORK = "fork", _("Forked")
    BULK = "bulk", _("Bulk operation started")
    BULK_STOP = "bulk_stop", _("Bulk operation stopped")
    MIGRATE = "migrate", _("Moved onto the deployed definition")


class AuditEntry(models.Model):
    """One steering action that was applied: what, on which run (or schedule, subject, lock),
    by whom, from which face, why, when. Append-only."""

    id = models.BigAutoField(primary_key=True)
    action = models.CharField(_("action"), max_length=64)
    execution_id = models.UUIDField(
        _("execution id"),
        null=True,
        blank=True,
        help_text=_("The run steered; empty for an action on a schedule, a subject or a lock."),
    )
    reactor = models.CharField(_("reactor"), max_length=255, blank=True, default="")
    target = models.CharField(
        _("target"),
        max_length=255,
        blank=True,
        default="",
        help_text=_("What else was steered: a schedule, a subject, an ordered lock."),
    )
    who = models.CharField(_("who"), max_length=255)
    via = models.CharField(_("via"), max_length=16, choices=[(v, v) for v in VIA])
    reason = models.TextField(_("reason"), blank=True, default="")
    detail = models.JSONField(_("detail"), default=dict, blank=True)
    at = models.DateTimeField(_("at"))

    class Meta:
        verbose_name = _("steering action")
        verbose_name_plural = _("steering history")
        indexes = [
            # The admin's list, newest first, with its keyset pages; pruning by age.
            models.Index(fields=["at", "id"], name="reactor_audit_at_idx"),
            # A run's history (its page, its API detail).
            models.Index(fields=["execution_id", "at"], name="reactor_audit_execution_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.action} by {self.who} ({self.via})"
