"""The database side of maps: chunks of element slots, claims, settles, counters, the fan-in.

A map's source is stored as chunks (``MapChunk``: a run of consecutive items). A task claims a
chunk, not its slots: the chunk row takes the claim token and the lease, which the process's
heartbeat extends while the task works; a chunk whose lease lapsed (its worker died) is claimed
again by another task. The settle writes the chunk's element slots (``MapResult``) with their
outcomes, their first write, only while the task still holds the chunk, counts them in the
task's tally (PostgreSQL; the generic store moves the map's counters) and claims the task's
next chunk, in one statement that commits on its own. Tallies are folded into the map's
counters under its row's lock now and then (:func:`fold`). A task that finds every chunk
settled after its settle (checked against the chunks left) marks the map collected and wakes
its run, so the run is resumed exactly once however often element tasks are delivered. The
summary reads the counters and tallies, never the slots' statuses.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

from django.db import IntegrityError, connections, transaction
from django.db.models import F, Model, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..conf import reactor_settings
from ..models import Dispatch, Execution, MapChunk, MapResult, MapRun, MapTally
from ..states import ElementStatus, ExecutionStatus, MapStatus
from .db import using
from .dialects import dialect
from .lease import Kept
from .map_orm import write_slots
from .map_reads import FAILURE_SAMPLE as FAILURE_SAMPLE
from .map_reads import TRACEBACK_FRAMES as TRACEBACK_FRAMES
from .map_reads import ChunkClaim as ChunkClaim
from .map_reads import Claimed as Claimed
from .map_reads import Progress as Progress
from .map_reads import Settled as Settled
from .map_reads import SlotWrite as SlotWrite
from .map_reads import add_tallies as add_tallies
from .map_reads import count as count
from .map_reads import maps_of as maps_of
from .map_reads import missing_indices as missing_indices
from .map_reads import page as page
from .map_reads import rollback_errors as rollback_errors
from .map_reads import running_chunks as running_chunks
from .map_reads import slot as slot
from .map_reads import summary as summary
from .outbox import QueuedDispatch, publish_on_commit, queue_dispatch

M = TypeVar("M", bound=Model)

MATERIALISE_BATCH = 1000
Chunk = MapChunk.Status


def find(execution_id: uuid.UUID, step: str) -> MapRun | None:
    return MapRun.objects.using(using()).filter(execution_id=execution_id, step=step).first()


def get(map_id: uuid.UUID | str) -> MapRun | None:
    """The map with its execution; None when there is none (or ``map_id`` is no UUID)."""
    try:
        key = map_id if isinstance(map_id, uuid.UUID) else uuid.UUID(str(map_id))
    except ValueError:
        return None
    return MapRun.objects.using(using()).select_related("execution").filter(pk=key).first()


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
        with transaction.atomic(using=using()):
            return MapRun.objects.using(using()).create(
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
    MapRun.objects.using(using()).filter(pk=map_id, status=MapStatus.MATERIALISING).delete()


def write_items(map_id: uuid.UUID, first: int, items: Sequence[Any], *, chunk_size: int) -> None:
    """Store a batch of source items in the map's pending chunks of ``chunk_size`` elements
    (the map's own, as ``start`` returned it; a re-read overwrites them). No element slot is
    written: a chunk's settle writes them."""
    dialect().write_chunks(map_id, _pieces(first, items, max(1, chunk_size)))


def _pieces(first: int, items: Sequence[Any], chunk_size: int) -> list[tuple[int, int, list[Any]]]:
    """``items`` (from index ``first``) cut at chunk boundaries: ``(chunk's first index, its
    size up to the piece's end, the piece)``."""
    pieces = []
    at = 0
    while at < len(items):
        index = first + at
        start = index - index % chunk_size
        end = min(len(items), at + start + chunk_size - index)
        pieces.append((start, index - start + end - at, list(items[at:end])))
        at = end
    return pieces


def ready(map_id: uuid.UUID, size: int, max_failures: int | None) -> MapRun:
    """Every item is stored: the map runs, with its element tasks queued (fan-out)."""
    with transaction.atomic(using=using()):
        run = MapRun.objects.using(using()).select_for_update().get(pk=map_id)
        # A re-read that found fewer items: chunks (and slots) past the end go.
        MapChunk.objects.using(using()).filter(map_run_id=map_id, first__gte=size).delete()
        MapResult.objects.using(using()).filter(map_run_id=map_id, index__gte=size).delete()
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


def claim(map_id: uuid.UUID, *, forward: bool, token: str) -> tuple[ChunkClaim | None, bool]:
    """Take a chunk: the lowest one never claimed (to run), or the highest settled one with
    succeeded elements (to undo); a chunk whose holder's lease lapsed (its worker died) is
    taken again. Chunks another live task holds are skipped. The map's unsent dispatches are
    marked sent in the same statement (this task took their work). Also says whether the map
    has stopped (no chunk is left unclaimed then: a stopped map only hands out lapsed chunks,
    to settle them)."""
    with transaction.atomic(using=using()):
        stopped = forward and stopped_map(map_id)
        return dialect().claim_chunk(map_id, forward=forward, token=token), stopped


class SlotKeeper(Kept):
    """Keeps extending the leases of the chunks one task holds, from the process's heartbeat
    thread (see ``store.LeaseKeeper``), so no other task takes elements that are still
    running or being undone, however long they take. Stops when none is left."""

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
            MapChunk.objects.using(using())
            .filter(
                map_run_id=self.map_id,
                claimed_by=self.token,
                status__in=[Chunk.RUNNING, Chunk.UNDOING],
            )
            .update(lease_until=timezone.now() + dt.timedelta(seconds=self.lease_seconds))
        )


def give_back(map_id: uuid.UUID, token: str, *, forward: bool) -> int:
    """Return the chunk ``token`` claimed but will not run (or undo) to the pool at once,
    instead of when its lease lapses: a claim whose reply a broken connection lost."""
    taken, fresh = (Chunk.RUNNING, Chunk.PENDING) if forward else (Chunk.UNDOING, Chunk.SETTLED)
    return (
        MapChunk.objects.using(using())
        .filter(map_run_id=map_id, claimed_by=token, status=taken)
        .update(
            status=fresh,
            lease_until=None,
            claimed_by="",
            attempts=F("attempts") - (1 if forward else 0),
        )
    )


def stopped_map(map_id: uuid.UUID) -> bool:
    return MapRun.objects.using(using()).filter(pk=map_id).exclude(stop_reason="").exists()


def settle(
    map_id: uuid.UUID,
    chunk: int,
    writes: Sequence[SlotWrite],
    *,
    tolerated: int | None,
    token: str,
    claim_next: bool = False,
    retaken: bool = True,
) -> tuple[Progress, tuple[ChunkClaim | None, bool]]:
    """Store a chunk's outcomes; stop the map past its failure policy; fan in when all settled.

    ``retaken``: the chunk was claimed before the writer's claim (its holder died), so some of
    its slots may be written; False (the chunk's first claim, :attr:`ChunkClaim.retaken`) lets
    PostgreSQL insert them plainly.

    Only a chunk the writer still holds is written: a chunk another task took over (its lease
    lapsed) is settled by that task, never twice. With ``claim_next``, the task's next chunk
    is claimed in the same statement. On PostgreSQL that statement is the settle's one round
    trip and its own commit; stopping the map and the fan-in follow in a transaction of their
    own when the counters it returns call for them (a crash in between is made good by the
    next settle, or by the next task that finds nothing to claim: :func:`finish_if_settled`).
    """
    now = timezone.now()
    counts = _counts(writes)
    failed = sorted(w.index for w in writes if w.status == ElementStatus.FAILED)
    counters = {
        "settled": len(writes),
        "succeeded": counts.get(ElementStatus.SUCCEEDED, 0),
        "failed": len(failed),
        "halted": counts.get(ElementStatus.HALTED, 0),
        "not_started": counts.get(ElementStatus.NOT_STARTED, 0),
    }
    # The first failure stored (the lowest index of its chunk) names the map's error.
    first_failure = failed[0] if failed else None
    row, following = dialect().settle_forward(
        map_id, chunk, writes, token, counters, first_failure, now, claim_next, retaken
    )
    if row is None:  # the chunk was taken over: this task wrote nothing
        current = MapRun.objects.using(using()).values("failed", "stop_reason").get(pk=map_id)
        progress = Progress(current["failed"], current["stop_reason"], written=False)
    else:
        stop_reason = row.stop_reason
        # Judged on the map's totals, so a settle that crossed the line and died before it
        # stopped the map is made good by the next one.
        if not stop_reason and past_failure_line(row.failed, row.halted, tolerated):
            stop_reason = stop(map_id, "halted" if row.halted else "failed").stop_reason
        elif (
            row.status == MapStatus.RUNNING
            and not row.collected
            and row.size is not None
            and row.settled >= row.size
        ):
            finish_if_settled(map_id)
        progress = Progress(row.failed, stop_reason)
    return progress, (following, bool(progress.stop_reason) if claim_next else False)


def past_failure_line(failed: int, halted: int, tolerated: int | None) -> bool:
    """Whether a map with these totals must stop: an element halted, or more elements failed
    than it tolerates (``tolerated`` None: an atomic map, which tolerates none)."""
    return bool(halted or (failed and (tolerated is None or failed > tolerated)))


def _counts(writes: Sequence[SlotWrite]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for w in writes:
        counts[w.status] = counts.get(w.status, 0) + 1
    return counts


def stop(map_id: uuid.UUID, reason: str) -> MapRun:
    """No new element starts (the run is being cancelled or undone)."""
    with transaction.atomic(using=using()):
        run = _map_locked().get(pk=map_id)
        _fold(map_id)
        if not run.stop_reason:
            _stop_here(map_id, reason, timezone.now())
        if run.status == MapStatus.RUNNING and run.size is not None:
            run.refresh_from_db(using=using())
            _fan_in(map_id, run.settled, run.size)
        run.refresh_from_db(using=using())
    return run


def stop_all(execution_id: uuid.UUID, reason: str) -> None:
    """No new element of any of the run's maps starts (the run was cancelled)."""
    running = MapRun.objects.using(using()).filter(
        execution_id=execution_id, status=MapStatus.RUNNING
    )
    for map_id in running.values_list("id", flat=True):
        stop(map_id, reason)


def abandon_running(map_id: uuid.UUID, message: str) -> None:
    """An inline map whose process died mid-element: the elements of the chunks it held count
    as failed (part of their work may be done, and nothing records how to undo it)."""
    now = timezone.now()
    error = {"kind": "interrupted", "message": message}
    with transaction.atomic(using=using()):
        _map_locked().get(pk=map_id)
        _fold(map_id)
        run = MapRun.objects.using(using()).get(pk=map_id)
        count = 0
        held = MapChunk.objects.using(using()).filter(map_run_id=map_id, status=Chunk.RUNNING)
        for chunk in held:
            write_slots(map_id, chunk, ElementStatus.FAILED, now, error=error)
            count += chunk.size
        held.update(status=Chunk.SETTLED, claimed_by="", lease_until=None, succeeded=0)
        MapRun.objects.using(using()).filter(pk=map_id).update(
            settled=F("settled") + count, failed=F("failed") + count, updated_at=now
        )
        if run.size is not None:
            _fan_in(map_id, run.settled + count, run.size)


def _stop_here(map_id: uuid.UUID, reason: str, now: dt.datetime) -> int:
    """Record why the map stopped (the caller holds the map's row) and settle every chunk
    never claimed as ``not_started``; return how many elements that settled."""
    never = dialect().never_start(map_id, now)
    MapRun.objects.using(using()).filter(pk=map_id).update(
        stop_reason=reason,
        settled=F("settled") + never,
        not_started=F("not_started") + never,
        updated_at=now,
    )
    return never


def _fan_in(map_id: uuid.UUID, settled: int, size: int) -> None:
    """Mark the map collected, once, when no chunk is left unsettled; wake its run. The
    collected flag is set by a conditional update, so however many settles (or tasks that
    found nothing to claim) get here, one does it, with its wake-up in the same transaction."""
    if settled < size:
        return
    unsettled = (
        MapChunk.objects.using(using())
        .filter(map_run_id=map_id, status__in=[Chunk.PENDING, Chunk.RUNNING])
        .exists()
    )
    if unsettled:
        return
    updated = (
        MapRun.objects.using(using())
        .filter(pk=map_id, collected=False, status=MapStatus.RUNNING)
        .update(collected=True, status=MapStatus.SETTLED, updated_at=timezone.now())
    )
    row = MapRun.objects.using(using()).values("fan_out", "execution_id").get(pk=map_id)
    if updated and row["fan_out"]:
        wake_run(row["execution_id"])


def finish_if_settled(map_id: uuid.UUID) -> None:
    """Fan the map in if every element has settled (see :func:`settle`); safe at any time.

    The tallies are folded first, and a map whose totals are past its failure line (settles
    that crossed it together, each counting the other's failures before they committed) is
    stopped instead: the stop fans it in."""
    with transaction.atomic(using=using()):
        run = _map_locked().filter(pk=map_id).first()
        if run is None or run.status != MapStatus.RUNNING or run.collected:
            return
        if _fold(map_id):
            run.refresh_from_db(using=using())
        tolerated = None if run.atomic else run.max_failures
        if not run.stop_reason and past_failure_line(run.failed, run.halted, tolerated):
            stop(map_id, "halted" if run.halted else "failed")
        elif run.size is not None:
            _fan_in(map_id, run.settled, run.size)


def fold(map_id: uuid.UUID, token: str) -> None:
    """Add the tally of task ``token`` to the map's counters (a running map's counters lag
    its settles by the time since the last fold). Only that task writes its tally, and it is
    the caller: nothing waits but for the map's row."""
    with transaction.atomic(using=using()):
        _map_locked().filter(pk=map_id).first()
        _fold(map_id, token)


def _map_locked() -> QuerySet[MapRun]:
    """Maps locked to fold their tallies: ``FOR NO KEY UPDATE`` where the database has it, so
    that a settle inserting a tally row (its foreign key takes a key-share lock on the map's
    row) does not wait for the fold while the fold waits for that settle's tally: a deadlock."""
    maps = MapRun.objects.using(using())
    return maps.select_for_update(no_key=connections[using()].features.has_select_for_no_key_update)


def _fold(map_id: uuid.UUID, token: str | None = None) -> bool:
    """Move the map's tallies (or task ``token``'s) into its counters (the caller holds the
    map's row); whether there were any. A settle racing with this waits for the tally's row
    lock, then finds its row gone and starts a new one: nothing is counted twice or lost."""
    locked = MapTally.objects.using(using()).select_for_update().filter(map_run_id=map_id)
    tallies = list(locked if token is None else locked.filter(token=token))
    if not tallies:
        return False
    MapTally.objects.using(using()).filter(pk__in=[t.pk for t in tallies]).delete()
    failures = [t.first_failure for t in tallies if t.first_failure is not None]
    run = MapRun.objects.using(using()).filter(pk=map_id)
    fields = ("settled", "succeeded", "failed", "halted", "not_started")
    changes: dict[str, Any] = {
        name: F(name) + sum(getattr(t, name) for t in tallies) for name in fields
    }
    if failures:
        changes["first_failure"] = Coalesce(F("first_failure"), min(failures))
    run.update(**changes, updated_at=timezone.now())
    return True


def start_rollback(map_id: uuid.UUID, tasks: int) -> MapRun:
    """Begin undoing the succeeded elements (once; a second call finds it started)."""
    with transaction.atomic(using=using()):
        run = MapRun.objects.using(using()).select_for_update().get(pk=map_id)
        if run.status in (MapStatus.ROLLING_BACK, MapStatus.ROLLED_BACK):
            return run
        # Counted, not taken from the counters: a slot deleted by hand has nothing to undo.
        run.rollback_total = (
            MapResult.objects.using(using())
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
    map_id: uuid.UUID,
    chunk: int,
    writes: Sequence[SlotWrite],
    *,
    token: str,
    claim_next: bool = False,
) -> tuple[Progress, tuple[ChunkClaim | None, bool]]:
    """Store what undoing a chunk's elements did; when none is left to undo, wake the run
    (fan-out). With ``claim_next``, the task's next chunk is claimed afterwards."""
    counts = _counts(writes)
    counters = {
        "rollback_settled": len(writes),
        "undone": counts.get(ElementStatus.UNDONE, 0),
        "undo_failed": counts.get(ElementStatus.UNDO_FAILED, 0),
    }
    row = dialect().settle_undo(map_id, chunk, writes, token, counters, timezone.now())
    if (
        row is not None
        and row.status == MapStatus.ROLLING_BACK
        and row.rollback_settled >= row.rollback_total
    ):
        finish_if_undone(map_id)
    following = claim(map_id, forward=False, token=token) if claim_next else (None, False)
    return Progress(0, "", written=row is not None), following


def finish_if_undone(map_id: uuid.UUID) -> None:
    """Mark a map rolled back, once, when no chunk is left to undo, and wake its run (fan-out).
    Safe to call at any time (a task that finds nothing to undo
    calls it: the settle that undid the last chunk may have died before it did)."""
    with transaction.atomic(using=using()):
        left = MapChunk.objects.using(using()).filter(map_run_id=map_id)
        if left.filter(status=Chunk.UNDOING).exists():
            return
        if left.filter(status=Chunk.SETTLED, succeeded__gt=0).exists():
            return
        updated = (
            MapRun.objects.using(using())
            .filter(pk=map_id, status=MapStatus.ROLLING_BACK)
            .update(status=MapStatus.ROLLED_BACK, updated_at=timezone.now())
        )
        if updated:
            mine = MapRun.objects.using(using()).values("fan_out", "execution_id").get(pk=map_id)
            if mine["fan_out"]:
                wake_run(mine["execution_id"])


def mark_all_undone(map_id: uuid.UUID, error: list[dict[str, Any]] | None) -> None:
    """``undo_all`` ran once for every succeeded element (``error``: its rollback failure, in
    the list form every failed undo is stored in)."""
    status = ElementStatus.UNDO_FAILED if error else ElementStatus.UNDONE
    with transaction.atomic(using=using()):
        run = MapRun.objects.using(using()).select_for_update().get(pk=map_id)
        count = (
            MapResult.objects.using(using())
            .filter(map_run_id=map_id, status=ElementStatus.SUCCEEDED)
            .update(status=status, rollback_error=error, finished_at=timezone.now())
        )
        MapChunk.objects.using(using()).filter(map_run_id=map_id, status=Chunk.SETTLED).update(
            status=Chunk.UNDONE
        )
        run.rollback_total = run.rollback_settled = count
        if error:
            run.undo_failed += count
        else:
            run.undone += count
        run.status = MapStatus.ROLLED_BACK
        run.save(
            update_fields=[
                "rollback_total",
                "rollback_settled",
                "undone",
                "undo_failed",
                "status",
                "updated_at",
            ]
        )


def wake_run(execution_id: uuid.UUID) -> None:
    """Queue the task that resumes the run waiting for a map (climbing to the run a worker
    resumes, for a composed child). A run still working (its lease held) is not woken: it
    checks the map itself right after it parks."""
    row = (
        Execution.objects.using(using())
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
    Execution.objects.using(using()).filter(pk=execution_id).update(wake_at=None)
    queue_dispatch(execution_id, Dispatch.Reason.WAKE)


def redispatch_stalled(*, after: float, limit: int) -> int:
    """Queue element (or undo) tasks again for fanned-out maps that stopped moving: their
    tasks were lost, or their worker died holding slots whose lease has since lapsed."""
    now = timezone.now()
    queued = 0
    with transaction.atomic(using=using()):
        runs = list(
            _locked(
                MapRun.objects.using(using()).filter(
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
            MapRun.objects.using(using()).filter(pk=run.pk).update(updated_at=now)
            queued += 1
    return queued


def hand_over(map_id: uuid.UUID, *, forward: bool) -> None:
    """A task used its time budget: queue a fresh one to go on (other work gets a turn)."""
    run = MapRun.objects.using(using()).get(pk=map_id)
    with transaction.atomic(using=using()):
        _queue(run, Dispatch.Reason.MAP if forward else Dispatch.Reason.MAP_UNDO, 1)


def tasks_for(run: MapRun) -> int:
    """Element tasks to keep in flight: batch_size elements, chunk_size per task."""
    pending = run.size or 0
    return max(1, min(pending, run.batch_size) // max(1, run.chunk_size))


def _queue(run: MapRun, reason: str, tasks: int) -> None:
    rows = Dispatch.objects.using(using()).bulk_create(
        [Dispatch(execution_id=run.execution_id, reason=reason, map_run=run) for _ in range(tasks)]
    )
    publish_on_commit(
        [QueuedDispatch(row.id, run.execution_id, task=reason, map_id=run.pk) for row in rows]
    )


def _locked(qs: QuerySet[M]) -> QuerySet[M]:
    if connections[using()].features.has_select_for_update_skip_locked:
        return qs.select_for_update(skip_locked=True)
    return qs
