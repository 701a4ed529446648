"""Patch decisions: which branch of a patched step body each run takes.

A step that asks ``self.context.patched(name)`` makes the run's decision for that name the
first time, recorded here before the call returns; every later call for the run reads it
back (``django_reactor.engine.patches``). Rows go with their run.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .routing import RoutedManager
from .runs import Execution

#: The unique constraint the first decision's insert relies on (one decision per run and name).
PATCH_DECISION_UNIQUE = "reactor_patch_decision_uniq"


class PatchDecision(models.Model):
    """A run's decision for one patch: the new branch (``taken``) or the old one."""

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey(
        Execution,
        verbose_name=_("execution"),
        on_delete=models.CASCADE,
        related_name="patch_decisions",
        db_index=False,  # the unique (execution, name) index serves lookups
    )
    name = models.CharField(_("patch"), max_length=100)
    taken = models.BooleanField(
        _("new branch"), help_text=_("True: the run takes the patch's new branch.")
    )
    step = models.CharField(
        _("decided in step"), max_length=255, help_text=_("The step whose call decided it.")
    )
    decided_at = models.DateTimeField(_("decided at"), auto_now_add=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("patch decision")
        verbose_name_plural = _("patch decisions")
        ordering = ["execution_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["execution", "name"], name=PATCH_DECISION_UNIQUE),
        ]
        indexes = [
            # The admin's patches page: the runs on each branch of a patch.
            models.Index(fields=["name", "taken"], name="reactor_patch_branch_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name}: {'new' if self.taken else 'old'} branch"
