"""Reading maps: their elements' slots, pages of them, and the summary (from the counters);
and the shapes claims and settles pass around. Re-exported by :mod:`.maps`; nothing here
writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Sum

from ..models import MapChunk, MapResult, MapRun, MapTally
from ..states import ElementStatus, MapStatus
from .db import using

FAILURE_SAMPLE = 25
TRACEBACK_FRAMES = 10
Chunk = MapChunk.Status


@dataclass(frozen=True, slots=True)
class Claimed:
    """An element slot a task took: run it (forward) or undo it (rollback)."""

    index: int
    item: Any
    undo: Any = None
    # Claims before this one: more than zero means a process died holding the slot.
    attempts: int = 0


@dataclass(frozen=True, slots=True)
class ChunkClaim:
    """A chunk a task holds: its id (what fences its settle) and its slots, in the order they
    run (lowest index first forward, highest first when undoing)."""

    chunk: int
    slots: list[Claimed] = field(default_factory=list)

    @property
    def retaken(self) -> bool:
        """Whether the chunk was claimed before this claim (a process died holding it)."""
        return any(slot.attempts for slot in self.slots)


@dataclass(slots=True)
class SlotWrite:
    """What one element's settle writes to its slot."""

    index: int
    status: str
    value: Any = None
    # An ErrorInfo dict (forward), or the RollbackFailure dicts of a failed undo.
    error: dict[str, Any] | list[dict[str, Any]] | None = None
    undo: Any = None


@dataclass(frozen=True, slots=True)
class Settled:
    """The map's counters as the settle of one chunk left them (its row, returned by the
    settle's statement)."""

    settled: int
    size: int | None
    failed: int
    halted: int
    stop_reason: str
    collected: bool
    status: str
    rollback_settled: int
    rollback_total: int


@dataclass(frozen=True, slots=True)
class Progress:
    """The map's counters as a settle left them."""

    failed: int
    stop_reason: str
    # False when the task no longer held its chunk: nothing was written.
    written: bool = True


def rollback_errors(map_id: uuid.UUID) -> Iterator[tuple[int, Any]]:
    """``(index, rollback error)`` of every element whose undo failed, by index."""
    yield from (
        MapResult.objects.using(using())
        .filter(map_run_id=map_id, status=ElementStatus.UNDO_FAILED)
        .order_by("index")
        .values_list("index", "rollback_error")
        .iterator(chunk_size=500)
    )


def missing_indices(map_id: uuid.UUID, size: int) -> list[int]:
    """Indices below ``size`` that have no slot row (deleted by hand or by other code)."""
    slots = MapResult.objects.using(using()).filter(map_run_id=map_id)
    if slots.count() >= size:
        return []
    present = set(slots.values_list("index", flat=True).iterator(chunk_size=5000))
    return [index for index in range(size) if index not in present]


def slot(map_id: uuid.UUID, index: int) -> MapResult | None:
    return MapResult.objects.using(using()).filter(map_run_id=map_id, index=index).first()


# Statuses whose slots always hold an error: read through the index of slots with one.
_WITH_ERROR = frozenset({ElementStatus.FAILED, ElementStatus.HALTED})


def page(
    map_id: uuid.UUID, *, after: int, limit: int, statuses: Iterable[str] | None = None
) -> list[tuple[int, str, Any, Any]]:
    """Slots after index ``after``, in index order: ``(index, status, value, error)``.

    Only elements whose chunk a task claimed have a slot (every element of a settled map)."""
    qs = MapResult.objects.using(using()).filter(map_run_id=map_id, index__gt=after)
    if statuses is not None:
        wanted = set(statuses)
        qs = qs.filter(status__in=list(wanted))
        if wanted <= _WITH_ERROR:
            qs = qs.filter(error__isnull=False)
    return list(qs.order_by("index").values_list("index", "status", "value", "error")[:limit])


def count(map_id: uuid.UUID, statuses: Iterable[str]) -> int:
    return (
        MapResult.objects.using(using())
        .filter(map_run_id=map_id, status__in=list(statuses))
        .count()
    )


def running_chunks(map_id: uuid.UUID) -> bool:
    """Whether a task (or a process that died) holds one of the map's chunks."""
    return (
        MapChunk.objects.using(using())
        .filter(map_run_id=map_id, status__in=[Chunk.RUNNING, Chunk.UNDOING])
        .exists()
    )


_SUMMARY_FIELDS = frozenset(
    {"step", "status", "size", "settled", "succeeded", "failed", "halted", "not_started"}
    | {"undone", "undo_failed"}
)


def summary(map_id: uuid.UUID, run: MapRun | None = None) -> dict[str, Any]:
    """Totals by outcome, from the map's counters and its tasks' tallies, and a sample of
    failures (the first ``FAILURE_SAMPLE`` by index, read through the index of slots with an
    error): a few rows whatever the map's size.

    ``run``: the map's row when the caller has it already (saves reading it again).
    """
    if run is None:
        run = MapRun.objects.using(using()).filter(pk=map_id).defer("shared").first()
    if run is None:
        return {}
    deferred = run.get_deferred_fields() & _SUMMARY_FIELDS
    if deferred:  # a row read with .only(): its counters in one query, not one per field
        counters = MapRun.objects.using(using()).filter(pk=map_id).values(*deferred).first()
        if counters is None:
            return {}
        for name, value in counters.items():
            setattr(run, name, value)
    if run.status == MapStatus.RUNNING:
        add_tallies(run)
    size = run.size or 0
    undoing = 0
    if run.status == MapStatus.ROLLING_BACK:
        # Succeeded elements of the chunks being undone right now (a few chunk rows).
        undoing = (
            MapChunk.objects.using(using())
            .filter(map_run_id=map_id, status=Chunk.UNDOING)
            .aggregate(n=Sum("succeeded"))["n"]
            or 0
        )
    totals = {
        "total": size,
        "succeeded": max(0, run.succeeded - run.undone - run.undo_failed - undoing),
        "failed": run.failed,
        "halted": run.halted,
        "pending": max(0, size - run.settled),
        "not_started": run.not_started,
        "undone": run.undone,
        "undoing": undoing,
        "undo_failed": run.undo_failed,
    }
    sample = list(
        MapResult.objects.using(using())
        .filter(map_run_id=map_id, error__isnull=False, status=ElementStatus.FAILED)
        .order_by("index")
        .values_list("index", "error")[: FAILURE_SAMPLE + 1]
    )
    truncated = len(sample) > FAILURE_SAMPLE
    return {
        "type": "map_results",
        "map_id": str(map_id),
        "step": run.step,
        "status": run.status,
        "size": run.size,
        **totals,
        "failures": [_failure_sample(index, error) for index, error in sample[:FAILURE_SAMPLE]],
        "failures_truncated": truncated,
    }


_TALLIED = ("settled", "succeeded", "failed", "halted", "not_started")


def add_tallies(run: MapRun) -> None:
    """Add to ``run``'s counters what its tasks settled since they were last folded (a few
    rows: one per task that settled meanwhile)."""
    tallies = MapTally.objects.using(using()).filter(map_run_id=run.pk)
    totals = tallies.aggregate(**{name: Sum(name) for name in _TALLIED})
    for name in _TALLIED:
        setattr(run, name, getattr(run, name) + (totals[name] or 0))


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
        MapRun.objects.using(using())
        .filter(execution_id=execution_id)
        .defer("shared")
        .order_by("created_at")
    )
