"""A run's business attributes: the keys runs are found by (a customer, an order, a tenant).

One row per run and key, its value as canonical text (``engine.attributes``), written with the
run (``Meta.attributes``) or with the checkpoint of the step that set it
(``context.set_attribute``), and deleted with the run.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .routing import RoutedManager
from .runs import Execution

#: The unique constraint of a run's attributes, one row per key (the upserts name it).
ATTRIBUTE_UNIQUE = "reactor_attribute_uniq"


class ExecutionAttribute(models.Model):
    """One business attribute of one run."""

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey(
        Execution,
        verbose_name=_("execution"),
        on_delete=models.CASCADE,
        related_name="attributes",
        db_index=False,  # the unique constraint on (execution, key) serves lookups
    )
    key = models.CharField(_("key"), max_length=64)
    value = models.CharField(
        _("value"),
        max_length=255,
        help_text=_(
            "As text: a whole number in decimal, a boolean as true or false, a UUID in lower case."
        ),
    )
    run_created_at = models.DateTimeField(
        _("run created at"),
        help_text=_(
            "The run's creation time, copied: the runs with a key's value are listed newest "
            "first straight from the index, without reading the runs left out."
        ),
    )

    objects = RoutedManager()

    class Meta:
        verbose_name = _("execution attribute")
        verbose_name_plural = _("execution attributes")
        constraints = [
            models.UniqueConstraint(fields=["execution", "key"], name=ATTRIBUTE_UNIQUE),
        ]
        indexes = [
            # "The runs whose customer_id is 42, newest first": one range of this index, read
            # backwards, a page at a time (a keyset on (run_created_at, execution)), however
            # many runs have the value.
            models.Index(
                fields=["key", "value", "run_created_at", "execution"],
                name="reactor_attribute_find_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key}={self.value}"
