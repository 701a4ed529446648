"""The sweeper's database work: find what crashes and lost messages left behind, queue it again."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from django.db import connections, transaction
from django.db.models import Exists, Model, OuterRef, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from ..engine.routing import Route
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
    events: int = 0  # events an emitter left unhandled, runs an event cancelled rolled back
    # A phase's last batch came back full when the sweep's time ran out: sweep again at once.
    cut_short: bool = False
    # The earliest wake-up (or schedule tick) after this sweep's time: sweep again then, if
    # that comes before the interval is over. None: nothing waits for a time.
    next_due_at: dt.datetime | None = None

    def add(self, other: SweepReport) -> None:
        """Count ``other``'s work in this report too (the sweeps of several databases)."""
        for name, value in other.as_dict().items():
            setattr(self, name, getattr(self, name) + value)
        self.cut_short = self.cut_short or other.cut_short
        if other.next_due_at is not None and (
            self.next_due_at is None or other.next_due_at < self.next_due_at
        ):
            self.next_due_at = other.next_due_at

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
            "events": self.events,
        }


class Rounds:
    """A sweep's time: each phase goes again at once while its batch comes back full, until
    ``budget`` seconds from the start of the sweep have passed. Every phase has its first
    batch whatever the time, so that no phase waits behind another."""

    def __init__(self, budget: float) -> None:
        self.deadline = time.monotonic() + budget
        self.cut_short = False

    def run(self, limit: int, batch: Callable[[], int]) -> int:
        """Call ``batch`` (which handles at most ``limit`` rows, committed before it returns)
        until one comes back short or the time is up; the rows handled in all."""
        total = 0
        while True:
            handled = batch()
            total += handled
            if handled < limit:
                return total
            if time.monotonic() >= self.deadline:
                self.cut_short = True
                return total


def sweep(
    *, limit: int, grace: float, redispatch_after: float, retention: float, rounds: Rounds
) -> SweepReport:
    """Find work a crash or a lost message left behind and queue it again.

    Each batch of at most ``limit`` rows is its own short transaction, published once it has
    committed (workers start on it while the sweep goes on); a phase whose batch comes back
    full goes again at once, within the time of ``rounds``. Safe on many hosts at once: rows
    are claimed with ``FOR UPDATE SKIP LOCKED``, and a run dispatched twice runs once (a
    worker must win its lease).
    """
    report = SweepReport()
    now = timezone.now()
    skip_locked = connections[using()].features.has_select_for_update_skip_locked

    def locked(qs: QuerySet[M]) -> QuerySet[M]:
        return qs.select_for_update(skip_locked=True) if skip_locked else qs

    # 1. Outbox rows no worker took within ``grace`` of their due time: the process that wrote
    #    them died before publishing, or the message was lost. Each is published again once.
    due_before = now - dt.timedelta(seconds=grace)
    after_id = [0]

    def republish() -> int:
        with transaction.atomic(using=using()):
            stale = list(
                locked(
                    Dispatch.objects.using(using())
                    .filter(sent_at__isnull=True, created_at__lt=due_before, id__gt=after_id[0])
                    .filter(Q(not_before__isnull=True) | Q(not_before__lt=due_before))
                )
                .order_by("id")
                .values_list("id", "execution_id", "not_before", "reason", "map_run_id")[:limit]
            )
            if not stale:
                return 0
            after_id[0] = stale[-1][0]  # rows the broker refused wait for the next sweep
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
            report.republished += len(republished)
        # Nothing went out (the broker is down): the next batch would fare no better.
        return len(stale) if republished else 0

    rounds.run(limit, republish)

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
    #     starts): found through the wake-up index, the most overdue first, their dispatches
    #     written in one statement per batch.
    rounds.run(limit, _WakeUps(now, limit, redispatch_after, locked, report).batch)

    # 2. Runs nobody owns that should be moving: a dead worker's run (lease expired), a retry
    #    whose wake-up time came, a pending run whose task was lost. Read in (updated_at, id)
    #    order from where the previous batch stopped, so that runs left alone (dispatched a
    #    moment ago) are not read again by the next batch.
    after: list[tuple[dt.datetime, uuid.UUID] | None] = [None]

    def recover() -> int:
        candidates, after[0] = _recover(now, limit, redispatch_after, locked, after[0], report)
        return candidates

    rounds.run(limit, recover)

    # 3. Forget dispatches that went out long ago (in batches: each transaction stays short).
    def forget() -> int:
        old = (
            Dispatch.objects.using(using())
            .filter(sent_at__lt=now - dt.timedelta(seconds=retention))
            .values_list("id", flat=True)[:limit]
        )
        deleted, _ = Dispatch.objects.using(using()).filter(id__in=list(old)).delete()
        report.deleted += deleted
        return deleted

    rounds.run(limit, forget)
    report.next_due_at = next_wake_up(now)
    return report


def next_wake_up(after: dt.datetime) -> dt.datetime | None:
    """The earliest wake-up time later than ``after`` of a run nobody owns (the wake-up
    index, read in order: one entry)."""
    return (
        _waiting().filter(wake_at__gt=after).order_by("wake_at").values_list("wake_at", flat=True)
    ).first()


def _waiting() -> QuerySet[Execution]:
    """Runs nobody owns that wait for their wake-up time (the sweeper's to dispatch: composed
    children are their parent's)."""
    return (
        Execution.objects.using(using())
        .filter(
            status__in=[ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED],
            wake_at__isnull=False,
            lease_owner__isnull=True,
        )
        .filter(Q(parent__isnull=True) | Q(detached=True))
    )


def _recover(
    now: dt.datetime,
    limit: int,
    redispatch_after: float,
    locked: Callable[[QuerySet[Execution]], QuerySet[Execution]],
    after: tuple[dt.datetime, uuid.UUID] | None,
    report: SweepReport,
) -> tuple[int, tuple[dt.datetime, uuid.UUID] | None]:
    """One batch of the runs to recover (or wake, or start again) read after ``after``; how
    many runs were read, and where the batch stopped."""
    unsent = Dispatch.objects.using(using()).filter(
        execution_id=OuterRef("pk"), sent_at__isnull=True
    )
    runs = (
        Execution.objects.using(using())
        .filter(status__in=RESUMABLE)
        .filter(Q(parent__isnull=True) | Q(detached=True))
        .filter(Q(lease_owner__isnull=True) | Q(lease_expires_at__lt=now))
        # Due wake-ups of runs nobody owns went in 2b.
        .filter(Q(wake_at__isnull=True) | Q(wake_at__lte=now, lease_owner__isnull=False))
        .exclude(Exists(unsent))
    )
    if after is not None:
        runs = runs.filter(Q(updated_at__gt=after[0]) | Q(updated_at=after[0], id__gt=after[1]))
    with transaction.atomic(using=using()):
        candidates = list(
            locked(runs)
            .order_by("updated_at", "id")
            .values_list("id", "status", "lease_owner", "wake_at", "updated_at")[:limit]
        )
        if not candidates:
            return 0, after
        queued = []
        recently = set(
            Dispatch.objects.using(using())
            .filter(
                execution_id__in=[c[0] for c in candidates],
                sent_at__gte=now - dt.timedelta(seconds=redispatch_after),
            )
            .values_list("execution_id", flat=True)
        )
        for execution_id, status, lease_owner, wake_at, _ in candidates:
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
    last = candidates[-1]
    return len(candidates), (last[4], last[0])


def paused_past_deadline(limit: int) -> list[Execution]:
    """Runs paused at an interrupt, or suspended by a pause, whose deadline passed (by the
    database's clock), oldest deadline first."""
    return list(
        Execution.objects.using(using())
        .filter(
            status__in=[ExecutionStatus.PAUSED, ExecutionStatus.SUSPENDED],
            deadline_at__lte=Now(),
        )
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


def _due(
    now: dt.datetime,
    redispatch_after: float,
    locked: Callable[[QuerySet[Execution]], QuerySet[Execution]],
) -> QuerySet[Execution]:
    """Runs nobody owns whose wake-up time has come, unless a task for them is queued already
    or went out within ``redispatch_after``."""
    unsent = Dispatch.objects.using(using()).filter(
        execution_id=OuterRef("pk"), sent_at__isnull=True
    )
    recent = Dispatch.objects.using(using()).filter(
        execution_id=OuterRef("pk"),
        sent_at__gte=now - dt.timedelta(seconds=redispatch_after),
    )
    return locked(
        _waiting().filter(wake_at__lte=now).exclude(Exists(unsent)).exclude(Exists(recent))
    )


class _WakeUps:
    """The sweep's wake-ups, a batch at a time (its ``batch``).

    The due runs are read ahead, ``READ_AHEAD`` batches at a time and without locks, then
    taken a batch at a time by id: each batch's statement finds its rows by primary key
    instead of scanning the wake-up index past the runs the sweep woke already (they stay due
    until a worker takes them), which made a sweep of 10,000 runs due together quadratic in
    them. Each batch checks again, under its row locks, what the read saw. Within a read
    window the runs of higher priority go first (``Execution.priority``), then by wake-up time.
    """

    READ_AHEAD = 20

    def __init__(
        self,
        now: dt.datetime,
        limit: int,
        redispatch_after: float,
        locked: Callable[[QuerySet[Execution]], QuerySet[Execution]],
        report: SweepReport,
    ) -> None:
        self.now, self.limit, self.redispatch_after = now, limit, redispatch_after
        self.locked, self.report = locked, report
        self.ahead: list[uuid.UUID] = []
        self.routes: dict[uuid.UUID, Route] = {}
        self.read_all = False

    def batch(self) -> int:
        """Wake the next batch of due runs (at most ``limit``) and end their sleeps that are
        over; how many runs were read for it (woken, or taken by another sweeper meanwhile)."""
        if not self.ahead and not self.read_all:
            wanted = self.limit * self.READ_AHEAD
            due = _due(self.now, self.redispatch_after, lambda qs: qs).order_by("wake_at")
            read = list(due.values_list("id", "queue", "priority")[:wanted])
            self.read_all = len(read) < wanted
            read.sort(key=lambda row: -row[2])  # stable: by wake-up time within a priority
            self.ahead = [run for run, _, _ in read]
            self.routes = {run: Route(queue, priority) for run, queue, priority in read}
        chunk, self.ahead = self.ahead[: self.limit], self.ahead[self.limit :]
        if not chunk:
            return 0
        with transaction.atomic(using=using()):
            # By primary key, in no order: ordered by wake-up time, the statement would scan the
            # wake-up index past every run still due (100,000 runs due together: seconds a
            # batch). The batch keeps the order of the read.
            due = _due(self.now, self.redispatch_after, self.locked)
            taken = set(due.filter(pk__in=chunk).values_list("id", flat=True))
            if taken:
                # Locked now. A sweeper that woke one of them committed before the lock was
                # granted; this statement's snapshot (one a statement) sees its dispatch, which
                # the locking statement's older one did not: woken once, not twice.
                again = _due(self.now, self.redispatch_after, lambda qs: qs).filter(pk__in=taken)
                taken = set(again.values_list("id", flat=True))
            ids = [run for run in chunk if run in taken]
            if ids:
                # Their rows are locked and nobody owns them: ending the sleeps here, in one
                # update, spares each woken run a checkpoint of its own on the worker.
                self.report.slept += end_due_sleeps(ids, self.now)
                rows = Dispatch.objects.using(using()).bulk_create(
                    [Dispatch(execution_id=e, reason=Dispatch.Reason.WAKE) for e in ids]
                )
                queued = [
                    QueuedDispatch(
                        row.id, row.execution_id, route=self.routes.get(row.execution_id)
                    )
                    for row in rows
                ]
                publish_on_commit(queued, mark=True)
                self.report.woken += len(ids)
        return len(chunk)
