"""What the admin's overview reads: runs in flight and ended, by status; stuck runs; the
oldest waiting interrupts; the runs needing attention; the outbox's depth.

Every query reads one index range and stops at a cap, so the overview costs the same at a
thousand runs or a million:

- counts by status: ``(status, created_at, id)``, counted up to ``cap`` rows;
- runs that ended in a window: ``(finished_at, status)`` of ended runs (migration 0016), at
  most ``cap`` of them, newest first (a busier window is counted back from now as far as the
  cap reaches, and says so);
- runs whose lease expired: the partial index of running and rolling-back runs' leases;
- waiting interrupts: ``(status, created_at, id)`` of interrupts;
- the outbox: the partial index of dispatches not yet taken.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Q, QuerySet
from django.db.models.functions import TruncMinute

from ..models import Dispatch, Execution, Interrupt
from ..states import ExecutionStatus, InterruptStatus
from .db import USING

#: Rows a count reads at most (beyond, it says "more than").
COUNT_CAP = 10_000
#: Ended runs a window's figures are read from at most, newest first.
ENDED_CAP = 50_000
#: Recently completed runs whose durations say how long a reactor's runs usually take.
USUAL_SAMPLE = 1_000
#: Unsent dispatches, oldest first, examined to split them into due and scheduled ones.
OUTBOX_EXAMINED = 10_000

#: The columns of a run the overview's lists show (never the large JSON columns but failure).
RUN_COLUMNS = (
    "id",
    "reactor",
    "status",
    "current_step",
    "created_at",
    "started_at",
    "updated_at",
    "lease_owner",
    "lease_expires_at",
    "recovery_attempts",
)


@dataclass(frozen=True)
class Capped:
    """A count that stopped at its cap: ``value`` is exact when ``exact``, else the cap."""

    value: int
    exact: bool


def capped_count(queryset: QuerySet[Any], cap: int) -> Capped:
    """``queryset``'s rows, counted up to ``cap`` (a ``LIMIT`` subquery)."""
    counted = queryset[: cap + 1].count()
    return Capped(counted, True) if counted <= cap else Capped(cap, False)


def _runs() -> QuerySet[Execution]:
    return Execution.objects.using(USING)


# ---------------------------------------------------------------------------- counts


def count_by_status(statuses: Iterable[str], cap: int | None = None) -> dict[str, Capped]:
    """How many runs are in each of ``statuses`` now (one capped index range each)."""
    cap = cap or COUNT_CAP
    return {status: capped_count(_runs().filter(status=status), cap) for status in statuses}


@dataclass(frozen=True)
class Ended:
    """Runs that ended (``finished_at``) in a window, by minute and by their status now.

    ``counted_from`` is the window's start, or later when more than the cap ended in it
    (``complete`` is then false: the minutes before it were not counted).
    """

    since: dt.datetime
    until: dt.datetime
    counted_from: dt.datetime
    complete: bool
    by_minute: dict[dt.datetime, dict[str, int]] = field(default_factory=dict)

    def total(self, since: dt.datetime | None = None) -> dict[str, int]:
        """Runs that ended by status, in the whole window or since ``since``."""
        totals: dict[str, int] = defaultdict(int)
        for minute, counts in self.by_minute.items():
            if since is None or minute >= _minute(since):
                for status, count in counts.items():
                    totals[status] += count
        return dict(totals)


def _minute(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(second=0, microsecond=0)


def ended(since: dt.datetime, until: dt.datetime, cap: int | None = None) -> Ended:
    """Runs that ended from ``since`` to ``until``, per minute (UTC) and status; at most
    ``cap`` (``ENDED_CAP``) of them, the newest."""
    cap = cap or ENDED_CAP
    window = _runs().filter(finished_at__gte=since, finished_at__lte=until)
    boundary = (
        window.order_by("-finished_at").values_list("finished_at", flat=True)[cap : cap + 1].first()
    )
    counted = window if boundary is None else window.filter(finished_at__gt=boundary)
    rows = (
        counted.annotate(minute=TruncMinute("finished_at", tzinfo=dt.UTC))
        .values("minute", "status")
        .annotate(count=Count("pk"))
        .order_by()
    )
    by_minute: dict[dt.datetime, dict[str, int]] = defaultdict(dict)
    for row in rows:
        by_minute[_minute(row["minute"])][row["status"]] = row["count"]
    return Ended(
        since=since,
        until=until,
        counted_from=since if boundary is None else boundary,
        complete=boundary is None,
        by_minute=dict(by_minute),
    )


def usual_durations(since: dt.datetime, sample: int | None = None) -> dict[str, float]:
    """How long each reactor's runs usually take, in seconds: the 95th percentile of the
    durations of the latest ``sample`` runs that completed since ``since`` (reactors with
    fewer than three of them are left out: too few to say what is usual)."""
    durations: dict[str, list[float]] = defaultdict(list)
    sample = sample or USUAL_SAMPLE
    rows = (
        _runs()
        .filter(finished_at__gte=since, status=ExecutionStatus.COMPLETED)
        .order_by("-finished_at")
        .values_list("reactor", "started_at", "finished_at")[:sample]
    )
    for reactor, started_at, finished_at in rows:
        if started_at is not None and finished_at is not None:
            durations[reactor].append(max((finished_at - started_at).total_seconds(), 0.0))
    usual = {}
    for reactor, values in durations.items():
        if len(values) >= 3:
            values.sort()
            usual[reactor] = values[max(math.ceil(0.95 * len(values)) - 1, 0)]
    return usual


# ---------------------------------------------------------------------------- lists


def lease_expired(
    now: dt.datetime, limit: int, cap: int | None = None
) -> tuple[list[Execution], Capped]:
    """Running and rolling-back runs whose lease expired before ``now`` (their process is
    gone; the sweeper hands them to a worker), longest expired first, and how many."""
    runs = _runs().filter(
        status__in=[ExecutionStatus.RUNNING, ExecutionStatus.ROLLING_BACK],
        lease_expires_at__lt=now,
    )
    rows = list(runs.order_by("lease_expires_at").only(*RUN_COLUMNS)[:limit])
    return rows, capped_count(runs, cap or COUNT_CAP)


def oldest_running(limit: int) -> list[Execution]:
    """The running runs created first (candidates for running longer than usual)."""
    runs = _runs().filter(status=ExecutionStatus.RUNNING).order_by("created_at", "id")
    return list(runs.only(*RUN_COLUMNS)[:limit])


def needing_attention(limit: int, cap: int | None = None) -> tuple[list[Execution], Capped]:
    """Runs needing attention, newest first (with their failure), and how many."""
    runs = _runs().filter(status=ExecutionStatus.NEEDS_ATTENTION)
    rows = list(runs.order_by("-created_at", "-id").only(*RUN_COLUMNS, "failure")[:limit])
    return rows, capped_count(runs, cap or COUNT_CAP)


def waiting_interrupts(limit: int, cap: int | None = None) -> tuple[list[Interrupt], Capped]:
    """Interrupts waiting for a payload, longest waiting first, and how many."""
    waiting = Interrupt.objects.using(USING).filter(status=InterruptStatus.WAITING)
    rows = list(
        waiting.order_by("created_at", "id").only(
            "id",
            "execution_id",
            "reactor",
            "step",
            "correlation_id",
            "expires_at",
            "invalid_attempts",
            "max_attempts",
            "created_at",
        )[:limit]
    )
    return rows, capped_count(waiting, cap or COUNT_CAP)


@dataclass(frozen=True)
class OutboxDepth:
    """Dispatches no worker has taken yet.

    ``count``: how many (capped); of the ``examined`` oldest, ``due`` could be taken now and
    ``scheduled`` wait for their ``not_before`` (a retry's backoff); ``oldest``: the first
    ``limit`` of them.
    """

    count: Capped
    due: int
    scheduled: int
    examined: int
    oldest: list[Dispatch]


def outbox_depth(
    now: dt.datetime, limit: int, cap: int | None = None, examined: int | None = None
) -> OutboxDepth:
    """The outbox's depth (see :class:`OutboxDepth`), through its index of unsent rows."""
    cap, examined = cap or COUNT_CAP, examined or OUTBOX_EXAMINED
    unsent = Dispatch.objects.using(USING).filter(sent_at__isnull=True)
    head = unsent.order_by("created_at").values("pk")[:examined]
    split = unsent.filter(pk__in=head).aggregate(
        due=Count("pk", filter=Q(not_before__isnull=True) | Q(not_before__lte=now)),
        scheduled=Count("pk", filter=Q(not_before__gt=now)),
    )
    oldest = list(
        unsent.order_by("created_at").only(
            "id", "execution_id", "reason", "not_before", "created_at"
        )[:limit]
    )
    due, scheduled = int(split["due"] or 0), int(split["scheduled"] or 0)
    return OutboxDepth(
        count=capped_count(unsent, cap),
        due=due,
        scheduled=scheduled,
        examined=due + scheduled,
        oldest=oldest,
    )
