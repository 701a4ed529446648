"""The database backend's rows: locks, semaphore holders, rate-limit logs, periods, ordered locks.

Only :mod:`django_reactor.coordination.backends.database` writes them. Every time in them comes
from the database server's clock. ``django_reactor.models`` re-exports these models so Django
finds them in the ``django_reactor`` app.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

__all__ = [
    "CoordinationKey",
    "CoordinationLock",
    "OrderedLockEntry",
    "OrderedLockState",
    "PeriodMarker",
    "RateLimitEvent",
    "SemaphoreHolder",
]

KEY_LENGTH = 255


class CoordinationLock(models.Model):
    """An exclusive lock and its fencing counter; the row outlives the lock so fences only grow."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(_("key"), max_length=KEY_LENGTH)
    owner = models.CharField(_("owner"), max_length=KEY_LENGTH, null=True, blank=True)
    fence = models.PositiveBigIntegerField(
        _("fence"), default=0, help_text=_("The fence of the latest grant; every grant raises it.")
    )
    acquired_at = models.DateTimeField(_("acquired at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)

    class Meta:
        verbose_name = _("coordination lock")
        verbose_name_plural = _("coordination locks")
        ordering = ["key"]
        constraints = [
            models.UniqueConstraint(fields=["key"], name="reactor_coord_lock_key_uniq"),
        ]
        indexes = [
            # The admin's coordination panel: the locks held now, by key, without reading the
            # row of every key ever locked (rows outlive their locks to keep the fences).
            models.Index(
                fields=["key"],
                name="reactor_coord_lock_held_idx",
                condition=Q(owner__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} (fence {self.fence}, {self.owner or 'free'})"


class CoordinationKey(models.Model):
    """One row per semaphore, rate-limit or event key, locked to serialise the operations on it."""

    class Kind(models.TextChoices):
        SEMAPHORE = "semaphore", _("Semaphore")
        RATE = "rate", _("Rate limit")
        #: An event key an emit and a wait take turns on (MariaDB and MySQL: ``store.dialects``).
        EVENT = "event", _("Event key")

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    key = models.CharField(_("key"), max_length=KEY_LENGTH)

    class Meta:
        verbose_name = _("coordination key")
        verbose_name_plural = _("coordination keys")
        ordering = ["kind", "key"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "key"], name="reactor_coord_key_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


class SemaphoreHolder(models.Model):
    """A live (or lapsed, until cleaned up) slot of a semaphore."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(_("key"), max_length=KEY_LENGTH)
    owner = models.CharField(_("owner"), max_length=KEY_LENGTH)
    acquired_at = models.DateTimeField(_("acquired at"))
    expires_at = models.DateTimeField(_("expires at"))

    class Meta:
        verbose_name = _("semaphore holder")
        verbose_name_plural = _("semaphore holders")
        ordering = ["key", "expires_at"]
        constraints = [
            models.UniqueConstraint(fields=["key", "owner"], name="reactor_sem_holder_uniq"),
        ]
        indexes = [
            models.Index(fields=["key", "expires_at"], name="reactor_sem_expiry_idx"),
            models.Index(fields=["expires_at"], name="reactor_sem_purge_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.key}: {self.owner}"


class RateLimitEvent(models.Model):
    """One allowed charge of a rate limit (the sliding-window log)."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(_("key"), max_length=KEY_LENGTH)
    at = models.DateTimeField(_("at"))
    cost = models.PositiveIntegerField(_("cost"), default=1)
    expires_at = models.DateTimeField(
        _("expires at"), help_text=_("When the charge leaves the longest window checked.")
    )

    class Meta:
        verbose_name = _("rate-limit event")
        verbose_name_plural = _("rate-limit events")
        ordering = ["key", "at"]
        indexes = [
            models.Index(fields=["key", "at"], name="reactor_rate_log_idx"),
            models.Index(fields=["expires_at"], name="reactor_rate_purge_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.key} x{self.cost} at {self.at:%Y-%m-%d %H:%M:%S.%f}"


class PeriodMarker(models.Model):
    """Who reserved or claimed one calendar bucket of a period key."""

    class State(models.TextChoices):
        RESERVED = "reserved", _("Reserved (a run is in flight)")
        CLAIMED = "claimed", _("Claimed (a run succeeded)")

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(_("key"), max_length=KEY_LENGTH)
    bucket = models.CharField(_("bucket"), max_length=64)
    owner = models.CharField(_("owner"), max_length=KEY_LENGTH)
    state = models.CharField(_("state"), max_length=16, choices=State.choices)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)

    class Meta:
        verbose_name = _("period marker")
        verbose_name_plural = _("period markers")
        ordering = ["key", "bucket"]
        constraints = [
            models.UniqueConstraint(fields=["key", "bucket"], name="reactor_period_uniq"),
        ]
        indexes = [models.Index(fields=["expires_at"], name="reactor_period_purge_idx")]

    def __str__(self) -> str:
        return f"{self.key} {self.bucket}: {self.owner} ({self.state})"


class OrderedLockState(models.Model):
    """An ordered lock's cursor: its sequence, its head and since when, its halt and skips."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(_("key"), max_length=KEY_LENGTH)
    next_seq = models.PositiveBigIntegerField(_("last sequence"), default=0)
    head = models.CharField(_("head"), max_length=KEY_LENGTH, null=True, blank=True)
    head_since = models.DateTimeField(_("head since"), null=True, blank=True)
    halted_after = models.CharField(
        _("halted after"),
        max_length=KEY_LENGTH,
        null=True,
        blank=True,
        help_text=_("Strict mode: the owner whose failure halted the chain."),
    )
    skipped = models.JSONField(_("skipped owners"), default=list, blank=True)

    class Meta:
        verbose_name = _("ordered lock")
        verbose_name_plural = _("ordered locks")
        ordering = ["key"]
        constraints = [
            models.UniqueConstraint(fields=["key"], name="reactor_ordered_key_uniq"),
        ]
        indexes = [
            # The admin's coordination panel: halted chains (a handful) among every key's row.
            models.Index(
                fields=["key"],
                name="reactor_ordered_halted_idx",
                condition=Q(halted_after__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        if self.halted_after:
            return f"{self.key} (halted after {self.halted_after} failed)"
        return f"{self.key} (head {self.head or 'none'})"


class OrderedLockEntry(models.Model):
    """An owner waiting in (or at the head of) an ordered lock's queue."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(_("key"), max_length=KEY_LENGTH)
    owner = models.CharField(_("owner"), max_length=KEY_LENGTH)
    seq = models.PositiveBigIntegerField(_("sequence"))
    enqueued_at = models.DateTimeField(_("enqueued at"))

    class Meta:
        verbose_name = _("ordered lock entry")
        verbose_name_plural = _("ordered lock entries")
        ordering = ["key", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["key", "owner"], name="reactor_ordered_owner_uniq"),
            models.UniqueConstraint(fields=["key", "seq"], name="reactor_ordered_seq_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.key} #{self.seq}: {self.owner}"
