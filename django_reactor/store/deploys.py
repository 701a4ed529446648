"""What the deploy check reads (``services.deploys``): the runs in flight by reactor and the
definition they started under, the shapes kept for those definitions, and, per definition,
how many of its runs recorded each step or stand at it. Counted in the database (grouped
statements), however many runs there are; ids are read for a sample only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Count

from ..models import Definition, Execution, StepRecord
from ..states import IN_FLIGHT_STATUSES, ExecutionStatus
from .db import using

#: The statuses of a run a deploy reaches: a worker (or a caller) takes it further under the
#: code it runs, which checks the run's recorded steps against its definition.
IN_FLIGHT = (*IN_FLIGHT_STATUSES, ExecutionStatus.QUEUED)


@dataclass(frozen=True)
class RunsOn:
    """The runs in flight of ``reactor`` that started on ``version`` (``Meta.version``, ``""``
    for none) under the definition ``definition_hash``."""

    reactor: str
    version: str
    definition_hash: str
    runs: int


def runs_in_flight() -> list[RunsOn]:
    """The runs in flight, counted by reactor, version and definition."""
    rows = (
        Execution.objects.using(using())
        .filter(status__in=IN_FLIGHT)
        .values_list("reactor", "version", "definition_hash")
        .annotate(runs=Count("id"))
        .order_by("reactor", "version", "definition_hash")
    )
    return [RunsOn(*row) for row in rows]


def kept_shapes(hashes: Iterable[str]) -> dict[str, Any]:
    """The shapes kept for the definitions ``hashes`` (those kept; older runs have none)."""
    return dict(
        Definition.objects.using(using()).filter(hash__in=list(hashes)).values_list("hash", "shape")
    )


def _runs(reactor: str, definition_hash: str) -> Any:
    return Execution.objects.using(using()).filter(
        reactor=reactor, definition_hash=definition_hash, status__in=IN_FLIGHT
    )


def _records(reactor: str, definition_hash: str) -> Any:
    return StepRecord.objects.using(using()).filter(
        execution__reactor=reactor,
        execution__definition_hash=definition_hash,
        execution__status__in=IN_FLIGHT,
    )


def recorded_steps(reactor: str, definition_hash: str) -> dict[str, int]:
    """For each step the runs of the definition recorded, how many of them did."""
    return dict(
        _records(reactor, definition_hash)
        .values_list("step")
        .annotate(runs=Count("execution_id", distinct=True))
        .order_by()
    )


def current_steps(reactor: str, definition_hash: str) -> dict[str, int]:
    """For each step the runs of the definition stand at (``current_step``), how many."""
    return dict(
        _runs(reactor, definition_hash)
        .exclude(current_step="")
        .values_list("current_step")
        .annotate(runs=Count("id"))
        .order_by()
    )


def past_step(reactor: str, definition_hash: str, step: str) -> int:
    """How many runs of the definition recorded ``step`` and stand elsewhere now."""
    return (
        _runs(reactor, definition_hash)
        .filter(steps__step=step)
        .exclude(current_step=step)
        .distinct()
        .count()
    )


def recording_any(
    reactor: str, definition_hash: str, steps: Iterable[str], sample: int
) -> tuple[int, list[Any]]:
    """How many runs of the definition recorded any of ``steps``, and the ids of the oldest
    ``sample`` of them."""
    chosen = list(steps)
    if not chosen:
        return 0, []
    runs = _runs(reactor, definition_hash).filter(steps__step__in=chosen).distinct()
    ids = list(runs.order_by("created_at", "id").values_list("id", flat=True)[:sample])
    return runs.count(), ids


def recording_all(reactor: str, definition_hash: str, steps: Iterable[str]) -> int:
    """How many runs of the definition recorded every one of ``steps`` (all runs for none)."""
    chosen = sorted(set(steps))
    if not chosen:
        return _runs(reactor, definition_hash).count()
    return (
        _records(reactor, definition_hash)
        .filter(step__in=chosen)
        .values("execution_id")
        .annotate(found=Count("step", distinct=True))
        .filter(found=len(chosen))
        .count()
    )


def recorded_after(definition_hash: str, other: str) -> bool:
    """Whether the definition ``definition_hash`` was first recorded (a run started on it)
    after ``other`` was: code that started runs later than this code did is newer. False when
    either never was (code whose definition no run started yet is the newest there is)."""
    first = dict(
        Definition.objects.using(using())
        .filter(hash__in=[definition_hash, other])
        .values_list("hash", "created_at")
    )
    if definition_hash not in first or other not in first:
        return False
    return bool(first[definition_hash] > first[other])
