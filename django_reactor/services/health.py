"""The fleet's health: whether workers and a sweeper are alive, and what waits because they
are not.

Workers report a heartbeat every ``HEARTBEAT_INTERVAL`` seconds (``django_reactor.celery``
starts the thread in each worker's main process), sweepers one after each sweep
(:func:`record_sweep`, called by ``sweep()``). :func:`health` reads them with the late work
(overdue wake-ups, dispatches no worker took) and each reactor's figures for the last hour;
the admin's overview, ``reactor_health`` and ``reactor_show`` show it.

A process counts as alive while its last heartbeat is younger than three of its intervals
(a sweeper's interval is never taken shorter than ``SWEEP_INTERVAL``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from .. import registry, store
from ..conf import reactor_settings
from ..models import ProcessHeartbeat, ProcessRole
from ..states import ExecutionStatus
from ..store.health import ReactorWindow
from ..store.overview import Capped

logger = logging.getLogger("django_reactor.health")

#: A process is alive while its last heartbeat is younger than this many of its intervals.
MISSED_BEATS = 3
#: Wake-ups and dispatches this many sweep intervals late count as overdue.
LATE_INTERVALS = 2
#: Rows of processes unseen for this long are deleted by the sweeper.
RETENTION = dt.timedelta(days=1)
#: The per-reactor table's window.
WINDOW = dt.timedelta(hours=1)

#: When this process started, as its heartbeats say (a process reports one start).
_STARTED_AT = timezone.now()

#: The seconds between this process's sweeps, when a loop says (``sweeping_every``).
_sweep_every: ContextVar[float | None] = ContextVar("django_reactor_sweep_every", default=None)

SWEEPER_HINT = "start `python manage.py reactor_sweep --loop` or Celery beat"
WORKER_HINT = "start a Celery worker (`celery -A yourproject worker`)"


def format_duration(seconds: float | None) -> str:
    """A delay as the problems word it: ``12.3 s``, ``3 min 05 s``, ``2 h 05 min``, ``3 d 04 h``
    (``-`` unknown)."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{max(seconds, 0.0):.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


def this_process() -> tuple[str, int]:
    """The host name and pid a heartbeat of this process is filed under."""
    return socket.gethostname(), os.getpid()


# ---------------------------------------------------------------------------- writes


def beat_worker(
    *,
    name: str,
    queues: Sequence[str],
    concurrency: int | None,
    tasks_done: int,
    started_at: dt.datetime,
) -> None:
    """Record a heartbeat of this worker process (its thread calls it every
    ``HEARTBEAT_INTERVAL`` seconds)."""
    host, pid = this_process()
    store.health.beat(
        role=ProcessRole.WORKER,
        host=host,
        pid=pid,
        name=name,
        queues=queues,
        concurrency=concurrency,
        tasks_done=tasks_done,
        interval=reactor_settings.HEARTBEAT_INTERVAL,
        started_at=started_at,
        now=timezone.now(),
        code=registry.inventory(),
    )


def forget_worker() -> None:
    """This worker process stops cleanly: remove its heartbeat (it is gone, not late)."""
    host, pid = this_process()
    store.health.forget(role=ProcessRole.WORKER, host=host, pid=pid)


@contextlib.contextmanager
def sweeping_every(interval: float) -> Iterator[None]:
    """Within the block, this process sweeps every ``interval`` seconds (``reactor_sweep
    --loop --interval``): its heartbeats promise that, not ``SWEEP_INTERVAL``."""
    token = _sweep_every.set(interval)
    try:
        yield
    finally:
        _sweep_every.reset(token)


def record_sweep(report: Mapping[str, int], seconds: float, interval: float | None = None) -> None:
    """Record this process's sweep that just ended (what it did, how long it took) as its
    heartbeat, and delete the rows of processes unseen for a day; ``interval``: the seconds
    until its next sweep (default: the loop's, see :func:`sweeping_every`, else
    ``SWEEP_INTERVAL``). Never raises: a sweep that cannot record its heartbeat still swept
    (the failure is logged)."""
    host, pid = this_process()
    now = timezone.now()
    try:
        store.health.beat(
            role=ProcessRole.SWEEPER,
            host=host,
            pid=pid,
            interval=interval or _sweep_every.get() or reactor_settings.SWEEP_INTERVAL,
            started_at=_STARTED_AT,
            now=now,
            sweep_seconds=seconds,
            sweep=report,
        )
        store.health.prune(now - RETENTION)
    except Exception:
        logger.warning("could not record the sweeper's heartbeat", exc_info=True)


# ---------------------------------------------------------------------------- reads


@dataclass(frozen=True)
class ProcessSeen:
    """One process's last heartbeat, and whether it counts as alive (``age``: seconds since
    it was seen; ``stale_after``: the age past which it does not)."""

    role: str
    host: str
    pid: int
    name: str
    queues: list[str]
    concurrency: int | None
    started_at: dt.datetime
    last_seen_at: dt.datetime
    tasks_done: int
    last_sweep_at: dt.datetime | None
    last_sweep_seconds: float | None
    last_sweep: dict[str, int]
    age: float
    stale_after: float
    # A worker's code: by reactor name, its declared versions and fingerprints.
    code: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.age <= self.stale_after

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (times in ISO 8601)."""
        return {
            "role": self.role,
            "host": self.host,
            "pid": self.pid,
            "name": self.name,
            "queues": self.queues,
            "concurrency": self.concurrency,
            "started_at": self.started_at.isoformat(),
            "last_seen_at": self.last_seen_at.isoformat(),
            "seen_seconds_ago": round(self.age, 3),
            "alive": self.alive,
            "tasks_done": self.tasks_done,
            "last_sweep_at": self.last_sweep_at.isoformat() if self.last_sweep_at else None,
            "last_sweep_seconds": self.last_sweep_seconds,
            "last_sweep": self.last_sweep,
        }


def _seen(row: ProcessHeartbeat, now: dt.datetime) -> ProcessSeen:
    interval = row.interval
    if row.role == ProcessRole.SWEEPER:
        interval = max(interval, reactor_settings.SWEEP_INTERVAL)
    return ProcessSeen(
        role=row.role,
        host=row.host,
        pid=row.pid,
        name=row.name,
        queues=[str(q) for q in row.queues or []],
        concurrency=row.concurrency,
        started_at=row.started_at,
        last_seen_at=row.last_seen_at,
        tasks_done=row.tasks_done,
        last_sweep_at=row.last_sweep_at,
        last_sweep_seconds=row.last_sweep_seconds,
        last_sweep=dict(row.last_sweep or {}),
        age=max((now - row.last_seen_at).total_seconds(), 0.0),
        stale_after=MISSED_BEATS * interval,
        code=dict(row.code or {}),
    )


def _processes(now: dt.datetime) -> tuple[list[ProcessSeen], list[ProcessSeen]]:
    seen = [_seen(row, now) for row in store.health.processes(now - RETENTION)]
    return (
        [p for p in seen if p.role == ProcessRole.WORKER],
        [p for p in seen if p.role == ProcessRole.SWEEPER],
    )


def worker_with_code(
    reactor: str, *, version: str = "", definition_hash: str = ""
) -> ProcessSeen | None:
    """A live worker whose code runs a run of ``reactor`` that started on ``version`` (its
    ``Meta.version``), or, without one, on the fingerprint ``definition_hash``; None when no
    live worker has it (by their heartbeats)."""
    workers, _ = _processes(timezone.now())
    for worker in workers:
        code = worker.code.get(reactor) or {}
        held = code.get("versions", []) if version else code.get("definitions", [])
        if worker.alive and (version or definition_hash) in held:
            return worker
    return None


@dataclass(frozen=True)
class Health:
    """The fleet's health at ``now`` (see :func:`health`).

    ``problems``: plain sentences, each saying what is wrong and what to do next; the fleet
    is ``healthy`` without any.
    """

    now: dt.datetime
    workers: list[ProcessSeen]
    sweepers: list[ProcessSeen]
    overdue: Capped
    overdue_since: dt.datetime | None
    not_taken: Capped
    not_taken_since: dt.datetime | None
    late_after: float
    reactors: list[ReactorWindow] = field(default_factory=list)
    reactors_complete: bool = True
    queues: list[QueueDepth] = field(default_factory=list)
    queues_complete: bool = True
    problems: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def workers_alive(self) -> int:
        return sum(1 for p in self.workers if p.alive)

    @property
    def sweeper(self) -> ProcessSeen | None:
        """The sweeper seen last (None: none in the last day)."""
        return self.sweepers[0] if self.sweepers else None

    @property
    def sweeper_ok(self) -> bool:
        return self.sweeper is not None and self.sweeper.alive

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (times in ISO 8601, durations in seconds)."""
        sweeper = self.sweeper
        return {
            "healthy": self.healthy,
            "now": self.now.isoformat(),
            "problems": self.problems,
            "workers_alive": self.workers_alive,
            "sweeper_ok": self.sweeper_ok,
            "sweeper_last_seen_at": sweeper.last_seen_at.isoformat() if sweeper else None,
            "overdue_wake_ups": self.overdue.value,
            "overdue_wake_ups_exact": self.overdue.exact,
            "dispatches_not_taken": self.not_taken.value,
            "dispatches_not_taken_exact": self.not_taken.exact,
            "late_after_seconds": self.late_after,
            "workers": [p.as_dict() for p in self.workers],
            "sweepers": [p.as_dict() for p in self.sweepers],
            "reactors": [
                {
                    "reactor": w.reactor,
                    "started": w.started,
                    "completed": w.completed,
                    "failed": w.failed,
                    "in_flight": w.in_flight,
                    "p50_seconds": w.p50,
                    "p95_seconds": w.p95,
                }
                for w in self.reactors
            ],
            "reactors_complete": self.reactors_complete,
            "queues": [q.as_dict() for q in self.queues],
            "queues_complete": self.queues_complete,
        }


@dataclass(frozen=True)
class QueueDepth:
    """One Celery queue: the runs waiting in it for a worker now (``waiting``), and the live
    workers consuming it (their names)."""

    queue: str
    waiting: int
    consumers: list[str]
    # Of ``waiting``, the runs that have waited longer than the fleet's lateness bound.
    late: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "waiting": self.waiting,
            "late": self.late,
            "consumers": self.consumers,
        }


def default_queue() -> str:
    """The queue a run without one of its own goes to (``REACTOR["CELERY_QUEUE"]``, else
    Celery's default, ``celery``)."""
    return reactor_settings.CELERY_QUEUE or "celery"


def _queue_depths(
    waiting: Mapping[str, int], late: Mapping[str, int], workers: Sequence[ProcessSeen]
) -> list[QueueDepth]:
    """Each queue with waiting runs or live consumers, the deepest first."""
    by_queue: dict[str, int] = {}
    late_by_queue: dict[str, int] = {}
    for queue, count in waiting.items():
        name = queue or default_queue()
        by_queue[name] = by_queue.get(name, 0) + count
    for queue, count in late.items():
        name = queue or default_queue()
        late_by_queue[name] = late_by_queue.get(name, 0) + count
    consumers: dict[str, list[str]] = {}
    for process in workers:
        if process.alive:
            for queue in process.queues:
                consumers.setdefault(queue, []).append(process.name or process.host)
    names = sorted(set(by_queue) | set(consumers), key=lambda q: (-by_queue.get(q, 0), q))
    return [
        QueueDepth(q, by_queue.get(q, 0), sorted(consumers.get(q, [])), late_by_queue.get(q, 0))
        for q in names
    ]


def _queue_problems(depths: Sequence[QueueDepth], complete: bool, late: str) -> list[str]:
    """A sentence for each queue runs have waited in for longer than ``late`` that no live
    worker consumes."""
    more = "" if complete else " or more"
    return [
        f"{depth.late}{more} {'run has' if depth.late == 1 and complete else 'runs have'} "
        f"waited more than {late} in the queue {depth.queue!r} and no live worker consumes "
        f"it: start one with `celery -A <project> worker -Q {depth.queue}` (or add the queue "
        "to a worker's -Q)"
        for depth in depths
        if depth.late and not depth.consumers
    ]


def _count(count: Capped) -> str:
    return str(count.value) if count.exact else f"more than {count.value}"


def _sweeper_problem(sweepers: list[ProcessSeen]) -> str | None:
    if not sweepers:
        return f"no sweeper has run in the last day: {SWEEPER_HINT}"
    last = sweepers[0]
    if last.alive:
        return None
    return (
        f"no sweeper has run for {format_duration(last.age)} (the last on {last.host}, pid "
        f"{last.pid}): {SWEEPER_HINT}"
    )


def _worker_problem(workers: list[ProcessSeen]) -> str | None:
    if any(p.alive for p in workers):
        return None
    if not workers:
        return f"no worker has reported in the last day: {WORKER_HINT}"
    last = workers[0]
    return (
        f"no worker is alive: the last one ({last.name or last.host}, pid {last.pid}) was "
        f"seen {format_duration(last.age)} ago; {WORKER_HINT}"
    )


def fleet_health(now: dt.datetime | None = None, *, reactors: bool = True) -> Health:
    """The fleet's health now: workers and sweepers seen in the last day (alive or not),
    overdue wake-ups (due more than two ``SWEEP_INTERVAL`` ago: the sweeper releases them),
    dispatches no worker took within that time, and (unless ``reactors`` is false) each
    reactor's figures for the last hour. Every read is capped and index-backed."""
    now = now or timezone.now()
    workers, sweepers = _processes(now)
    late_after = LATE_INTERVALS * reactor_settings.SWEEP_INTERVAL
    before = now - dt.timedelta(seconds=late_after)
    overdue, overdue_since = store.health.overdue_wake_ups(
        before, reactor_settings.REDISPATCH_AFTER
    )
    not_taken, not_taken_since = store.health.dispatches_not_taken(before)
    problems = [p for p in (_sweeper_problem(sweepers), _worker_problem(workers)) if p]
    late = format_duration(late_after)

    def ago(moment: dt.datetime | None) -> str:
        return format_duration((now - moment).total_seconds() if moment else None)

    if overdue.value:
        problems.append(
            f"{_count(overdue)} wake-ups are overdue by more than {late} (the oldest was due "
            f"{ago(overdue_since)} ago): the sweeper releases them; {SWEEPER_HINT} if none runs"
        )
    if not_taken.value:
        problems.append(
            f"{_count(not_taken)} dispatches were not taken by a worker within {late} (the "
            f"oldest is {ago(not_taken_since)} old): check that workers consume the queue "
            f"{reactor_settings.CELERY_QUEUE or 'celery'!r} and that the broker is reachable"
        )
    windows, complete = store.health.reactor_windows(now - WINDOW, now) if reactors else ([], True)
    waiting, late_waiting, queues_complete = store.health.waiting_by_queue(now, before)
    queues = _queue_depths(waiting, late_waiting, workers)
    if any(p.alive for p in workers):  # with none alive, the worker problem says it all
        problems += _queue_problems(queues, queues_complete, late)
    return Health(
        now=now,
        workers=workers,
        sweepers=sweepers,
        overdue=overdue,
        overdue_since=overdue_since,
        not_taken=not_taken,
        not_taken_since=not_taken_since,
        late_after=late_after,
        reactors=windows,
        reactors_complete=complete,
        queues=queues,
        queues_complete=queues_complete,
        problems=problems,
    )


#: Statuses of runs that wait for a sweeper (a wake-up) or a worker to move.
WAITING = (ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED)


def waiting_warnings(status: str, *, wakes: bool, now: dt.datetime | None = None) -> list[str]:
    """Why a run in ``status`` may not move: no sweeper alive (when it waits for a wake-up,
    ``wakes``: a sleep, a backoff, a scheduled start) or no worker alive (when it waits for
    one). Reads only the heartbeats; empty for runs that wait for neither."""
    if status not in WAITING:
        return []
    now = now or timezone.now()
    workers, sweepers = _processes(now)
    warnings = []
    if wakes:
        problem = _sweeper_problem(sweepers)
        if problem:
            warnings.append(f"{problem}; until then this run is not woken")
    problem = _worker_problem(workers)
    if problem:
        warnings.append(f"{problem}; until then this run does not move")
    return warnings
