"""The keys of subjects: each subject's data key, which seals its runs' secrets.

A run whose reactor declares ``Meta.subject`` seals its secrets with its subject's data key,
kept here encrypted with ``REACTOR["ENCRYPTION_KEYS"]`` (envelope encryption: rotating those
keys re-encrypts these rows, never the runs' secrets). Forgetting a subject overwrites its key
with nothing (crypto-shredding): the row stays as the record of when, the secrets sealed with it
can never be read again.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .routing import RoutedManager


class SubjectKey(models.Model):
    """One subject's data key: live (``key`` set), or forgotten (``erased_at`` set)."""

    id = models.UUIDField(_("id"), primary_key=True, default=uuid.uuid4, editable=False)
    subject = models.CharField(_("subject"), max_length=255)
    key = models.TextField(
        _("encrypted data key"),
        null=True,
        blank=True,
        editable=False,
        help_text=_("The Fernet key of the subject, encrypted with REACTOR['ENCRYPTION_KEYS']."),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    erased_at = models.DateTimeField(
        _("erased at"),
        null=True,
        blank=True,
        help_text=_("When the subject was forgotten: its key is gone, its secrets unreadable."),
    )

    objects = RoutedManager()

    class Meta:
        verbose_name = _("subject key")
        verbose_name_plural = _("subject keys")
        ordering = ["subject", "created_at"]
        constraints = [
            # One live key per subject; forgotten ones stay beside it.
            models.UniqueConstraint(
                fields=["subject"],
                condition=Q(erased_at__isnull=True),
                name="reactor_subjectkey_live_uniq",
            ),
            # A key is there until it is erased, and gone after.
            models.CheckConstraint(
                condition=Q(erased_at__isnull=True, key__isnull=False)
                | Q(erased_at__isnull=False, key__isnull=True),
                name="reactor_subjectkey_erased_no_key",
            ),
        ]
        indexes = [models.Index(fields=["subject"], name="reactor_subjectkey_subject_idx")]

    def __str__(self) -> str:
        state = "erased" if self.erased_at else "live"
        return f"key of {self.subject} ({state})"
