"""The database's own identity: ``DatabaseIdentity``, one row.

Task messages carry the identity of the database their run was written to, so that a worker
configured with another database refuses them instead of ignoring them as unknown
(:mod:`django_reactor.store.identity`). The row is written once, by the migration that creates
the table; only that migration and :mod:`django_reactor.store.identity` touch it.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .routing import RoutedManager


class DatabaseIdentity(models.Model):
    """Which database this is: a random id, drawn when django_reactor's tables were created.

    Unmanaged: its migration creates (and drops) the table, and ``manage.py flush`` and the
    tests that flush tables leave the row alone, so the id stays the database's for good. A
    copy of the database (a restored dump) keeps the id of its original.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    identity = models.UUIDField(_("identity"), unique=True, default=uuid.uuid4, editable=False)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)

    objects = RoutedManager()

    class Meta:
        managed = False
        db_table = "django_reactor_database"
        verbose_name = _("database identity")
        verbose_name_plural = _("database identity")
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="reactor_database_one_row"),
        ]

    def __str__(self) -> str:
        return str(self.identity)
