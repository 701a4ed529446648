"""Bulk operations: ``BulkOperation``, one action applied to every run a filter matched, and
``BulkItem``, one row per run it takes care of.

The runs are chosen once, when the operation is created (its items), so the operation does
what its preview said however the runs change meanwhile. Items are worked through by a worker
(or the command that started it) under the operation's lease; each run's action is applied at
most once (the item is marked in the transaction after it, and every action is safe to apply
again after a crash: a retry or a fork refuses a second one, a payload carries an idempotency
key, cancel, undo, wake and pause do nothing twice). Only :mod:`django_reactor.store.bulk`
writes them.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .choices import max_length_of
from .routing import RoutedManager


class BulkStatus(models.TextChoices):
    """Where a bulk operation stands."""

    #: Created; a worker (or the command that made it) has not started it yet.
    PENDING = "pending", _("Pending")
    #: Its items are being worked through.
    RUNNING = "running", _("Running")
    #: Every item was taken care of (done, skipped or failed).
    DONE = "done", _("Done")
    #: An operator stopped it: items not started yet were left alone.
    STOPPED = "stopped", _("Stopped")


class ItemStatus(models.TextChoices):
    """What a bulk operation did to one run."""

    PENDING = "pending", _("Pending")
    #: The action was applied.
    DONE = "done", _("Done")
    #: The run was not in a state the action applies to (it moved since the preview).
    SKIPPED = "skipped", _("Skipped")
    #: Applying the action raised an unexpected error (see the note).
    FAILED = "failed", _("Failed")


class BulkOperation(models.Model):
    """One action applied to every run a filter matched when it was created."""

    id = models.UUIDField(_("id"), primary_key=True, default=uuid.uuid4, editable=False)
    action = models.CharField(_("action"), max_length=16)
    run_filter = models.JSONField(
        _("filter"), default=dict, help_text=_("The filter the runs were chosen by.")
    )
    parameters = models.JSONField(
        _("parameters"),
        default=dict,
        blank=True,
        help_text=_("What the action takes: a fork's step, a payload, a reason."),
    )
    status = models.CharField(
        _("status"),
        max_length=max_length_of(BulkStatus),
        choices=BulkStatus.choices,
        default=BulkStatus.PENDING,
    )
    reason = models.TextField(_("reason"), blank=True, default="")
    created_by = models.CharField(
        _("created by"), max_length=255, blank=True, default="", help_text=_("Who started it.")
    )
    created_via = models.CharField(
        _("from"),
        max_length=16,
        blank=True,
        default="",
        help_text=_(
            "The face it was started from (admin, api, command, python): each run's action is "
            "recorded as its starter's, from there."
        ),
    )
    total = models.PositiveIntegerField(_("runs"), default=0)
    done = models.PositiveIntegerField(_("done"), default=0)
    skipped = models.PositiveIntegerField(_("skipped"), default=0)
    failed = models.PositiveIntegerField(_("failed"), default=0)
    lease_owner = models.CharField(_("lease owner"), max_length=255, null=True, blank=True)
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("bulk operation")
        verbose_name_plural = _("bulk operations")
        ordering = ["-created_at"]
        indexes = [
            # The sweeper's operations to hand to a worker again (not finished).
            models.Index(
                fields=["status", "lease_expires_at"],
                name="reactor_bulk_open_idx",
                condition=Q(status__in=["pending", "running"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} of {self.total} run(s) ({self.status})"


class BulkItem(models.Model):
    """One run a bulk operation takes care of, and what it did."""

    id = models.BigAutoField(primary_key=True)
    operation = models.ForeignKey(
        BulkOperation,
        verbose_name=_("operation"),
        on_delete=models.CASCADE,
        related_name="items",
        db_index=False,  # the unique constraint and the pending index serve lookups
    )
    # Not a foreign key: a run may live in another database (runs routed by reactor), and
    # pruned runs leave their operations' history alone.
    execution_id = models.UUIDField(_("execution"))
    status = models.CharField(
        _("status"),
        max_length=max_length_of(ItemStatus),
        choices=ItemStatus.choices,
        default=ItemStatus.PENDING,
    )
    note = models.TextField(
        _("note"), blank=True, default="", help_text=_("What it did, or why it could not.")
    )
    updated_at = models.DateTimeField(_("updated at"), null=True, blank=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("bulk operation item")
        verbose_name_plural = _("bulk operation items")
        ordering = ["operation_id", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["operation", "execution_id"], name="reactor_bulk_item_uniq"
            ),
        ]
        indexes = [
            # The next items to take care of, in the order they were chosen.
            models.Index(
                fields=["operation", "id"],
                name="reactor_bulk_pending_idx",
                condition=Q(status="pending"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.execution_id} ({self.status})"
