"""The sweeper's database work: find what crashes and lost messages left behind, queue it again."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from django.db import connections, transaction
from django.db.models import Exists, Model, OuterRef, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from ..models import Dispatch, Execution
from ..states import ExecutionStatus
from .claims import RESUMABLE
from .db import using
from .outbox import QueuedDispatch, mark_sent, publish, publish_on_commit
from .sleeps import end_due_sleeps

M = TypeVar("M", bound=Model)


@dataclass(slots=True)
class SweepReport:
    """What one sweep did."""

    republished: int = 0
    maps: int = 0
    deadlines: int = 0  # waiting runs past their deadline: woken, or stopped when paused
    recovered: int = 0
    woken: int = 0
    slept: int = 0  # sleeps over, ended by the sweep for the runs it woke
    redispatched: int = 0
    deleted: int = 0
    expired: int = 0  # interrupts whose timeout passed (applied by services.sweep)
    fired: int = 0  # runs started by schedules (services.schedules.fire_due)

    def add(self, other: SweepReport) -> None:
        """Count ``other``'s work in this report too (the sweeps of several databases)."""
        for name, value in other.as_dict().items():
            setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, int]:
        return {
            "republished": self.republished,
            "maps": self.maps,
            "deadlines": self.deadlines,
            "recovered": self.recovered,
            "woken": self.woken,
            "slept": self.slept,
            "redispatched": self.redispatched,
            "deleted": self.deleted,
            "expired": self.expired,
            "fired": self.fired,
        }


def sweep(*, limit: int, grace: float, redispatch_after: float, retention: float) -> SweepReport:
    """Find work a crash or a lost message left behind and queue it again.

    Safe on many hosts at once: rows are claimed with ``FOR UPDATE SKIP LOCKED``, and a run
    dispatched twice runs once (a worker must win its lease).
    """
    report = SweepReport()
    now = timezone.now()
    skip_locked = connections[using()].features.has_select_for_update_skip_locked

    def locked(qs: QuerySet[M]) -> QuerySet[M]:
        return qs.select_for_update(skip_locked=True) if skip_locked else qs

    # 1. Outbox rows no worker took within ``grace`` of their due time: the process that wrote
    #    them died before publishing, or the message was lost. Each is published again once.
    due_before = now - dt.timedelta(seconds=grace)
    with transaction.atomic(using=using()):
        stale = list(
            locked(
                Dispatch.objects.using(using())
                .filter(sent_at__isnull=True, created_at__lt=due_before)
                .filter(Q(not_before__isnull=True) | Q(not_before__lt=due_before))
            )
            .order_by("id")
            .values_list("id", "execution_id", "not_before", "reason", "map_run_id")[:limit]
        )
        if stale:
            republished = publish(
                [
                    QueuedDispatch(
                        d,
                        e,
                        max(0.0, (nb - now).total_seconds()) if nb else 0.0,
                        task=reason if map_id is not None else "resume",
                        map_id=map_id,
                    )
                    for d, e, nb, reason, map_id in stale
                ]
            )
            mark_sent(republished)
            report.republished = len(republished)

    # 2a. Runs that wait (parked, sleeping, scheduled) past their deadline are due now: the
    #     worker that resumes them stops them there. Their wake-up time is never later than
    #     the deadline when the run parks; this catches deadlines set or moved since.
    report.deadlines = (
        Execution.objects.using(using())
        .filter(
            deadline_at__lte=now,
            status__in=[ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED],
            wake_at__gt=now,
        )
        .update(wake_at=now)
    )

    # 2b. Wake-ups that came (sleeps, retries' backoffs past the countdown limit, scheduled
    #     starts): found through the wake-up index, their dispatches written in one statement.
    woken, report.slept = _wake_due(now, limit, redispatch_after, locked)
    report.woken += woken

    # 2. Runs nobody owns that should be moving: a dead worker's run (lease expired), a retry
    #    whose wake-up time came, a pending run whose task was lost.
    unsent = Dispatch.objects.using(using()).filter(
        execution_id=OuterRef("pk"), sent_at__isnull=True
    )
    with transaction.atomic(using=using()):
        candidates = list(
            locked(
                Execution.objects.using(using())
                .filter(status__in=RESUMABLE)
                .filter(Q(parent__isnull=True) | Q(detached=True))
                .filter(Q(lease_owner__isnull=True) | Q(lease_expires_at__lt=now))
                # Due wake-ups of runs nobody owns went in 2b.
                .filter(Q(wake_at__isnull=True) | Q(wake_at__lte=now, lease_owner__isnull=False))
                .exclude(Exists(unsent))
            )
            .order_by("updated_at")
            .values_list("id", "status", "lease_owner", "wake_at")[:limit]
        )
        queued = []
        recently = set(
            Dispatch.objects.using(using())
            .filter(
                execution_id__in=[c[0] for c in candidates],
                sent_at__gte=now - dt.timedelta(seconds=redispatch_after),
            )
            .values_list("execution_id", flat=True)
        )
        for execution_id, status, lease_owner, wake_at in candidates:
            if execution_id in recently:
                continue  # a task for it went out moments ago; give a worker time to take it
            if lease_owner is not None or (status != ExecutionStatus.PENDING and wake_at is None):
                reason = Dispatch.Reason.RECOVER
                report.recovered += 1
            elif wake_at is not None:
                reason = Dispatch.Reason.WAKE
                report.woken += 1
            else:
                reason = Dispatch.Reason.START
                report.redispatched += 1
            row = Dispatch.objects.using(using()).create(execution_id=execution_id, reason=reason)
            queued.append(QueuedDispatch(row.id, execution_id))
        publish_on_commit(queued)

    # 3. Forget dispatches that went out long ago (in batches: a sweep stays short).
    old = (
        Dispatch.objects.using(using())
        .filter(sent_at__lt=now - dt.timedelta(seconds=retention))
        .values_list("id", flat=True)[:limit]
    )
    report.deleted, _ = Dispatch.objects.using(using()).filter(id__in=list(old)).delete()
    return report


def paused_past_deadline(limit: int) -> list[Execution]:
    """Runs paused at an interrupt whose deadline passed (by the database's clock), oldest
    deadline first."""
    return list(
        Execution.objects.using(using())
        .filter(status=ExecutionStatus.PAUSED, deadline_at__lte=Now())
        .order_by("deadline_at")[:limit]
    )


def due_now(limit: int = 1000) -> list[uuid.UUID]:
    """Runs nobody owns that a worker would take now: waiting for a worker, or whose wake-up
    time has come (for tests that move time)."""
    return list(
        Execution.objects.using(using())
        .filter(
            status__in=[ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED],
            lease_owner__isnull=True,
        )
        .filter(Q(parent__isnull=True) | Q(detached=True))
        .filter(Q(wake_at__isnull=True) | Q(wake_at__lte=Now()))
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )


def _wake_due(
    now: dt.datetime,
    limit: int,
    redispatch_after: float,
    locked: Callable[[QuerySet[Execution]], QuerySet[Execution]],
) -> tuple[int, int]:
    """Queue a task for every run nobody owns whose wake-up time has come (at most ``limit``),
    unless one is queued already or went out within ``redispatch_after``, and end their sleeps
    that are over; how many runs, and how many sleeps."""
    unsent = Dispatch.objects.using(using()).filter(
        execution_id=OuterRef("pk"), sent_at__isnull=True
    )
    recent = Dispatch.objects.using(using()).filter(
        execution_id=OuterRef("pk"),
        sent_at__gte=now - dt.timedelta(seconds=redispatch_after),
    )
    with transaction.atomic(using=using()):
        due = list(
            locked(
                Execution.objects.using(using())
                .filter(
                    status__in=[ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED],
                    wake_at__isnull=False,
                    wake_at__lte=now,
                    lease_owner__isnull=True,
                )
                .filter(Q(parent__isnull=True) | Q(detached=True))
                .exclude(Exists(unsent))
                .exclude(Exists(recent))
            )
            .order_by("wake_at")
            .values_list("id", flat=True)[:limit]
        )
        if not due:
            return 0, 0
        # Their rows are locked and nobody owns them: ending the sleeps here, in one update,
        # spares each woken run a checkpoint of its own on the worker.
        slept = end_due_sleeps(due, now)
        rows = Dispatch.objects.using(using()).bulk_create(
            [Dispatch(execution_id=e, reason=Dispatch.Reason.WAKE) for e in due]
        )
        publish_on_commit([QueuedDispatch(row.id, row.execution_id) for row in rows], mark=True)
    return len(due), slept
