"""Housekeeping: pruning old finished runs, and steering ordered-lock queues."""

from __future__ import annotations

import time
import uuid
from typing import Any

from .. import store
from ..conf import reactor_settings
from ..coordination import coordinator as run_coordination
from ..coordination import get_backend
from ..engine import timevalues
from ..engine.executor import utcnow
from ..exceptions import InvalidTime, ReactorError
from ..states import TERMINAL_STATUSES
from . import audit
from .audit import check_reason
from .databases import in_each_database

#: The longest wait between two batches of a prune, in seconds.
MAX_PAUSE = 3600.0


def prune(
    older_than_days: float,
    statuses: Any = None,
    batch_size: int = 1000,
    dry_run: bool = False,
    *,
    on_batch: Any = None,
    pause: float = 0.0,
) -> int:
    """Delete finished runs whose ``finished_at`` is more than ``older_than_days`` days ago.

    ``statuses`` (default: completed, failed, halted and cancelled) must all be finished
    statuses; runs that could still move (pending, running, paused, rolling back, aborted,
    needs attention) are never deleted. Only top-level runs are selected, and only when their
    whole tree (composed children, async units) has finished; children, step records, traces
    and interrupts go with them. Deletes ``batch_size`` runs per transaction, calling
    ``on_batch(count)`` after each and waiting ``pause`` seconds before the next (outside any
    transaction: a prune beside busy workers then leaves them the database); returns how many
    top-level runs were deleted, or with ``dry_run`` how many would be, deleting nothing.
    Handled events (``emit``) emitted before the cutoff are deleted too, and so are the
    steering history's entries older than ``REACTOR["AUDIT_RETENTION"]`` (whatever became of
    their runs: the history outlives the runs it names), unless it is None.
    """
    if isinstance(older_than_days, bool) or not isinstance(older_than_days, int | float):
        raise InvalidTime(f"older_than_days must be a number, got {older_than_days!r}")
    if older_than_days < 0:
        raise InvalidTime(f"older_than_days must be 0 or more, got {older_than_days}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ReactorError(f"batch_size must be a whole number of 1 or more, got {batch_size!r}")
    if isinstance(pause, bool) or not isinstance(pause, int | float) or not 0 <= pause <= MAX_PAUSE:
        raise ReactorError(
            f"pause must be a number of seconds from 0 to {MAX_PAUSE}, got {pause!r}"
        )
    chosen = sorted(TERMINAL_STATUSES) if statuses is None else [str(s) for s in statuses]
    unfinished = [s for s in chosen if s not in TERMINAL_STATUSES]
    if unfinished or not chosen:
        raise ReactorError(
            f"prune deletes only finished runs ({', '.join(sorted(TERMINAL_STATUSES))}); "
            f"got {', '.join(unfinished) or 'no status'}"
        )
    cutoff = timevalues.ago(
        older_than_days * 86400, f"older_than_days={older_than_days}", now=utcnow()
    )
    if dry_run:
        return sum(in_each_database(lambda: store.count_prunable(cutoff, chosen)))

    def prune_here() -> int:
        total = 0
        for count in store.prune_finished(cutoff, chosen, batch_size):
            total += count
            if on_batch is not None:
                on_batch(count)
            if pause:
                time.sleep(pause)
        store.events.prune_before(cutoff, batch_size)
        retention = reactor_settings.AUDIT_RETENTION
        if retention is not None:
            store.audit.prune_before(
                timevalues.ago(retention, "REACTOR['AUDIT_RETENTION']", now=utcnow()), batch_size
            )
        return total

    return sum(in_each_database(prune_here))


def ordered_lock(key: str) -> Any:
    """Where the runs of an ordered lock stand: queue (head first), halt, skipped runs.

    ``key`` is the lock's key as the reactor computes it (``"account-7"``).
    """
    return get_backend().ordered_status(run_coordination.backend_key("ordered", key))


def skip_ordered_run(key: str, execution_id: uuid.UUID | str, *, reason: str = "") -> bool:
    """Take a run out of an ordered lock's queue (a stuck head); False when it was not queued.
    Recorded in the steering history with who asked and ``reason`` when it was taken out."""
    check_reason(reason, "skip a run of an ordered lock")
    run_id = store.parse_id(execution_id)
    steering = audit.steering(
        "lock_skip", reason=reason, execution_id=run_id, target=f"ordered lock {key}"
    )
    skipped = get_backend().skip_ordered(run_coordination.backend_key("ordered", key), str(run_id))
    if skipped:
        # Recorded after the change: the lock lives in the coordination backend (Redis, or a
        # database of its own), not in a transaction of the runs' database.
        audit.record(steering)
    return skipped


def reset_ordered_lock(key: str, *, reason: str = "") -> int:
    """Empty an ordered lock's queue and lift its halt; the runs removed (they re-queue when
    a worker next takes them). Recorded in the steering history with who asked and ``reason``.
    """
    check_reason(reason, "reset an ordered lock")
    steering = audit.steering("lock_reset", reason=reason, target=f"ordered lock {key}")
    removed = get_backend().reset_ordered(run_coordination.backend_key("ordered", key))
    # After the change, as for a skip: the lock is not in the runs' database.
    audit.record(steering, removed=removed)
    return removed
