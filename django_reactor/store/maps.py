"""The database side of maps: element slots, claims, settles, counters and the fan-in.

Every settle locks the map's row, writes its elements' slots and moves the counters in one
transaction; the settle that brings ``settled`` to ``size`` (checked against a count of the
slots) marks the map collected and wakes its run, so the run is resumed exactly once however
often element tasks are delivered.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from ..conf import reactor_settings
from ..models import Dispatch, Execution, MapResult, MapRun
from ..states import ElementStatus, ExecutionStatus, MapStatus
from . import sql
from .db import USING
from .lease import Kept
from .outbox import QueuedDispatch, publish_on_commit, queue_dispatch

UNSETTLED = (ElementStatus.PENDING, ElementStatus.RUNNING)
FAILURE_SAMPLE = 25
TRACEBACK_FRAMES = 10
MATERIALISE_BATCH = 1000


@dataclass(frozen=True, slots=True)
class Claimed:
    """An element slot a task took: run it (forward) or undo it (rollback)."""

    id: int
    index: int
    item: Any
    undo: Any = None
    # Claims before this one: more than zero means a process died holding the slot.
    attempts: int = 0


@dataclass(slots=True)
class SlotWrite:
    """What one element's settle writes to its slot."""

    id: int
    index: int
    status: str
    value: Any = None
    # An ErrorInfo dict (forward), or the RollbackFailure dicts of a failed undo.
    error: dict[str, Any] | list[dict[str, Any]] | None = None
    undo: Any = None


def find(execution_id: uuid.UUID, step: str) -> MapRun | None:
    return MapRun.objects.using(USING).filter(execution_id=execution_id, step=step).first()


def get(map_id: uuid.UUID | str) -> MapRun | None:
    """The map with its execution; None when there is none (or ``map_id`` is no UUID)."""
    try:
        key = map_id if isinstance(map_id, uuid.UUID) else uuid.UUID(str(map_id))
    except ValueError:
        return None
    return MapRun.objects.using(USING).select_related("execution").filter(pk=key).first()


def start(
    execution_id: uuid.UUID,
    step: str,
    *,
    fan_out: bool,
    batch_size: int,
    chunk_size: int,
    atomic: bool,
    shared: Any,
    source_model: str,
) -> MapRun:
    """The map's row, created on first reach (a crash mid-read finds it and reads again)."""
    existing = find(execution_id, step)
    if existing is not None:
        return existing
    try:
        with transaction.atomic(using=USING):
            return MapRun.objects.using(USING).create(
                execution_id=execution_id,
                step=step,
                fan_out=fan_out,
                batch_size=batch_size,
                chunk_size=chunk_size,
                atomic=atomic,
                shared=shared,
                source_model=source_model,
            )
    except IntegrityError:
        found = find(execution_id, step)
        assert found is not None
        return found


def discard(map_id: uuid.UUID) -> None:
    """Forget a map whose source could not be read (its elements never ran)."""
    MapRun.objects.using(USING).filter(pk=map_id, status=MapStatus.MATERIALISING).delete()


def write_items(map_id: uuid.UUID, first: int, items: Sequence[Any]) -> None:
    """Store a batch of source items as pending slots (a re-read overwrites them)."""
    connection = connections[USING]
    if connection.vendor == "postgresql":
        # One statement per batch: the ORM's bulk_create costs ten times more here.
        with connection.cursor() as cursor:
            cursor.execute(
                sql.WRITE_ITEMS,
                [
                    map_id,
                    list(range(first, first + len(items))),
                    [_json(item) if item is not None else "null" for item in items],
                ],
            )
        return
    rows = [
        MapResult(map_run_id=map_id, index=first + offset, item=item)
        for offset, item in enumerate(items)
    ]
    MapResult.objects.using(USING).bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["map_run", "index"],
        update_fields=["item", "status"],
    )


def ready(map_id: uuid.UUID, size: int, max_failures: int | None) -> MapRun:
    """Every item is stored: the map runs, with its element tasks queued (fan-out)."""
    with transaction.atomic(using=USING):
        run = MapRun.objects.using(USING).select_for_update().get(pk=map_id)
        MapResult.objects.using(USING).filter(map_run_id=map_id, index__gte=size).delete()
        run.size = size
        run.max_failures = max_failures
        run.status = MapStatus.RUNNING
        if size == 0:
            run.status = MapStatus.SETTLED
            run.collected = True
        run.save(update_fields=["size", "max_failures", "status", "collected", "updated_at"])
        if run.fan_out and size:
            _queue(run, Dispatch.Reason.MAP, tasks_for(run))
    return run


def claim(
    map_id: uuid.UUID, limit: int, *, forward: bool, token: str
) -> tuple[list[Claimed], bool]:
    """Take up to ``limit`` slots: pending ones (lowest index first) to run, or succeeded ones
    (highest index first) to undo. Slots another live task holds are skipped; a slot whose
    lease lapsed (its worker died) is taken again. Also says whether the map has stopped (no
    pending slot is left then: a stopped map only hands out lapsed slots, to settle them)."""
    with transaction.atomic(using=USING):
        return _claim(map_id, limit, forward=forward, token=token)


def _claim(
    map_id: uuid.UUID, limit: int, *, forward: bool, token: str, stopped: bool | None = None
) -> tuple[list[Claimed], bool]:
    """``claim`` inside the caller's transaction; ``stopped``: the map's stop, when known."""
    now = timezone.now()
    lease = dt.timedelta(seconds=reactor_settings.LEASE_SECONDS)
    if forward:
        fresh, lapsed = ElementStatus.PENDING, ElementStatus.RUNNING
        order, taken = "index", ElementStatus.RUNNING
    else:
        fresh, lapsed = ElementStatus.SUCCEEDED, ElementStatus.UNDOING
        order, taken = "-index", ElementStatus.UNDOING
    slots = MapResult.objects.using(USING).filter(map_run_id=map_id)
    columns = ("id", "index", "item", "undo", "attempts")
    if stopped is None:
        stopped = forward and stopped_map(map_id)
    # Two queries, each served by the (map, status, index) index: slots never claimed, then
    # slots whose holder's lease lapsed (its process died).
    rows = list(_locked(slots.filter(status=fresh)).order_by(order).values_list(*columns)[:limit])
    if len(rows) < limit:
        rows += list(
            _locked(slots.filter(status=lapsed, lease_until__lt=now))
            .order_by(order)
            .values_list(*columns)[: limit - len(rows)]
        )
    if rows:
        MapResult.objects.using(USING).filter(id__in=[r[0] for r in rows]).update(
            status=taken, lease_until=now + lease, attempts=_plus_one(), claimed_by=token
        )
    return [Claimed(*row) for row in rows], stopped


class SlotKeeper(Kept):
    """Keeps extending the leases of the slots one task holds, from the process's heartbeat
    thread (see ``store.LeaseKeeper``), so no other task takes an element that is still
    running or being undone, however long it takes. Stops when none is left."""

    def __init__(self, map_id: uuid.UUID, token: str) -> None:
        self.map_id = map_id
        self.token = token
        self.lease_seconds = reactor_settings.LEASE_SECONDS
        super().__init__()

    @property
    def label(self) -> str:
        return f"the elements of map {self.map_id} held by {self.token}"

    def extend(self) -> bool:
        return bool(
            MapResult.objects.using(USING)
            .filter(
                map_run_id=self.map_id,
                claimed_by=self.token,
                status__in=[ElementStatus.RUNNING, ElementStatus.UNDOING],
            )
            .update(lease_until=timezone.now() + dt.timedelta(seconds=self.lease_seconds))
        )


def give_back(map_id: uuid.UUID, token: str, *, forward: bool) -> int:
    """Return the slots ``token`` claimed but will not run (or undo) to the pool at once,
    instead of when their lease lapses: a claim whose reply a broken connection lost."""
    taken, fresh = (
        (ElementStatus.RUNNING, ElementStatus.PENDING)
        if forward
        else (ElementStatus.UNDOING, ElementStatus.SUCCEEDED)
    )
    return (
        MapResult.objects.using(USING)
        .filter(map_run_id=map_id, claimed_by=token, status=taken)
        .update(status=fresh, lease_until=None, claimed_by="", attempts=F("attempts") - 1)
    )


def stopped_map(map_id: uuid.UUID) -> bool:
    return MapRun.objects.using(USING).filter(pk=map_id).exclude(stop_reason="").exists()


def settle(
    map_id: uuid.UUID,
    writes: Sequence[SlotWrite],
    *,
    tolerated: int | None,
    token: str,
    claim_next: int = 0,
) -> tuple[MapRun, tuple[list[Claimed], bool]]:
    """Store element outcomes; stop the map past its failure policy; fan in when all settled.

    Only slots the writer still holds are written: a slot another task took over (its lease
    lapsed) is settled by that task, never twice. With ``claim_next``, the task's next chunk
    is claimed in the same transaction (one commit per chunk).
    """
    now = timezone.now()
    with transaction.atomic(using=USING):
        # The slots first (row locks on this task's own slots only), then the map's row: the
        # lock every settle of the map waits for is held for the counters alone.
        fresh = _write_slots(writes, token, UNSETTLED, forward=True, now=now)
        run = MapRun.objects.using(USING).select_for_update().get(pk=map_id)
        fields = {"settled", "succeeded", "failed", "updated_at"}
        run.settled += len(fresh)
        run.succeeded += sum(w.status == ElementStatus.SUCCEEDED for w in fresh)
        failed = sorted(w.index for w in fresh if w.status == ElementStatus.FAILED)
        run.failed += len(failed)
        if failed and run.first_failure is None:
            # The first failure stored (the lowest index of its chunk) names the map's error.
            run.first_failure = failed[0]
            fields.add("first_failure")
        if not run.stop_reason:
            if any(w.status == ElementStatus.HALTED for w in fresh):
                run.stop_reason = "halted"
            elif failed and (tolerated is None or run.failed > tolerated):
                run.stop_reason = "failed"
            if run.stop_reason:
                fields.add("stop_reason")
                run.settled += _never_start(map_id, now)
        _fan_in(run, fields)
        run.save(update_fields=sorted(fields))
        following = (
            _claim(map_id, claim_next, forward=True, token=token, stopped=bool(run.stop_reason))
            if claim_next
            else ([], False)
        )
    return run, following


def _write_slots(
    writes: Sequence[SlotWrite],
    token: str,
    unsettled: Sequence[str],
    *,
    forward: bool,
    now: dt.datetime,
) -> list[SlotWrite]:
    """Write the slots this task still holds and has not settled; return those written.

    One statement on PostgreSQL (an UPDATE from arrays); the ORM elsewhere.
    """
    if not writes:
        return []
    connection = connections[USING]
    if connection.vendor != "postgresql":
        current = dict(
            MapResult.objects.using(USING)
            .filter(id__in=[w.id for w in writes], claimed_by=token)
            .values_list("id", "status")
        )
        fresh = [w for w in writes if current.get(w.id) in unsettled]
        for w in fresh:
            values: dict[str, Any] = {"status": w.status, "lease_until": None, "finished_at": now}
            if forward:
                values.update(value=w.value, error=w.error, undo=w.undo)
            else:
                values["rollback_error"] = w.error
            MapResult.objects.using(USING).filter(id=w.id).update(**values)
        return fresh
    if forward:
        columns = "value = v.a::jsonb, error = v.b::jsonb, undo = v.c::jsonb"
        triples = [(w.value, w.error, w.undo) for w in writes]
    else:
        columns = "rollback_error = v.a::jsonb"
        triples = [(w.error, None, None) for w in writes]
    statement = sql.WRITE_SLOTS.format(columns=columns)
    params: list[Any] = [
        now,
        [w.id for w in writes],
        [w.status for w in writes],
        *([_json(t[i]) for t in triples] for i in range(3)),
        token,
        list(unsettled),
    ]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        written = {row[0] for row in cursor.fetchall()}
    return [w for w in writes if w.id in written]


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def stop(map_id: uuid.UUID, reason: str) -> MapRun:
    """No new element starts (the run is being cancelled or undone)."""
    with transaction.atomic(using=USING):
        run = MapRun.objects.using(USING).select_for_update().get(pk=map_id)
        fields = {"updated_at"}
        if not run.stop_reason:
            run.stop_reason = reason
            run.settled += _never_start(map_id, timezone.now())
            fields |= {"stop_reason", "settled"}
        if run.status == MapStatus.RUNNING:
            _fan_in(run, fields)
        run.save(update_fields=sorted(fields))
    return run


def stop_all(execution_id: uuid.UUID, reason: str) -> None:
    """No new element of any of the run's maps starts (the run was cancelled)."""
    running = MapRun.objects.using(USING).filter(
        execution_id=execution_id, status=MapStatus.RUNNING
    )
    for map_id in running.values_list("id", flat=True):
        stop(map_id, reason)


def abandon_running(map_id: uuid.UUID, message: str) -> None:
    """An inline map whose process died mid-element: those elements count as failed."""
    with transaction.atomic(using=USING):
        run = MapRun.objects.using(USING).select_for_update().get(pk=map_id)
        count = (
            MapResult.objects.using(USING)
            .filter(map_run_id=map_id, status=ElementStatus.RUNNING)
            .update(
                status=ElementStatus.FAILED,
                error={"kind": "interrupted", "message": message},
                finished_at=timezone.now(),
                lease_until=None,
            )
        )
        run.settled += count
        run.failed += count
        fields = {"settled", "failed", "updated_at"}
        _fan_in(run, fields)
        run.save(update_fields=sorted(fields))


def _never_start(map_id: uuid.UUID, now: dt.datetime) -> int:
    return (
        MapResult.objects.using(USING)
        .filter(map_run_id=map_id, status=ElementStatus.PENDING)
        .update(status=ElementStatus.NOT_STARTED, finished_at=now)
    )


def _fan_in(run: MapRun, fields: set[str]) -> None:
    """Mark the map collected, once, when no slot is left unsettled; wake its run."""
    if run.collected or run.size is None or run.settled < run.size:
        return
    unsettled = (
        MapResult.objects.using(USING).filter(map_run_id=run.pk, status__in=UNSETTLED).exists()
    )
    if unsettled:
        return
    run.collected = True
    run.status = MapStatus.SETTLED
    fields |= {"collected", "status"}
    if run.fan_out:
        wake_run(run.execution_id)


def start_rollback(map_id: uuid.UUID, tasks: int) -> MapRun:
    """Begin undoing the succeeded elements (once; a second call finds it started)."""
    with transaction.atomic(using=USING):
        run = MapRun.objects.using(USING).select_for_update().get(pk=map_id)
        if run.status in (MapStatus.ROLLING_BACK, MapStatus.ROLLED_BACK):
            return run
        run.rollback_total = (
            MapResult.objects.using(USING)
            .filter(map_run_id=map_id, status=ElementStatus.SUCCEEDED)
            .count()
        )
        run.rollback_settled = 0
        run.status = MapStatus.ROLLING_BACK if run.rollback_total else MapStatus.ROLLED_BACK
        run.save(update_fields=["rollback_total", "rollback_settled", "status", "updated_at"])
        if run.fan_out and run.rollback_total:
            _queue(run, Dispatch.Reason.MAP_UNDO, tasks)
    return run


def settle_rollback(
    map_id: uuid.UUID, writes: Sequence[SlotWrite], *, token: str, claim_next: int = 0
) -> tuple[MapRun, tuple[list[Claimed], bool]]:
    """Store what undoing elements did; when none is left to undo, wake the run (fan-out).

    With ``claim_next``, the task's next chunk is claimed in the same transaction."""
    now = timezone.now()
    with transaction.atomic(using=USING):
        fresh = _write_slots(writes, token, (ElementStatus.UNDOING,), forward=False, now=now)
        run = MapRun.objects.using(USING).select_for_update().get(pk=map_id)
        run.rollback_settled += len(fresh)
        fields = {"rollback_settled", "updated_at"}
        if run.status == MapStatus.ROLLING_BACK and run.rollback_settled >= run.rollback_total:
            left = MapResult.objects.using(USING).filter(
                map_run_id=map_id, status__in=[ElementStatus.SUCCEEDED, ElementStatus.UNDOING]
            )
            if not left.exists():
                run.status = MapStatus.ROLLED_BACK
                fields.add("status")
                if run.fan_out:
                    wake_run(run.execution_id)
        run.save(update_fields=sorted(fields))
        following = (
            _claim(map_id, claim_next, forward=False, token=token) if claim_next else ([], False)
        )
    return run, following


def mark_all_undone(map_id: uuid.UUID, error: list[dict[str, Any]] | None) -> None:
    """``undo_all`` ran once for every succeeded element (``error``: its rollback failure, in
    the list form every failed undo is stored in)."""
    status = ElementStatus.UNDO_FAILED if error else ElementStatus.UNDONE
    with transaction.atomic(using=USING):
        run = MapRun.objects.using(USING).select_for_update().get(pk=map_id)
        count = (
            MapResult.objects.using(USING)
            .filter(map_run_id=map_id, status=ElementStatus.SUCCEEDED)
            .update(status=status, rollback_error=error, finished_at=timezone.now())
        )
        run.rollback_total = run.rollback_settled = count
        run.status = MapStatus.ROLLED_BACK
        run.save(update_fields=["rollback_total", "rollback_settled", "status", "updated_at"])


def rollback_errors(map_id: uuid.UUID) -> Iterator[tuple[int, Any]]:
    """``(index, rollback error)`` of every element whose undo failed, by index."""
    yield from (
        MapResult.objects.using(USING)
        .filter(map_run_id=map_id, status=ElementStatus.UNDO_FAILED)
        .order_by("index")
        .values_list("index", "rollback_error")
        .iterator(chunk_size=500)
    )


def missing_indices(map_id: uuid.UUID, size: int) -> list[int]:
    """Indices below ``size`` that have no slot row (deleted by hand or by other code)."""
    slots = MapResult.objects.using(USING).filter(map_run_id=map_id)
    if slots.count() >= size:
        return []
    present = set(slots.values_list("index", flat=True).iterator(chunk_size=5000))
    return [index for index in range(size) if index not in present]


def slot(map_id: uuid.UUID, index: int) -> MapResult | None:
    return MapResult.objects.using(USING).filter(map_run_id=map_id, index=index).first()


def page(
    map_id: uuid.UUID, *, after: int, limit: int, statuses: Iterable[str] | None = None
) -> list[tuple[int, str, Any, Any]]:
    """Slots after index ``after``, in index order: ``(index, status, value, error)``."""
    qs = MapResult.objects.using(USING).filter(map_run_id=map_id, index__gt=after)
    if statuses is not None:
        qs = qs.filter(status__in=list(statuses))
    return list(qs.order_by("index").values_list("index", "status", "value", "error")[:limit])


def count(map_id: uuid.UUID, statuses: Iterable[str]) -> int:
    return (
        MapResult.objects.using(USING).filter(map_run_id=map_id, status__in=list(statuses)).count()
    )


def summary(map_id: uuid.UUID, run: MapRun | None = None) -> dict[str, Any]:
    """Totals by outcome and a sample of failures, from SQL aggregates (no scan in Python).

    ``run``: the map's row when the caller has it already (saves reading it again).
    """
    if run is not None:
        row: Any = {"size": run.size, "status": run.status, "step": run.step}
    else:
        row = MapRun.objects.using(USING).filter(pk=map_id).values("size", "status", "step").first()
    if row is None:
        return {}
    by = {
        "succeeded": [ElementStatus.SUCCEEDED],
        "failed": [ElementStatus.FAILED],
        "halted": [ElementStatus.HALTED],
        "pending": [ElementStatus.PENDING, ElementStatus.RUNNING],
        "not_started": [ElementStatus.NOT_STARTED],
        "undone": [ElementStatus.UNDONE],
        "undoing": [ElementStatus.UNDOING],
        "undo_failed": [ElementStatus.UNDO_FAILED],
    }
    totals = (
        MapResult.objects.using(USING)
        .filter(map_run_id=map_id)
        .aggregate(
            total=Count("id"),
            **{name: Count("id", filter=Q(status__in=statuses)) for name, statuses in by.items()},
        )
    )
    sample = list(
        MapResult.objects.using(USING)
        .filter(map_run_id=map_id, status=ElementStatus.FAILED)
        .order_by("index")
        .values_list("index", "error")[: FAILURE_SAMPLE + 1]
    )
    truncated = len(sample) > FAILURE_SAMPLE
    return {
        "type": "map_results",
        "map_id": str(map_id),
        "step": row["step"],
        "status": row["status"],
        "size": row["size"],
        **totals,
        # Elements once succeeded stay counted as completed work after they were undone.
        "failures": [_failure_sample(index, error) for index, error in sample[:FAILURE_SAMPLE]],
        "failures_truncated": truncated,
    }


def _failure_sample(index: int, error: Any) -> dict[str, Any]:
    error = error or {}
    frames = [line for line in str(error.get("traceback") or "").splitlines() if line.strip()]
    return {
        "index": index,
        "step": error.get("step"),
        "kind": error.get("kind"),
        "exception_class": error.get("exception_class"),
        "message": error.get("message", ""),
        "traceback": "\n".join(_last_frames(frames)),
    }


def _last_frames(lines: list[str]) -> list[str]:
    """The last ``TRACEBACK_FRAMES`` frames (a frame is its ``File ...`` line and its code)."""
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    if len(starts) <= TRACEBACK_FRAMES:
        return lines
    return [
        "Traceback (most recent call last, earlier frames cut):",
        *lines[starts[-TRACEBACK_FRAMES] :],
    ]


def maps_of(execution_id: uuid.UUID) -> list[MapRun]:
    return list(
        MapRun.objects.using(USING)
        .filter(execution_id=execution_id)
        .defer("shared")
        .order_by("created_at")
    )


def wake_run(execution_id: uuid.UUID) -> None:
    """Queue the task that resumes the run waiting for a map (climbing to the run a worker
    resumes, for a composed child). A run still working (its lease held) is not woken: it
    checks the map itself right after it parks."""
    row = (
        Execution.objects.using(USING)
        .filter(pk=execution_id)
        .values("status", "parent_id", "detached", "lease_owner")
        .first()
    )
    if row is None:
        return
    if row["parent_id"] is not None and not row["detached"]:
        wake_run(row["parent_id"])
        return
    waiting = (ExecutionStatus.PENDING, ExecutionStatus.ROLLING_BACK)
    if row["status"] not in waiting or row["lease_owner"] is not None:
        return
    Execution.objects.using(USING).filter(pk=execution_id).update(wake_at=None)
    queue_dispatch(execution_id, Dispatch.Reason.WAKE)


def redispatch_stalled(*, after: float, limit: int) -> int:
    """Queue element (or undo) tasks again for fanned-out maps that stopped moving: their
    tasks were lost, or their worker died holding slots whose lease has since lapsed."""
    now = timezone.now()
    queued = 0
    with transaction.atomic(using=USING):
        runs = list(
            _locked(
                MapRun.objects.using(USING).filter(
                    fan_out=True,
                    status__in=[MapStatus.RUNNING, MapStatus.ROLLING_BACK],
                    updated_at__lt=now - dt.timedelta(seconds=after),
                )
            ).order_by("updated_at")[:limit]
        )
        for run in runs:
            forward = run.status == MapStatus.RUNNING
            reason = Dispatch.Reason.MAP if forward else Dispatch.Reason.MAP_UNDO
            _queue(run, reason, tasks_for(run))
            MapRun.objects.using(USING).filter(pk=run.pk).update(updated_at=now)
            queued += 1
    return queued


def hand_over(map_id: uuid.UUID, *, forward: bool) -> None:
    """A task used its time budget: queue a fresh one to go on (other work gets a turn)."""
    run = MapRun.objects.using(USING).get(pk=map_id)
    with transaction.atomic(using=USING):
        _queue(run, Dispatch.Reason.MAP if forward else Dispatch.Reason.MAP_UNDO, 1)


def tasks_for(run: MapRun) -> int:
    """Element tasks to keep in flight: batch_size elements, chunk_size per task."""
    pending = run.size or 0
    return max(1, min(pending, run.batch_size) // max(1, run.chunk_size))


def _queue(run: MapRun, reason: str, tasks: int) -> None:
    rows = Dispatch.objects.using(USING).bulk_create(
        [Dispatch(execution_id=run.execution_id, reason=reason, map_run=run) for _ in range(tasks)]
    )
    publish_on_commit(
        [QueuedDispatch(row.id, run.execution_id, task=reason, map_id=run.pk) for row in rows]
    )


def _locked(qs: Any) -> Any:
    if connections[USING].features.has_select_for_update_skip_locked:
        return qs.select_for_update(skip_locked=True)
    return qs


def _plus_one() -> Any:
    return F("attempts") + 1
