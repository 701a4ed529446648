"""The fleet's health, read and written: processes' heartbeats, overdue wake-ups, dispatches
no worker took, and each reactor's figures for a recent window.

Heartbeats live in the default database (``REACTOR["DATABASE"]``'s default alias), one row
per process, written with one upsert. The other reads follow ``store.overview``: each reads
one index range and stops at a cap, so they cost the same at a thousand runs or a million:

- overdue wake-ups: the wake-up index (``reactor_exec_wake_idx``), read up to its cap;
- dispatches not taken: the partial index of unsent dispatches;
- runs started in the window: ``(created_at, id)``, the newest ``cap``;
- runs that ended in the window: ``(finished_at, status)``, the newest ``cap``;
- runs in flight: ``(status, created_at, id)``, up to ``IN_FLIGHT_CAP`` per status.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from ..models import Dispatch, Execution, ProcessHeartbeat
from ..states import IN_FLIGHT_STATUSES, ExecutionStatus
from .db import conflict_target, default_alias, using
from .overview import COUNT_CAP, Capped

#: Heartbeat rows read at most (the newest first): a fleet larger than this shows its newest.
PROCESSES_READ = 500
#: Runs the window's started, and its ended, figures read at most, newest first (each row's
#: reactor is read from the table: the page refreshes every few seconds).
WINDOW_CAP = 10_000
#: Runs in flight read at most per status.
IN_FLIGHT_CAP = COUNT_CAP
#: Completed runs, newest first, whose durations give each reactor's percentiles.
DURATION_SAMPLE = 2_000

UPDATED = (
    "name",
    "code",
    "queues",
    "concurrency",
    "interval",
    "last_seen_at",
    "tasks_done",
    "last_sweep_at",
    "last_sweep_seconds",
    "last_sweep",
)


def _heartbeats() -> QuerySet[ProcessHeartbeat]:
    return ProcessHeartbeat.objects.using(default_alias())


# ---------------------------------------------------------------------------- heartbeats


def beat(
    *,
    role: str,
    host: str,
    pid: int,
    interval: float,
    started_at: dt.datetime,
    now: dt.datetime,
    name: str = "",
    queues: Sequence[str] = (),
    concurrency: int | None = None,
    tasks_done: int = 0,
    sweep_seconds: float | None = None,
    sweep: Mapping[str, int] | None = None,
    code: Mapping[str, Any] | None = None,
) -> None:
    """Record that a process is alive at ``now``: one statement, inserting its row or updating
    it (``started_at`` is kept from its first heartbeat). A sweeper passes its last sweep's
    duration and report (the sweep ended at ``now``); a worker the code it has
    (``registry.inventory()``)."""
    row = ProcessHeartbeat(
        role=role,
        host=host[:255],
        pid=pid,
        name=name[:255],
        queues=list(queues),
        concurrency=concurrency,
        interval=interval,
        started_at=started_at,
        last_seen_at=now,
        tasks_done=tasks_done,
        last_sweep_at=now if sweep is not None else None,
        last_sweep_seconds=sweep_seconds,
        last_sweep=dict(sweep or {}),
        code=dict(code or {}),
    )
    fields = [f for f in UPDATED if sweep is not None or not f.startswith("last_sweep")]
    # Its own transaction (a savepoint inside a caller's): a refused heartbeat leaves the
    # caller's transaction usable.
    with transaction.atomic(using=default_alias()):
        _heartbeats().bulk_create(
            [row],
            update_conflicts=True,
            unique_fields=conflict_target(["role", "host", "pid"], default_alias()),
            update_fields=fields,
        )


def forget(*, role: str, host: str, pid: int) -> None:
    """Remove a process's row (it stopped cleanly: it is gone, not late)."""
    _heartbeats().filter(role=role, host=host, pid=pid).delete()


def prune(before: dt.datetime) -> int:
    """Delete the rows of processes last seen before ``before``; how many."""
    deleted, _ = _heartbeats().filter(last_seen_at__lt=before).delete()
    return deleted


def processes(since: dt.datetime, limit: int | None = None) -> list[ProcessHeartbeat]:
    """Processes seen since ``since``, the most recently seen first (at most ``limit``)."""
    rows = _heartbeats().filter(last_seen_at__gte=since).order_by("-last_seen_at", "-id")
    return list(rows[: limit or PROCESSES_READ])


# ---------------------------------------------------------------------------- late work


def _runs() -> QuerySet[Execution]:
    return Execution.objects.using(using())


def _capped_count(queryset: QuerySet[Any], column: str, cap: int) -> Capped:
    n = queryset.order_by().values(column)[: cap + 1].count()
    return Capped(n, True) if n <= cap else Capped(cap, False)


def overdue_wake_ups(
    before: dt.datetime, redispatch_after: float, cap: int | None = None
) -> tuple[Capped, dt.datetime | None]:
    """Runs nobody owns whose wake-up time (a sleep's end, a retry's backoff, a scheduled
    start) passed before ``before`` and that no sweeper released yet: their count (up to
    ``cap``) and the earliest such wake-up time.

    The runs the sweeper wakes (``store.sweep``): composed children are their parent's, and a
    run with a task queued, or sent within ``redispatch_after``, was released already.
    """
    cap = cap or COUNT_CAP
    dispatches = Dispatch.objects.using(using()).filter(execution_id=OuterRef("pk"))
    recent = before - dt.timedelta(seconds=redispatch_after)
    waiting = (
        _runs()
        .filter(
            status__in=[ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED],
            wake_at__isnull=False,
            wake_at__lt=before,
            lease_owner__isnull=True,
        )
        .filter(Q(parent__isnull=True) | Q(detached=True))
        .exclude(Exists(dispatches.filter(Q(sent_at__isnull=True) | Q(sent_at__gte=recent))))
    )
    oldest = waiting.order_by("wake_at").values_list("wake_at", flat=True).first()
    return _capped_count(waiting, "wake_at", cap), oldest


def dispatches_not_taken(
    before: dt.datetime, cap: int | None = None
) -> tuple[Capped, dt.datetime | None]:
    """Dispatches due before ``before`` (written then, and not held back past it by a retry's
    backoff) that no worker has taken: their count (up to ``cap``) and the oldest one's time."""
    cap = cap or COUNT_CAP
    late = (
        Dispatch.objects.using(using())
        .filter(sent_at__isnull=True, created_at__lt=before)
        .filter(Q(not_before__isnull=True) | Q(not_before__lt=before))
    )
    oldest = late.order_by("created_at").values_list("created_at", flat=True).first()
    return _capped_count(late, "created_at", cap), oldest


def waiting_by_queue(
    now: dt.datetime, before: dt.datetime, cap: int | None = None
) -> tuple[dict[str, int], dict[str, int], bool]:
    """Runs waiting for a worker now (pending, or scheduled and due; nobody owns them) counted
    by their queue (``""``: the default queue), and those of them waiting since before
    ``before`` (created and due then), each over the oldest ``cap`` runs; and whether that
    was all of them (false: the counts are lower bounds)."""
    waiting = (
        _runs()
        .filter(
            status__in=[ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED],
            lease_owner__isnull=True,
        )
        .filter(Q(parent__isnull=True) | Q(detached=True))
        .filter(Q(wake_at__isnull=True) | Q(wake_at__lte=now))
        .order_by("created_at")
    )
    counts, complete = _grouped(waiting, ["queue"], cap or COUNT_CAP)
    late = waiting.filter(created_at__lt=before).filter(
        Q(wake_at__isnull=True) | Q(wake_at__lt=before)
    )
    late_counts, late_complete = _grouped(late, ["queue"], cap or COUNT_CAP)
    return counts, late_counts, complete and late_complete


# ---------------------------------------------------------------------------- per reactor


@dataclass(frozen=True)
class ReactorWindow:
    """One reactor's runs in a window: started (created), completed, failed (failed or
    needing attention), in flight now, and the 50th and 95th percentiles of the durations of
    its runs completed in the window (None without any)."""

    reactor: str
    started: int = 0
    completed: int = 0
    failed: int = 0
    in_flight: int = 0
    p50: float | None = None
    p95: float | None = None


#: Statuses counted as a reactor's runs in flight.
IN_FLIGHT = IN_FLIGHT_STATUSES
#: Statuses counted as failed.
FAILED = (ExecutionStatus.FAILED, ExecutionStatus.NEEDS_ATTENTION)


def _grouped(
    queryset: QuerySet[Any], columns: Sequence[str], cap: int
) -> tuple[dict[Any, int], bool]:
    """``queryset``'s first ``cap`` rows counted by ``columns``, in one statement (a ``LIMIT``
    subquery grouped outside); and whether they were all of its rows."""
    connection = connections[using()]
    query = queryset.values(*columns)[: cap + 1].query
    sql, params = query.get_compiler(using=using()).as_sql()
    quoted = ", ".join(connection.ops.quote_name(c) for c in columns)
    statement = f"SELECT {quoted}, COUNT(*) FROM ({sql}) window_rows GROUP BY {quoted}"
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        rows = cursor.fetchall()
    counts = {(row[0] if len(columns) == 1 else tuple(row[:-1])): int(row[-1]) for row in rows}
    return counts, sum(counts.values()) <= cap


def _percentile(values: list[float], share: float) -> float:
    return values[max(math.ceil(share * len(values)) - 1, 0)]


def reactor_windows(
    since: dt.datetime, until: dt.datetime, cap: int | None = None
) -> tuple[list[ReactorWindow], bool]:
    """Each reactor's figures from ``since`` to ``until`` (see :class:`ReactorWindow`), the
    busiest first; and whether every figure counted all its runs (false: a figure stopped at
    ``cap`` runs, the newest, and is a lower bound)."""
    cap = cap or WINDOW_CAP
    started, started_all = _grouped(
        _runs().filter(created_at__gte=since, created_at__lte=until).order_by("-created_at"),
        ["reactor"],
        cap,
    )
    ended, ended_all = _grouped(
        _runs()
        .filter(finished_at__gte=since, finished_at__lte=until)
        .filter(status__in=[ExecutionStatus.COMPLETED, *FAILED])
        .order_by("-finished_at"),
        ["reactor", "status"],
        cap,
    )
    flying: dict[Any, int] = defaultdict(int)
    flying_all = True
    for status in IN_FLIGHT:
        counts, whole = _grouped(
            _runs().filter(status=status).order_by(), ["reactor"], min(cap, IN_FLIGHT_CAP)
        )
        flying_all = flying_all and whole
        for reactor, n in counts.items():
            flying[reactor] += n
    durations: dict[str, list[float]] = defaultdict(list)
    for reactor, started_at, finished_at in (
        _runs()
        .filter(finished_at__gte=since, finished_at__lte=until, status=ExecutionStatus.COMPLETED)
        .order_by("-finished_at")
        .values_list("reactor", "started_at", "finished_at")[:DURATION_SAMPLE]
    ):
        if started_at is not None and finished_at is not None:
            durations[reactor].append(max((finished_at - started_at).total_seconds(), 0.0))
    names: set[str] = set(started) | set(flying) | {reactor for reactor, _ in ended}
    windows = []
    for name in names:
        values = sorted(durations.get(name, []))
        windows.append(
            ReactorWindow(
                reactor=name,
                started=started.get(name, 0),
                completed=ended.get((name, ExecutionStatus.COMPLETED), 0),
                failed=sum(ended.get((name, status), 0) for status in FAILED),
                in_flight=flying.get(name, 0),
                p50=_percentile(values, 0.5) if values else None,
                p95=_percentile(values, 0.95) if values else None,
            )
        )
    windows.sort(key=lambda w: (-(w.started + w.completed + w.failed + w.in_flight), w.reactor))
    return windows, started_all and ended_all and flying_all
