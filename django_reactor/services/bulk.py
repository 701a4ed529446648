"""Bulk operations: one steering action applied to every run a filter matches, previewed,
durable and applied at most once to each run.

:func:`preview_bulk` says what an operation would do without writing anything: how many runs
match (by status), a sample, and for each sample run what it would undo. :func:`start_bulk`
chooses the runs once (one item each) and hands the operation to a worker, or to the caller
(``reactor_bulk``); :func:`run_bulk` works through the items under the operation's lease, a
batch at a time, and can be stopped (:func:`stop_bulk`). A process that dies leaves the rest to
another: the sweeper hands an operation nobody holds to a worker again, and a run's action
applied just before the crash is safe to apply again (a retry or a fork refuses a second one,
a payload carries the item's idempotency key, cancel, undo, wake and pause change nothing
twice), so no run gets it twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count

from .. import registry, store
from ..engine.actors import MAX_WHO_LENGTH, VIA, Actor, acting_as
from ..engine.forks import plan_fork
from ..exceptions import ExecutionNotFound, InvalidFilter, ReactorError
from ..models import BulkOperation, BulkStatus, ItemStatus
from . import audit
from .databases import across_databases
from .forks import fork
from .interrupts import resume_interrupt
from .pausing import pause, unpause
from .run_filters import RunFilter
from .runs import retry
from .steering import cancel, undo, wake

logger = logging.getLogger("django_reactor.services")

#: Items taken care of between two looks at whether the operation was stopped.
BATCH = 50
#: Runs a preview lists.
SAMPLE = 20


@dataclass(frozen=True, slots=True)
class BulkAction:
    """One action a bulk operation can apply: its name, the permission it needs (the same as
    on one run), and what it takes."""

    name: str
    permission: str
    apply: Callable[[uuid.UUID, Mapping[str, Any], str], str]
    #: What the action takes besides the runs (checked when the operation is created).
    takes: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    #: What it does to one run, in words, for the preview.
    does: str = ""


def _retry(run: uuid.UUID, params: Mapping[str, Any], key: str) -> str:
    return f"retried as {retry(run, reason=params.get('reason', '')).execution_id}"


def _fork(run: uuid.UUID, params: Mapping[str, Any], key: str) -> str:
    outcome = fork(
        run,
        params["from_step"],
        undo_abandoned=bool(params.get("undo_abandoned")),
        reason=params.get("reason", ""),
    )
    return f"forked as {outcome.execution_id} ({outcome.status})"


def _cancel(run: uuid.UUID, params: Mapping[str, Any], key: str) -> str:
    return f"cancel: {cancel(run, reason=params.get('reason') or 'cancelled in bulk').status}"


def _undo(run: uuid.UUID, params: Mapping[str, Any], key: str) -> str:
    return f"undone: {undo(run, reason=params.get('reason', '')).status}"


def _wake(run: uuid.UUID, params: Mapping[str, Any], key: str) -> str:
    return f"woken: {wake(run, reason=params.get('reason', '')).status}"


def _pause(run: uuid.UUID, params: Mapping[str, Any], key: str) -> str:
    return f"paused: {pause(run, reason=params.get('reason', '')).status}"


def _unpause(run: uuid.UUID, params: Mapping[str, Any], key: str) -> str:
    return f"unpaused: {unpause(run, reason=params.get('reason', '')).status}"


def _resume(run: uuid.UUID, params: Mapping[str, Any], key: str) -> str:
    outcome = resume_interrupt(
        run,
        step=params.get("step"),
        payload=params["payload"],
        idempotency_key=key,
        reason=params.get("reason", ""),
    )
    return f"resumed: {outcome.status}"


ACTIONS: dict[str, BulkAction] = {
    action.name: action
    for action in (
        BulkAction("retry", "retry_execution", _retry, does="starts a new run from the first step"),
        BulkAction(
            "fork",
            "retry_execution",
            _fork,
            takes=("from_step", "undo_abandoned"),
            needs=("from_step",),
            does="starts a new run from the step, the steps before it carried",
        ),
        BulkAction("cancel", "cancel_execution", _cancel, does="stops it"),
        BulkAction("undo", "undo_execution", _undo, does="rolls back its completed steps"),
        BulkAction("wake", "cancel_execution", _wake, does="ends its wait for a time now"),
        BulkAction("pause", "pause_execution", _pause, does="stops it at its next step"),
        BulkAction("unpause", "pause_execution", _unpause, does="lets it go on"),
        BulkAction(
            "resume",
            "resume_interrupt",
            _resume,
            takes=("step", "payload"),
            needs=("payload",),
            does="delivers the payload to its interrupt",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class SampleRun:
    """One run of a preview's sample, and what the action would do to it."""

    execution_id: uuid.UUID
    reactor: str
    status: str
    undo: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True, slots=True)
class BulkPreview:
    """What a bulk operation would do (nothing was written)."""

    action: str
    run_filter: dict[str, Any]
    parameters: dict[str, Any]
    count: int
    by_status: dict[str, int]
    sample: tuple[SampleRun, ...]
    does: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "filter": self.run_filter,
            "parameters": self.parameters,
            "count": self.count,
            "by_status": self.by_status,
            "does": self.does,
            "sample": [
                {
                    "execution_id": str(s.execution_id),
                    "reactor": s.reactor,
                    "status": s.status,
                    "undo": list(s.undo),
                    "note": s.note,
                }
                for s in self.sample
            ],
        }


@dataclass(frozen=True, slots=True)
class BulkProgress:
    """Where an operation stands."""

    id: uuid.UUID
    action: str
    status: str
    total: int
    done: int
    skipped: int
    failed: int
    run_filter: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    created_by: str = ""

    @property
    def left(self) -> int:
        return max(self.total - self.done - self.skipped - self.failed, 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "action": self.action,
            "status": self.status,
            "total": self.total,
            "done": self.done,
            "skipped": self.skipped,
            "failed": self.failed,
            "left": self.left,
            "filter": self.run_filter,
            "parameters": self.parameters,
            "reason": self.reason,
            "created_by": self.created_by,
        }

    @classmethod
    def of(cls, row: BulkOperation) -> BulkProgress:
        return cls(
            id=row.id,
            action=row.action,
            status=row.status,
            total=row.total,
            done=row.done,
            skipped=row.skipped,
            failed=row.failed,
            run_filter=row.run_filter,
            parameters=row.parameters,
            reason=row.reason,
            created_by=row.created_by,
        )


def bulk_action(name: str) -> BulkAction:
    """The action called ``name``; InvalidFilter listing the actions otherwise."""
    action = ACTIONS.get(name) if isinstance(name, str) else None
    if action is None:
        raise InvalidFilter(f"there is no bulk action {name!r}; actions: {', '.join(ACTIONS)}")
    return action


def _parameters(action: BulkAction, parameters: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(parameters) - set(action.takes))
    if unknown:
        takes = ", ".join(action.takes) or "nothing"
        raise InvalidFilter(f"{action.name} takes {takes}; not {', '.join(unknown)}")
    missing = [name for name in action.needs if parameters.get(name) in (None, "")]
    if missing:
        raise InvalidFilter(f"{action.name} needs {', '.join(missing)}")
    checked = dict(parameters)
    if "from_step" in checked and not isinstance(checked["from_step"], str):
        raise InvalidFilter("from_step is the name of a step")
    return checked


def preview_bulk(
    action: str, run_filter: RunFilter, parameters: Mapping[str, Any] | None = None
) -> BulkPreview:
    """What :func:`start_bulk` would do with these arguments; nothing is written."""
    chosen = bulk_action(action)
    params = _parameters(chosen, parameters or {})
    count = 0
    by_status: dict[str, int] = {}
    sample: list[SampleRun] = []
    for alias in run_filter.databases():
        with store.bound(alias):
            runs = run_filter.runs()
            for row in runs.order_by().values("status").annotate(n=Count("pk")):
                by_status[row["status"]] = by_status.get(row["status"], 0) + row["n"]
                count += row["n"]
            for run in runs.order_by("created_at", "id")[: SAMPLE - len(sample)]:
                sample.append(_sampled(chosen, run, params))
    return BulkPreview(
        action=chosen.name,
        run_filter=run_filter.as_dict(),
        parameters=params,
        count=count,
        by_status=dict(sorted(by_status.items(), key=lambda kv: -kv[1])),
        sample=tuple(sample),
        does=chosen.does,
    )


def _sampled(action: BulkAction, run: Any, params: Mapping[str, Any]) -> SampleRun:
    """What ``action`` would do to one run of a preview."""
    undo_steps: tuple[str, ...] = ()
    note = ""
    try:
        if action.name == "undo":
            records = store.run_records(run, for_rollback=True)
            undo_steps = tuple(
                r.step
                for r in sorted(records.steps, key=lambda r: -r.seq)
                if r.status == "completed" and r.rollback in ("", "failed")
            )
        elif action.name == "fork":
            definition = registry.of_run(run.reactor, run.version).definition
            plan = plan_fork(definition, store.run_records(run), params["from_step"])
            undo_steps = plan.undo
            note = f"carries {', '.join(plan.carried) or 'nothing'}"
    except ReactorError as exc:
        note = f"refused: {exc}"
    return SampleRun(run.id, run.reactor, run.status, undo_steps, note)


def start_bulk(
    action: str,
    run_filter: RunFilter,
    parameters: Mapping[str, Any] | None = None,
    *,
    reason: str = "",
    background: bool = True,
) -> BulkProgress:
    """Choose the runs ``run_filter`` matches now and apply ``action`` to each: on a worker
    (``background``), or by whoever calls :func:`run_bulk` with the operation's id. The
    operation, and each run's action, are recorded as the current actor's (``acting_as``)."""
    chosen = bulk_action(action)
    params = _parameters(chosen, parameters or {})
    steering = audit.steering("bulk", reason=reason)

    def ids() -> Any:
        for alias in run_filter.databases():
            with store.bound(alias):
                yield from store.bulk.matching_ids(run_filter.runs())

    row = store.bulk.create_operation(
        action=chosen.name,
        run_filter=run_filter.as_dict(),
        parameters=params,
        steering=steering,
        runs=ids(),
        publish=background,
    )
    return BulkProgress.of(row)


def bulk_progress(operation_id: uuid.UUID | str) -> BulkProgress:
    """Where an operation stands; ExecutionNotFound when there is none."""
    row = store.bulk.get_operation(_id(operation_id))
    if row is None:
        raise ExecutionNotFound(f"no bulk operation with id {operation_id}")
    return BulkProgress.of(row)


def stop_bulk(operation_id: uuid.UUID | str, *, reason: str = "") -> BulkProgress:
    """Stop an operation: runs not taken care of yet are left alone."""
    steering = audit.steering("bulk_stop", reason=reason)
    progress = bulk_progress(operation_id)
    store.bulk.stop(progress.id, steering)
    return bulk_progress(progress.id)


def run_bulk(
    operation_id: uuid.UUID | str,
    *,
    published_for: store.DatabaseMark | None = None,
    limit: int | None = None,
    on_progress: Callable[[BulkProgress], None] | None = None,
) -> BulkProgress | None:
    """Work through an operation's items in this process (a worker's task, or
    ``reactor_bulk``), unless a live process holds it; stop after ``limit`` items (tests).
    Returns where it stands, or None when another process holds it or it is gone."""
    key = _id(operation_id)
    with store.bound(
        store.database_of_message(published_for, lambda: store.bulk.get_operation(key) is not None)
    ):
        owner = store.lease_owner_token()
        row = store.bulk.take(key, owner)
        if row is None:
            return None
        action = bulk_action(row.action)
        handled = 0
        with store.bulk.OperationKeeper(key, owner):
            while limit is None or handled < limit:
                items = store.bulk.pending_items(key, BATCH)
                if not items:
                    store.bulk.finish(key, owner)
                    break
                for item in items:
                    _apply(action, row, item)
                    handled += 1
                    if limit is not None and handled >= limit:
                        break
                if on_progress is not None:
                    on_progress(bulk_progress(key))
                if not store.bulk.still_held(key, owner):
                    break  # stopped, or taken by another process after a stall
            else:
                store.bulk.release(key, owner)
        return bulk_progress(key)


def _apply(action: BulkAction, row: BulkOperation, item: Any) -> None:
    """Apply the action to one run (in whichever database holds it) and record what it did
    (in the operation's)."""
    key = f"bulk:{row.id}:{item.execution_id}"
    try:
        with store.unbound(), acting_as(_starter(row)):
            parameters = {"reason": row.reason, **row.parameters}
            note = across_databases(action.apply)(item.execution_id, parameters, key)
    except ReactorError as exc:
        store.bulk.record_item(item, ItemStatus.SKIPPED, str(exc))
        return
    except Exception as exc:  # the action's own bug, or the database's: kept, the rest go on
        logger.exception(
            "bulk operation %s: %s of %s failed", row.id, row.action, item.execution_id
        )
        store.bulk.record_item(item, ItemStatus.FAILED, f"{type(exc).__name__}: {exc}")
        return
    store.bulk.record_item(item, ItemStatus.DONE, note)


def _starter(row: BulkOperation) -> Actor:
    """Who each run's action is recorded as: the operation's starter, from its face, naming
    the operation."""
    who = f"{row.created_by or 'someone'} (bulk operation {str(row.id)[:8]})"
    via = row.created_via if row.created_via in VIA else "python"
    return Actor(who[:MAX_WHO_LENGTH], via)


def republish_stalled(limit: int, redispatch_after: float) -> int:
    """Hand the operations no live process holds to a worker again (the sweeper's)."""
    from django.utils import timezone

    stalled = store.bulk.stalled(timezone.now(), redispatch_after, limit)
    store.bulk.republish(stalled)
    return len(stalled)


def _id(value: uuid.UUID | str) -> uuid.UUID:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        raise ExecutionNotFound(f"{value!r} is not a bulk operation's id") from None


__all__ = [
    "ACTIONS",
    "BulkAction",
    "BulkPreview",
    "BulkProgress",
    "BulkStatus",
    "bulk_progress",
    "preview_bulk",
    "run_bulk",
    "start_bulk",
    "stop_bulk",
]
