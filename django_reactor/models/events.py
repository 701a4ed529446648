"""Events: facts emitted with ``django_reactor.emit()``, matched across runs.

An event is kept once per ``(name, event_id)``; it wakes the runs waiting for it with
``wait_for_event`` (the interrupt rows with its name and key), starts the runs whose reactors
declare ``Meta.triggers`` for it, and cancels the runs in flight that ``Meta.cancel_on``
subscribed to it (:class:`CancelSubscription`). ``handled_at`` is set when all of that was
done; the sweeper finishes what a process that stopped left undone.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .routing import RoutedManager
from .runs import Execution

#: The longest event name, key and event id.
EVENT_NAME_MAX_LENGTH = 255


class Event(models.Model):
    """One event, kept once per ``(name, event_id)``: the id makes emitting idempotent."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(_("name"), max_length=EVENT_NAME_MAX_LENGTH)
    key = models.CharField(
        _("key"),
        max_length=EVENT_NAME_MAX_LENGTH,
        null=True,
        blank=True,
        help_text=_("What a wait_for_event(match=...) or a cancel_on rule compares."),
    )
    event_id = models.CharField(_("event id"), max_length=EVENT_NAME_MAX_LENGTH)
    payload = models.JSONField(_("payload"), null=True, blank=True)
    source = models.CharField(_("source"), max_length=32, blank=True)
    created_at = models.DateTimeField(_("emitted at"), auto_now_add=True)
    handled_at = models.DateTimeField(
        _("handled at"),
        null=True,
        blank=True,
        help_text=_("When its waiting runs, triggers and cancellations were all seen to."),
    )
    errors = models.JSONField(
        _("errors"),
        null=True,
        blank=True,
        help_text=_("What could not be done for it, such as a trigger's refused inputs."),
    )

    objects = RoutedManager()

    class Meta:
        verbose_name = _("event")
        verbose_name_plural = _("events")
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["name", "event_id"], name="reactor_event_id_uniq"),
        ]
        indexes = [
            # A wait's look back over the events emitted before it began.
            models.Index(fields=["name", "key", "id"], name="reactor_event_key_idx"),
            # The sweeper's look for events a stopped process left unhandled.
            models.Index(
                fields=["id"], name="reactor_event_unhandled_idx", condition=Q(handled_at=None)
            ),
            # The admin's list and pruning, oldest first.
            models.Index(fields=["created_at", "id"], name="reactor_event_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.event_id}"


class CancelSubscription(models.Model):
    """A run in flight that an event cancels: its reactor's ``Meta.cancel_on`` rule, with the
    key resolved from the run's inputs when it started. Goes with its run."""

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey(
        Execution,
        verbose_name=_("execution"),
        on_delete=models.CASCADE,
        related_name="cancel_subscriptions",
        db_index=False,  # the unique constraint on (execution, ...) serves lookups
    )
    name = models.CharField(_("event"), max_length=EVENT_NAME_MAX_LENGTH)
    key = models.CharField(_("key"), max_length=EVENT_NAME_MAX_LENGTH)
    fired_at = models.DateTimeField(
        _("fired at"),
        null=True,
        blank=True,
        help_text=_(
            "An event asked the run, busy in a step then, to stop: it is rolled back once it has."
        ),
    )

    objects = RoutedManager()

    class Meta:
        verbose_name = _("cancel subscription")
        verbose_name_plural = _("cancel subscriptions")
        constraints = [
            models.UniqueConstraint(
                fields=["execution", "name", "key"], name="reactor_cancel_sub_uniq"
            ),
        ]
        indexes = [
            models.Index(fields=["name", "key"], name="reactor_cancel_sub_key_idx"),
            # The sweeper's look for runs that stopped and still have to be rolled back.
            models.Index(
                fields=["execution"],
                name="reactor_cancel_sub_fired_idx",
                condition=Q(fired_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.key} cancels {self.execution_id}"
