"""The mailbox of runs: messages sent to a run, kept until a step takes them.

A message sent with ``django_reactor.send()`` waits here, unread, until a ``receive(topic)``
step of its run takes it (in send order per topic, exactly once); a payload delivered to an
interrupt the run had not reached yet waits here too (``kind="delivery"``, its topic the
interrupt's path), until the run reaches it. Rows go with their run (``reactor_prune``).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..states import MessageKind, MessageStatus
from .choices import max_length_of
from .routing import RoutedManager
from .runs import Execution

#: The longest topic a message may be sent to (also the longest interrupt path it names).
TOPIC_MAX_LENGTH = 255


class Message(models.Model):
    """One message of a run's mailbox: unread until a step consumes it, exactly once.

    The id gives the send order: sends to one run take the run's row lock, so ids are given in
    the order sends commit.
    """

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey(
        Execution,
        verbose_name=_("execution"),
        on_delete=models.CASCADE,
        related_name="messages",
        db_index=False,  # the index on (execution, topic, id) serves lookups
    )
    kind = models.CharField(
        _("kind"),
        max_length=max_length_of(MessageKind),
        choices=MessageKind.choices,
        default=MessageKind.MESSAGE,
    )
    topic = models.CharField(
        _("topic"),
        max_length=TOPIC_MAX_LENGTH,
        help_text=_("The topic a receive() step takes; for an early delivery, the interrupt."),
    )
    payload = models.JSONField(_("payload"), null=True, blank=True)
    idempotency_key = models.CharField(_("idempotency key"), max_length=255, null=True, blank=True)
    status = models.CharField(
        _("status"),
        max_length=max_length_of(MessageStatus),
        choices=MessageStatus.choices,
        default=MessageStatus.UNREAD,
    )
    errors = models.JSONField(
        _("errors"),
        null=True,
        blank=True,
        help_text=_("Why the step that took it refused it (field errors), when invalid."),
    )
    consumed_by_step = models.CharField(_("consumed by step"), max_length=255, blank=True)
    created_at = models.DateTimeField(_("sent at"), auto_now_add=True)
    consumed_at = models.DateTimeField(_("consumed at"), null=True, blank=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("message")
        verbose_name_plural = _("messages")
        ordering = ["execution_id", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["execution", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="reactor_message_key_uniq",
            ),
            # One early delivery per interrupt: the first one wins.
            models.UniqueConstraint(
                fields=["execution", "topic"],
                condition=Q(kind="delivery"),
                name="reactor_message_delivery_uniq",
            ),
        ]
        indexes = [
            models.Index(fields=["execution", "topic", "id"], name="reactor_message_topic_idx"),
            # The sweeper's look for unread messages of runs that stopped without taking them.
            models.Index(
                fields=["execution"],
                condition=Q(status="unread"),
                name="reactor_message_unread_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.topic} #{self.pk} ({self.status})"
