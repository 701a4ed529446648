"""The operations the API, the admin, the commands and ``Reactor`` share.

The statuses each operation accepts are derived from ``states.TRANSITIONS``, and each takes the
run's lease (or asks its live owner) before changing it: no other module changes an execution's
state. By what they do:

- ``runs``: ``run``, ``run_in_background``, ``start``, ``find_by_correlation_id``, ``retry``;
- ``steering``: ``cancel``, ``undo``, ``wake``;
- ``bulk``: ``preview_bulk``, ``start_bulk``, ``run_bulk``, ``stop_bulk``, ``bulk_progress``
  (one action on every run a ``RunFilter`` matches, durable);
- ``forks``: ``fork`` (a run again from a step, its earlier steps carried), ``fork_plan``;
- ``pausing``: ``pause``, ``unpause`` (a run), ``pause_reactor``, ``unpause_reactor``,
  ``paused_reactors`` (every run of a reactor);
- ``deadlines``: ``expire_deadlines`` (the sweeper stops paused runs past their deadline);
- ``stuck``: ``stuck_runs`` (lease expired, or a step in flight past its timeout);
- ``workers``: ``resume`` and ``resume_many`` (a worker's tasks), ``sweep`` and
  ``next_sweep_in``;
- ``health``: ``fleet_health`` (workers' and sweepers' heartbeats, late work, per-reactor figures)
  and the heartbeats' writes; ``figures``: ``fleet_figures`` (the same in each database, with
  runs by status: the Prometheus metrics);
- ``interrupts``: ``resume_interrupt``, ``issue_resume_token``, ``expire_interrupts``, and
  the payloads a run's mailbox keeps for its interrupts (``deliver_kept``);
- ``messages``: ``send`` (a message to a run, kept until a ``receive`` takes it);
- ``events``: ``emit`` (an event, given to the runs waiting for it, starting and cancelling
  runs) and ``finish_events`` (the sweeper's part);
- ``maintenance``: ``prune`` and the ordered-lock queues;
- ``secrets``: ``forget_subject`` (erasing a subject's secrets), ``rotate_keys``,
  ``shown_outcome`` (an outcome as the faces show it);
- ``schedules``: schedules (``services.schedules.create``, ``pause``, ``run_now``, ...) and
  firing their ticks (part of ``sweep``);
- ``audit``: the steering history (``steering``, ``record``, ``of_run``): who steered a run,
  via which face, and why;
- ``asynchronous``: ``aresume_interrupt``, ``asend``, ``aemit`` (the async twins an ASGI view
  needs; ``Reactor.arun`` and the handle's ``await_outcome`` are the others);
- ``deploys``: ``deploy_check`` (what the reactors in this code do to the runs in flight,
  before a deploy); ``migrating``: ``migrate_parked`` (runs parked ``definition_changed``
  moved onto the code's definition);
- ``guards``: the checks an operation makes of its call; ``handles``: ``find`` and the
  handles the operations give back.
"""

from __future__ import annotations

from ..exceptions import InvalidFilter
from . import audit, flow, handles, schedules, secrets
from .asynchronous import aemit, aresume_interrupt, asend
from .bulk import (
    BulkPreview,
    BulkProgress,
    bulk_progress,
    preview_bulk,
    run_bulk,
    start_bulk,
    stop_bulk,
)
from .deadlines import expire_deadlines
from .deploys import DeployCheck, deploy_check
from .events import Emitted, emit, finish_events
from .figures import DatabaseFigures, fleet_figures
from .forks import FORKABLE, fork, fork_plan
from .guards import MAX_KEY_LENGTH
from .handles import find
from .health import Health, fleet_health, waiting_warnings
from .interrupts import (
    after_pause,
    deliver,
    deliver_kept,
    expire_interrupts,
    find_interrupt,
    issue_resume_token,
    keep_delivery,
    resume_interrupt,
)
from .maintenance import ordered_lock, prune, reset_ordered_lock, skip_ordered_run
from .messages import send
from .migrating import Migration, migrate_parked
from .pausing import (
    ReactorPause,
    Unpaused,
    pause,
    pause_reactor,
    paused_reactors,
    unpause,
    unpause_reactor,
)
from .run_filters import RunFilter
from .runs import find_by_correlation_id, retry, run, run_in_background, start
from .secrets import forget_subject, rotate_keys, shown_outcome
from .steering import CANCELLABLE, UNDOABLE, cancel, undo, wake
from .stuck import StuckRun, stuck_runs
from .workers import DATABASE_ERROR_RETRIES, next_sweep_in, resume, resume_many, sweep

__all__ = [
    "CANCELLABLE",
    "DATABASE_ERROR_RETRIES",
    "FORKABLE",
    "MAX_KEY_LENGTH",
    "UNDOABLE",
    "BulkPreview",
    "BulkProgress",
    "DatabaseFigures",
    "DeployCheck",
    "Emitted",
    "Health",
    "InvalidFilter",
    "Migration",
    "ReactorPause",
    "RunFilter",
    "ServiceOperations",
    "StuckRun",
    "Unpaused",
    "aemit",
    "after_pause",
    "aresume_interrupt",
    "asend",
    "audit",
    "bulk_progress",
    "cancel",
    "deliver",
    "deliver_kept",
    "deploy_check",
    "emit",
    "expire_deadlines",
    "expire_interrupts",
    "find",
    "find_by_correlation_id",
    "find_interrupt",
    "finish_events",
    "fleet_figures",
    "fleet_health",
    "flow",
    "forget_subject",
    "fork",
    "fork_plan",
    "issue_resume_token",
    "keep_delivery",
    "migrate_parked",
    "next_sweep_in",
    "ordered_lock",
    "pause",
    "pause_reactor",
    "paused_reactors",
    "preview_bulk",
    "prune",
    "reset_ordered_lock",
    "resume",
    "resume_interrupt",
    "resume_many",
    "retry",
    "rotate_keys",
    "run",
    "run_bulk",
    "run_in_background",
    "schedules",
    "secrets",
    "send",
    "shown_outcome",
    "skip_ordered_run",
    "start",
    "start_bulk",
    "stop_bulk",
    "stuck_runs",
    "sweep",
    "undo",
    "unpause",
    "unpause_reactor",
    "wake",
]


class ServiceOperations:
    """The services, as the :class:`~django_reactor.handle.ExecutionHandle` steering its run
    uses them (``refresh()``, ``cancel()``, ``undo()``, ``retry()``, ``resume()``, ``send()``;
    ``wait()`` asks ``waiting_warnings`` why a run it gave up on may not move)."""

    find = staticmethod(find)
    cancel = staticmethod(cancel)
    undo = staticmethod(undo)
    retry = staticmethod(retry)
    pause = staticmethod(pause)
    fork = staticmethod(fork)
    unpause = staticmethod(unpause)
    resume_interrupt = staticmethod(resume_interrupt)
    send = staticmethod(send)
    waiting_warnings = staticmethod(waiting_warnings)


# Wired here, where every operation is known: the handles the operations return use them.
handles.OPERATIONS = ServiceOperations()
