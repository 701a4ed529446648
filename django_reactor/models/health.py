"""The fleet's heartbeats: ``ProcessHeartbeat``, one row per worker or sweeper process.

Only :mod:`django_reactor.store.health` writes them: a worker every ``HEARTBEAT_INTERVAL``
seconds (from a thread of its main process, never per task), a sweeper after each sweep. The
admin's health strip and ``reactor_health`` read them to say whether workers and a sweeper are
alive. Rows of processes unseen for a day are pruned by the sweeper.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class ProcessRole(models.TextChoices):
    """What a process reporting heartbeats does."""

    WORKER = "worker", _("worker")
    SWEEPER = "sweeper", _("sweeper")


class ProcessHeartbeat(models.Model):
    """The latest heartbeat of one worker or sweeper process (unique on role, host and pid)."""

    id = models.BigAutoField(primary_key=True)
    role = models.CharField(_("role"), max_length=16, choices=ProcessRole.choices)
    host = models.CharField(_("host"), max_length=255)
    pid = models.IntegerField(_("pid"))
    name = models.CharField(
        _("name"), max_length=255, blank=True, default="", help_text=_("A Celery node name.")
    )
    queues = models.JSONField(_("queues"), default=list, blank=True)
    concurrency = models.IntegerField(_("concurrency"), null=True, blank=True)
    interval = models.FloatField(
        _("interval"),
        help_text=_("Seconds between the process's heartbeats (or sweeps) it promised."),
    )
    started_at = models.DateTimeField(_("started"))
    last_seen_at = models.DateTimeField(_("last seen"))
    tasks_done = models.BigIntegerField(
        _("tasks done"), default=0, help_text=_("Tasks a worker took since it started.")
    )
    code = models.JSONField(
        _("code"),
        default=dict,
        db_default={},
        blank=True,
        help_text=_(
            "The reactors a worker's code has, by name: their declared versions and "
            "fingerprints (a run of a version no live worker has is not handed back)."
        ),
    )
    last_sweep_at = models.DateTimeField(_("last sweep"), null=True, blank=True)
    last_sweep_seconds = models.FloatField(_("last sweep's duration"), null=True, blank=True)
    last_sweep = models.JSONField(
        _("last sweep's work"),
        default=dict,
        blank=True,
        help_text=_("What the last sweep did (its report: republished, woken, fired, ...)."),
    )

    class Meta:
        verbose_name = _("process heartbeat")
        verbose_name_plural = _("process heartbeats")
        constraints = [
            models.UniqueConstraint(
                fields=["role", "host", "pid"], name="reactor_heartbeat_process_uniq"
            ),
        ]
        indexes = [
            # The health strip's latest rows, and the sweeper's pruning of old ones.
            models.Index(fields=["last_seen_at"], name="reactor_heartbeat_seen_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.host}:{self.pid}"
