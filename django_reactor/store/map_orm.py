"""Map chunks written, claimed and settled through the ORM: the generic store's
(``dialects.Dialect``; PostgreSQL sends one statement each, :mod:`.map_sql`). Same rows, same
fences. Also the slots written for chunks no task will settle, on any database."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

from django.db import connections
from django.db.models import Model, QuerySet
from django.utils import timezone

from ..conf import reactor_settings
from ..models import MapChunk, MapResult, MapRun
from ..states import ElementStatus
from .db import conflict_target, using
from .map_reads import ChunkClaim, Claimed, Settled, SlotWrite
from .outbox import mark_taken

M = TypeVar("M", bound=Model)

Chunk = MapChunk.Status


def write_chunks(map_id: uuid.UUID, pieces: list[tuple[int, int, list[Any]]]) -> None:
    """``maps.write_items``'s pieces (``(first index, size, items)``) as pending chunks; a
    piece that starts inside a chunk keeps the chunk's items before it."""
    for start, size, piece in pieces:
        chunk, created = MapChunk.objects.using(using()).get_or_create(
            map_run_id=map_id, first=start, defaults={"size": size, "items": piece}
        )
        if not created:
            chunk.items = [*chunk.items[: size - len(piece)], *piece]
            chunk.size = size
            chunk.status = Chunk.PENDING
            chunk.save(update_fields=["items", "size", "status"])


def lock_map(map_id: uuid.UUID) -> MapRun:
    """Lock the map's row, first thing in a transaction that writes its chunks or slots.

    On MariaDB and MySQL, writing a chunk or a slot takes a shared lock on the map's row
    (their foreign key's check), and a settle then asks for the exclusive one to count: two
    transactions holding the shared lock would deadlock. Taken first, they take turns."""
    return MapRun.objects.using(using()).select_for_update().get(pk=map_id)


def claim(map_id: uuid.UUID, *, forward: bool, token: str) -> ChunkClaim | None:
    """``maps.claim`` through the ORM, in the caller's transaction."""
    lock_map(map_id)
    now = timezone.now()
    fresh, taken = (Chunk.PENDING, Chunk.RUNNING) if forward else (Chunk.SETTLED, Chunk.UNDOING)
    order = "first" if forward else "-first"
    chunks = MapChunk.objects.using(using()).filter(map_run_id=map_id)
    candidates = chunks.filter(status=fresh)
    if not forward:
        candidates = candidates.filter(succeeded__gt=0)
    chunk = _locked(candidates).order_by(order).first()
    if chunk is None:
        chunk = _locked(chunks.filter(status=taken, lease_until__lt=now)).order_by(order).first()
    mark_taken(map_id=map_id)
    if chunk is None:
        return None
    chunk.status = taken
    chunk.claimed_by = token
    chunk.lease_until = now + dt.timedelta(seconds=reactor_settings.LEASE_SECONDS)
    chunk.attempts += 1 if forward else 0
    chunk.save(update_fields=["status", "claimed_by", "lease_until", "attempts"])
    if not forward:
        rows = (
            MapResult.objects.using(using())
            .filter(
                map_run_id=map_id,
                index__gte=chunk.first,
                index__lt=chunk.first + chunk.size,
                status=ElementStatus.SUCCEEDED,
            )
            .order_by("-index")
            .values_list("index", "item", "undo")
        )
        return ChunkClaim(chunk.pk, [Claimed(index, item, undo) for index, item, undo in rows])
    return ChunkClaim(
        chunk.pk,
        [
            Claimed(chunk.first + offset, item, None, chunk.attempts - 1)
            for offset, item in enumerate(chunk.items)
        ],
    )


def settle_chunk(
    map_id: uuid.UUID,
    chunk: int,
    writes: Sequence[SlotWrite],
    token: str,
    held: str,
    settled: str,
    counters: dict[str, int],
    first_failure: int | None,
    now: dt.datetime,
) -> Settled | None:
    """A chunk's settle (``sql.SETTLE_FORWARD`` / ``sql.SETTLE_UNDO``) through the ORM, in
    the caller's transaction."""
    run = lock_map(map_id)
    chunk_values: dict[str, Any] = {"status": settled, "claimed_by": "", "lease_until": None}
    if held == Chunk.RUNNING:
        chunk_values["succeeded"] = counters.get("succeeded", 0)
    taken = (
        MapChunk.objects.using(using())
        .filter(pk=chunk, claimed_by=token, status=held)
        .update(**chunk_values)
    )
    if not taken:
        return None
    if held == Chunk.RUNNING:
        # The slots' first write: inserted (a slot a re-run overwrites is updated).
        row = MapChunk.objects.using(using()).values("first", "items", "attempts").get(pk=chunk)
        items = row["items"]
        MapResult.objects.using(using()).bulk_create(
            [
                MapResult(
                    map_run_id=map_id,
                    index=w.index,
                    item=items[w.index - row["first"]],
                    status=w.status,
                    attempts=row["attempts"],
                    value=w.value,
                    error=w.error,
                    undo=w.undo,
                    finished_at=now,
                )
                for w in writes
            ],
            update_conflicts=True,
            unique_fields=conflict_target(["map_run", "index"]),
            update_fields=["status", "attempts", "value", "error", "undo", "finished_at"],
        )
    else:
        for w in writes:
            MapResult.objects.using(using()).filter(map_run_id=map_id, index=w.index).update(
                status=w.status, rollback_error=w.error, finished_at=now
            )
    for name, value in counters.items():
        setattr(run, name, getattr(run, name) + value)
    if first_failure is not None and run.first_failure is None:
        run.first_failure = first_failure
    run.save(update_fields=[*counters, "first_failure", "updated_at"])
    return Settled(
        run.settled,
        run.size,
        run.failed,
        run.halted,
        run.stop_reason,
        run.collected,
        run.status,
        run.rollback_settled,
        run.rollback_total,
    )


def never_start(map_id: uuid.UUID, now: dt.datetime) -> int:
    """Settle every chunk never claimed of a stopped map as ``not_started`` (the caller holds
    the map's row); how many elements."""
    never = 0
    chunks = MapChunk.objects.using(using()).filter(map_run_id=map_id, status=Chunk.PENDING)
    for chunk in chunks:
        write_slots(map_id, chunk, ElementStatus.NOT_STARTED, now)
        never += chunk.size
    chunks.update(status=Chunk.NOT_STARTED)
    return never


def write_slots(
    map_id: uuid.UUID,
    chunk: MapChunk,
    status: str,
    now: dt.datetime,
    *,
    error: dict[str, Any] | None = None,
) -> None:
    """Write every slot of ``chunk`` with one outcome, through the ORM (the settle of a chunk
    no task will settle)."""
    MapResult.objects.using(using()).bulk_create(
        [
            MapResult(
                map_run_id=map_id,
                index=chunk.first + offset,
                item=item,
                status=status,
                error=error,
                attempts=chunk.attempts,
                finished_at=now,
            )
            for offset, item in enumerate(chunk.items)
        ],
        update_conflicts=True,
        unique_fields=conflict_target(["map_run", "index"]),
        update_fields=["status", "error", "attempts", "finished_at"],
    )


def _locked(qs: QuerySet[M]) -> QuerySet[M]:
    if connections[using()].features.has_select_for_update_skip_locked:
        return qs.select_for_update(skip_locked=True)
    return qs
