"""Flow control's rows: ``ConcurrencyKey``, one per reactor and concurrency key in use.

Admitting a run of a key (``Meta.concurrency``) locks the key's row, counts the runs of the key
in flight and decides, so two starts of one key never both take its last slot. The runs
themselves carry their key (``Execution.concurrency_key``); the count is read from them, so
nothing drifts when a process dies. Only :mod:`django_reactor.store.flow` writes them.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .routing import RoutedManager


class ConcurrencyKey(models.Model):
    """The lock that admissions of one reactor's concurrency key take, in turn."""

    id = models.BigAutoField(primary_key=True)
    reactor = models.CharField(
        _("reactor"), max_length=255, help_text=_("Registered name of the reactor.")
    )
    key = models.CharField(
        _("key"),
        max_length=255,
        blank=True,
        help_text=_("The run's key (Meta.concurrency's key over its inputs); empty: one key."),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    objects = RoutedManager()

    class Meta:
        app_label = "django_reactor"
        verbose_name = _("concurrency key")
        verbose_name_plural = _("concurrency keys")
        constraints = [
            models.UniqueConstraint(fields=["reactor", "key"], name="reactor_concurrency_key_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.reactor} [{self.key}]"
