"""The tables of maps: one row per map, per chunk of elements claimed together, and per
element (its slot)."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..states import (
    ElementStatus,
    MapStatus,
)
from .choices import max_length_of
from .routing import RoutedManager
from .runs import Execution


class MapRun(models.Model):
    """One ``map_over`` step of one execution: its size, policy and progress counters.

    A settle on PostgreSQL counts its chunk in the tally of its task (:class:`MapTally`), not
    here, so that tasks settling at once never wait for each other's commit on this row; the
    tallies are added to these counters (folded) under this row's lock about once a second
    per task, when the map stops and at the fan-in, so the counters lag a running map by
    about a second (``store.maps.summary`` adds the tallies). The run is resumed exactly
    once: by the fan-in that finds no chunk left unsettled and marks the map ``collected``.
    """

    id = models.UUIDField(_("id"), primary_key=True, default=uuid.uuid4, editable=False)
    execution = models.ForeignKey(
        Execution, verbose_name=_("execution"), on_delete=models.CASCADE, related_name="maps"
    )
    step = models.CharField(_("step"), max_length=255)
    status = models.CharField(
        _("status"),
        max_length=max_length_of(MapStatus),
        choices=MapStatus.choices,
        default=MapStatus.MATERIALISING,
    )
    fan_out = models.BooleanField(_("fan out"), default=False)
    size = models.PositiveIntegerField(_("size"), null=True, blank=True)
    batch_size = models.PositiveIntegerField(
        _("batch size"), help_text=_("Most elements in flight at once.")
    )
    chunk_size = models.PositiveIntegerField(
        _("chunk size"), help_text=_("Elements a task claims at a time.")
    )
    atomic = models.BooleanField(_("atomic"), default=True)
    max_failures = models.PositiveIntegerField(
        _("max failures"),
        null=True,
        blank=True,
        help_text=_("Failed elements tolerated before the map fails (non-atomic maps)."),
    )
    settled = models.PositiveIntegerField(_("settled"), default=0)
    succeeded = models.PositiveIntegerField(_("succeeded"), default=0)
    failed = models.PositiveIntegerField(_("failed"), default=0)
    halted = models.PositiveIntegerField(_("halted"), default=0)
    not_started = models.PositiveIntegerField(_("not started"), default=0)
    stop_reason = models.CharField(
        _("stop reason"),
        max_length=16,
        blank=True,
        default="",
        help_text=_("Why no new element starts: failed or halted."),
    )
    first_failure = models.PositiveIntegerField(
        _("first failure"),
        null=True,
        blank=True,
        help_text=_("Index of the first element that failed."),
    )
    shared = models.JSONField(
        _("shared arguments"),
        default=dict,
        blank=True,
        help_text=_("The map's arguments that are the same for every element."),
    )
    source_model = models.CharField(
        _("source model"),
        max_length=255,
        blank=True,
        default="",
        help_text=_(
            "app_label.Model when elements are rows of a QuerySet (stored as primary keys)."
        ),
    )
    collected = models.BooleanField(
        _("collected"), default=False, help_text=_("The run was woken for the settled elements.")
    )
    rollback_total = models.PositiveIntegerField(_("elements to undo"), default=0)
    rollback_settled = models.PositiveIntegerField(_("elements undone"), default=0)
    undone = models.PositiveIntegerField(
        _("undone"), default=0, help_text=_("Elements whose undo succeeded.")
    )
    undo_failed = models.PositiveIntegerField(
        _("undo failed"), default=0, help_text=_("Elements whose undo failed.")
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("map")
        verbose_name_plural = _("maps")
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["execution", "step"], name="reactor_map_step_uniq"),
        ]
        indexes = [
            models.Index(
                fields=["updated_at"],
                name="reactor_map_active_idx",
                condition=Q(status__in=["running", "rolling_back"]),
            ),
            # The admin's list of maps, newest first.
            models.Index(fields=["created_at", "id"], name="reactor_map_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.step} of {self.execution_id} ({self.status})"


class MapChunk(models.Model):
    """A run of consecutive elements of a map, claimed and settled as one (a chunk lease).

    Written once per chunk when the source is read (with its items), once when a task claims
    it and once when it settles: the element slots are not rewritten to be claimed. The task
    holding a chunk (``claimed_by``) keeps its lease alive from the process's heartbeat; a
    chunk whose lease lapsed (its worker died) is claimed again by another task.
    """

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        RUNNING = "running", _("Running")
        SETTLED = "settled", _("Settled")
        NOT_STARTED = "not_started", _("Not started")
        UNDOING = "undoing", _("Being undone")
        UNDONE = "undone", _("Undone")

    id = models.BigAutoField(primary_key=True)
    map_run = models.ForeignKey(
        MapRun,
        verbose_name=_("map"),
        on_delete=models.CASCADE,
        related_name="chunks",
        db_index=False,  # the (map, first) unique index serves it
    )
    first = models.PositiveIntegerField(_("first index"))
    size = models.PositiveIntegerField(_("size"))
    items = models.JSONField(_("items"), default=list, help_text=_("The chunk's source items."))
    status = models.CharField(
        _("status"), max_length=11, choices=Status.choices, default=Status.PENDING
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    claimed_by = models.CharField(
        _("claimed by"),
        max_length=64,
        blank=True,
        default="",
        help_text=_("The task holding the chunk (its claim token)."),
    )
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    succeeded = models.PositiveIntegerField(
        _("succeeded"), default=0, help_text=_("Elements of the chunk that succeeded.")
    )

    objects = RoutedManager()

    class Meta:
        verbose_name = _("map chunk")
        verbose_name_plural = _("map chunks")
        ordering = ["map_run_id", "first"]
        constraints = [
            models.UniqueConstraint(fields=["map_run", "first"], name="reactor_chunk_first_uniq"),
        ]
        indexes = [
            models.Index(fields=["map_run", "status", "first"], name="reactor_chunk_status_idx"),
        ]

    def __str__(self) -> str:
        return f"elements {self.first}+{self.size} of map {self.map_run_id} ({self.status})"


class MapResult(models.Model):
    """One element of a map: its source item, status, value or error, and what undoes it.

    Written once, when its chunk settles (an element in flight is an item of a chunk a task
    holds, and has no slot yet); an undo's settle updates it again, and no index covers
    ``status``, so that update is a HOT update (the table keeps free space in every page).
    """

    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique (map, index) constraint serves every lookup by map.
    map_run = models.ForeignKey(
        MapRun,
        verbose_name=_("map"),
        on_delete=models.CASCADE,
        related_name="results",
        db_index=False,
    )
    index = models.PositiveIntegerField(_("index"))
    status = models.CharField(
        _("status"),
        max_length=max_length_of(ElementStatus),
        choices=ElementStatus.choices,
        default=ElementStatus.PENDING,
    )
    item = models.JSONField(_("item"), null=True, blank=True)
    value = models.JSONField(_("value"), null=True, blank=True)
    error = models.JSONField(_("error"), null=True, blank=True)
    undo = models.JSONField(
        _("undo data"),
        null=True,
        blank=True,
        help_text=_("The element's completed steps and their results, newest last."),
    )
    rollback_error = models.JSONField(_("rollback error"), null=True, blank=True)
    attempts = models.PositiveIntegerField(
        _("attempts"),
        default=0,
        help_text=_(
            "How many times its chunk was claimed: more than one means a process died "
            "while running it."
        ),
    )
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("map element")
        verbose_name_plural = _("map elements")
        ordering = ["map_run_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["map_run", "index"], name="reactor_map_index_uniq"),
        ]
        indexes = [
            # The failure sample and the halted element: only slots with an error.
            models.Index(
                fields=["map_run", "index"],
                name="reactor_map_error_idx",
                condition=Q(error__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"element {self.index} of map {self.map_run_id} ({self.status})"


class MapTally(models.Model):
    """What one element task settled of a map since its counts were last added to the map's
    counters (see :class:`MapRun`): updated by each settle of the task, in the settle's
    statement (a row no other task writes), and deleted when it is folded."""

    id = models.BigAutoField(primary_key=True)
    map_run = models.ForeignKey(
        MapRun,
        verbose_name=_("map"),
        on_delete=models.CASCADE,
        related_name="tallies",
        db_index=False,  # the (map, task) unique index serves it
    )
    token = models.CharField(_("task"), max_length=64, help_text=_("The task's claim token."))
    settled = models.PositiveIntegerField(_("settled"), default=0)
    succeeded = models.PositiveIntegerField(_("succeeded"), default=0)
    failed = models.PositiveIntegerField(_("failed"), default=0)
    halted = models.PositiveIntegerField(_("halted"), default=0)
    not_started = models.PositiveIntegerField(_("not started"), default=0)
    first_failure = models.PositiveIntegerField(_("first failure"), null=True, blank=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("map tally")
        verbose_name_plural = _("map tallies")
        constraints = [
            models.UniqueConstraint(fields=["map_run", "token"], name="reactor_tally_task_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.settled} settled by {self.token} of map {self.map_run_id}"
