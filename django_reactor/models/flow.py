"""Flow control's rows: ``FlowKey``, one per reactor, kind and key in use; ``BatchItem``, one
per start with an idempotency key that joined a batch.

Deciding on a run of a key (``Meta.concurrency``: admitting it or queueing it) locks the key's
row, reads the runs of the key and decides, so two starts of one key never both take its last
slot. The runs themselves carry their key (``Execution.concurrency_key``); counts are read from
them, so nothing drifts when a process dies. Only :mod:`django_reactor.store.flow` writes them.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .routing import RoutedManager


class FlowKey(models.Model):
    """The lock that decisions on one reactor's key of one kind take, in turn."""

    class Kind(models.TextChoices):
        CONCURRENCY = "concurrency", _("Concurrency")
        THROTTLE = "throttle", _("Throttle")
        DEBOUNCE = "debounce", _("Debounce")
        BATCH = "batch", _("Batch")

    id = models.BigAutoField(primary_key=True)
    reactor = models.CharField(
        _("reactor"), max_length=255, help_text=_("Registered name of the reactor.")
    )
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    key = models.CharField(
        _("key"),
        max_length=255,
        blank=True,
        help_text=_("The runs' key (over their inputs); '*': one key for every run."),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    objects = RoutedManager()

    class Meta:
        app_label = "django_reactor"
        verbose_name = _("flow key")
        verbose_name_plural = _("flow keys")
        constraints = [
            models.UniqueConstraint(fields=["reactor", "kind", "key"], name="reactor_flow_key_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.reactor} {self.kind} [{self.key}]"


class BatchItem(models.Model):
    """A start with an idempotency key that joined a batch (``Meta.batch``): the same key again
    (a redelivered event, a retried request) is the same item of the same run, never a second
    one, whichever batch is open by then."""

    id = models.BigAutoField(primary_key=True)
    reactor = models.CharField(
        _("reactor"), max_length=255, help_text=_("Registered name of the reactor.")
    )
    idempotency_key = models.CharField(_("idempotency key"), max_length=255)
    inputs_digest = models.CharField(
        _("inputs digest"),
        max_length=64,
        help_text=_("Fingerprint of the item's inputs, to refuse the key for other inputs."),
    )
    execution = models.ForeignKey(
        "django_reactor.Execution",
        on_delete=models.CASCADE,
        related_name="batch_items",
        verbose_name=_("execution"),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    objects = RoutedManager()

    class Meta:
        app_label = "django_reactor"
        verbose_name = _("batch item")
        verbose_name_plural = _("batch items")
        constraints = [
            models.UniqueConstraint(
                fields=["reactor", "idempotency_key"], name="reactor_batch_item_key_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.reactor} [{self.idempotency_key}] in {self.execution_id}"
