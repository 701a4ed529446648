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

from django.db import connections
from django.db.models import Count, Max, QuerySet
from django.db.models.functions import TruncHour, TruncMinute

from ..models import Dispatch, Execution, ExecutionEvent, Interrupt, StepRecord
from ..states import ExecutionStatus, InterruptStatus
from .db import using

#: Rows a count reads at most (beyond, it says "more than"), as the admin's lists count.
COUNT_CAP = 1_000
#: Ended runs a window's figures are read from at most, newest first.
ENDED_CAP = 25_000
#: Recently completed runs whose durations say how long a reactor's runs usually take.
USUAL_SAMPLE = 200
#: Unsent dispatches, oldest first, examined to split them into due and scheduled ones.
OUTBOX_EXAMINED = 1_000

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


def _runs() -> QuerySet[Execution]:
    return Execution.objects.using(using())


def _waiting() -> QuerySet[Interrupt]:
    return Interrupt.objects.using(using()).filter(status=InterruptStatus.WAITING)


def _unsent() -> QuerySet[Dispatch]:
    return Dispatch.objects.using(using()).filter(sent_at__isnull=True)


def _lease_expired(now: dt.datetime) -> QuerySet[Execution]:
    return _runs().filter(
        status__in=[ExecutionStatus.RUNNING, ExecutionStatus.ROLLING_BACK],
        lease_expires_at__lt=now,
    )


# ---------------------------------------------------------------------------- counts


def counts(now: dt.datetime, statuses: Iterable[str], cap: int | None = None) -> dict[str, Capped]:
    """The overview's counts, each stopped at ``cap`` (``COUNT_CAP``), in one statement: runs
    in each of ``statuses`` (keyed by the status), runs whose lease expired before ``now``
    (``"lease_expired"``), interrupts waiting for a payload (``"waiting"``) and dispatches no
    worker has taken (``"unsent"``).

    Each is a ``LIMIT`` subquery that reads one column of the index serving its filter,
    without ordering (a model's default ordering would sort every matching row first): an
    index-only scan that stops at the cap.
    """
    cap = cap or COUNT_CAP
    parts: dict[str, tuple[QuerySet[Any], str]] = {
        status: (_runs().filter(status=status), "status") for status in statuses
    }
    parts["lease_expired"] = (_lease_expired(now), "lease_expires_at")
    parts["waiting"] = (_waiting(), "status")
    parts["unsent"] = (_unsent(), "created_at")
    connection = connections[using()]
    selects, params = [], []
    for index, (queryset, column) in enumerate(parts.values()):
        query = queryset.order_by().values(column)[: cap + 1].query
        sql, values = query.get_compiler(using=using()).as_sql()
        selects.append(f"(SELECT COUNT(*) FROM ({sql}) {connection.ops.quote_name(f'c{index}')})")
        params.extend(values)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(selects), params)
        row = cursor.fetchone()
    return {
        name: Capped(int(n), True) if int(n) <= cap else Capped(cap, False)
        for name, n in zip(parts, row, strict=True)
    }


@dataclass(frozen=True)
class Ended:
    """Runs that ended (``finished_at``) in a window, by minute or hour (``unit``, UTC) and by
    the status they have now.

    ``counted_from`` is the window's start, or later when more than the cap ended in it
    (``complete`` is then false: the time before it was not counted).
    """

    since: dt.datetime
    until: dt.datetime
    unit: str
    counted_from: dt.datetime
    complete: bool
    buckets: dict[dt.datetime, dict[str, int]] = field(default_factory=dict)

    def total(self, since: dt.datetime | None = None) -> dict[str, int]:
        """Runs that ended by status, in the whole window or since ``since`` (from the start
        of its minute or hour)."""
        totals: dict[str, int] = defaultdict(int)
        first = None if since is None else _truncate(since, self.unit)
        for bucket, by_status in self.buckets.items():
            if first is None or bucket >= first:
                for status, count in by_status.items():
                    totals[status] += count
        return dict(totals)


TRUNCATE = {"minute": TruncMinute, "hour": TruncHour}


def _truncate(moment: dt.datetime, unit: str) -> dt.datetime:
    if moment.tzinfo is not dt.UTC:
        moment = moment.astimezone(dt.UTC)
    moment = moment.replace(second=0, microsecond=0)
    return moment.replace(minute=0) if unit == "hour" else moment


def ended(
    since: dt.datetime, until: dt.datetime, unit: str = "minute", cap: int | None = None
) -> Ended:
    """Runs that ended from ``since`` to ``until``, per ``unit`` (``"minute"`` or ``"hour"``,
    UTC) and status; at most ``cap`` (``ENDED_CAP``) of them, the newest."""
    cap = cap or ENDED_CAP
    window = _runs().filter(finished_at__gte=since, finished_at__lte=until)
    boundary = (
        window.order_by("-finished_at").values_list("finished_at", flat=True)[cap : cap + 1].first()
    )
    counted = window if boundary is None else window.filter(finished_at__gt=boundary)
    rows = (
        counted.annotate(bucket=TRUNCATE[unit]("finished_at", tzinfo=dt.UTC))
        .values_list("bucket", "status")
        # COUNT(*), not of a column: the index of ended runs holds all the query reads.
        .annotate(count=Count("*"))
        .order_by()
    )
    buckets: dict[dt.datetime, dict[str, int]] = defaultdict(dict)
    for bucket, status, count in rows:
        buckets[_truncate(bucket, unit)][status] = count
    return Ended(
        since=since,
        until=until,
        unit=unit,
        counted_from=since if boundary is None else boundary,
        complete=boundary is None,
        buckets=dict(buckets),
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


def lease_expired(now: dt.datetime, limit: int) -> list[Execution]:
    """Running and rolling-back runs whose lease expired before ``now`` (their process is
    gone; the sweeper hands them to a worker), longest expired first."""
    return list(_lease_expired(now).order_by("lease_expires_at").only(*RUN_COLUMNS)[:limit])


def oldest_running(limit: int) -> list[Execution]:
    """The running runs created first (candidates for running longer than usual)."""
    runs = _runs().filter(status=ExecutionStatus.RUNNING).order_by("created_at", "id")
    return list(
        runs.only(
            "id",
            "reactor",
            "current_step",
            "created_at",
            "started_at",
            "lease_owner",
            "lease_expires_at",
        )[:limit]
    )


def needing_attention(limit: int) -> list[Execution]:
    """Runs needing attention, newest first (with their failure)."""
    runs = _runs().filter(status=ExecutionStatus.NEEDS_ATTENTION)
    return list(runs.order_by("-created_at", "-id").only(*RUN_COLUMNS, "failure")[:limit])


def waiting_interrupts(limit: int) -> list[Interrupt]:
    """Interrupts waiting for a payload, longest waiting first."""
    return list(
        _waiting()
        .order_by("created_at", "id")
        .only(
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


@dataclass(frozen=True)
class OutboxDepth:
    """Dispatches no worker has taken yet (``counts`` says how many).

    Of the ``examined`` oldest, ``due`` could be taken now and ``scheduled`` wait for their
    ``not_before`` (a retry's backoff); ``oldest``: the first ``limit`` of them.
    """

    due: int
    scheduled: int
    examined: int
    oldest: list[Dispatch]


def outbox_depth(now: dt.datetime, limit: int, examined: int | None = None) -> OutboxDepth:
    """The outbox's head (see :class:`OutboxDepth`), through its index of unsent rows."""
    examined = examined or OUTBOX_EXAMINED
    unsent = _unsent()
    head = list(unsent.order_by("created_at").values_list("not_before", flat=True)[:examined])
    scheduled = sum(1 for not_before in head if not_before is not None and not_before > now)
    oldest = list(
        unsent.order_by("created_at").only(
            "id", "execution_id", "reason", "not_before", "created_at"
        )[:limit]
    )
    return OutboxDepth(
        due=len(head) - scheduled,
        scheduled=scheduled,
        examined=len(head),
        oldest=oldest,
    )


def in_flight_since(execution_ids: Iterable[Any]) -> dict[Any, dt.datetime]:
    """For each run, when its last checkpoint committed (its last trace entry, or the step
    record that stands for one): the step it runs now has been in flight since then."""
    ids = list(execution_ids)
    if not ids:
        return {}
    since: dict[Any, dt.datetime] = {}
    for execution_id, at in (
        ExecutionEvent.objects.using(using())
        .filter(execution_id__in=ids)
        .values("execution_id")
        .annotate(at=Max("at"))
        .values_list("execution_id", "at")
    ):
        since[execution_id] = at
    for execution_id, at in (
        StepRecord.objects.using(using())
        .filter(execution_id__in=ids, traced=True)
        .values("execution_id")
        .annotate(at=Max("finished_at"))
        .values_list("execution_id", "at")
    ):
        if at is not None and (execution_id not in since or at > since[execution_id]):
            since[execution_id] = at
    return since
