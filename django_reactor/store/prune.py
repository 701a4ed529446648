"""Deleting old finished runs, in batches (``reactor_prune``)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable

from django.db import connections, models, transaction
from django.db.models import Exists, OuterRef, signals

from ..models import (
    BatchItem,
    CancelSubscription,
    Dispatch,
    Execution,
    ExecutionAttribute,
    ExecutionEvent,
    Interrupt,
    MapChunk,
    MapResult,
    MapRun,
    MapTally,
    Message,
    PatchDecision,
    Pause,
    Schedule,
    ScheduleFire,
    StepRecord,
)
from ..states import TERMINAL_STATUSES
from .db import using
from .dialects import dialect

#: What a prune deletes with its runs, and every foreign key into those tables that the
#: one-statement batch (``sql.PRUNE_BATCH``) deletes or sets to NULL, as (model, field).
_DELETED = (
    Execution,
    StepRecord,
    ExecutionEvent,
    ExecutionAttribute,
    Interrupt,
    Message,
    CancelSubscription,
    Dispatch,
    MapRun,
    MapChunk,
    MapResult,
    MapTally,
    Pause,
    BatchItem,
    PatchDecision,
)
_COVERED = {
    (Execution, "parent"),
    (Execution, "root"),
    (Execution, "retry_of"),
    (Execution, "continued_from"),
    (StepRecord, "execution"),
    (ExecutionEvent, "execution"),
    (ExecutionAttribute, "execution"),
    (Interrupt, "execution"),
    (Message, "execution"),
    (CancelSubscription, "execution"),
    (Dispatch, "execution"),
    (Dispatch, "map_run"),
    (MapRun, "execution"),
    (MapChunk, "map_run"),
    (MapResult, "map_run"),
    (MapTally, "map_run"),
    (Schedule, "last_execution"),
    (ScheduleFire, "execution"),
    (Pause, "execution"),
    (Pause, "waits_for"),
    (BatchItem, "execution"),
    (PatchDecision, "execution"),
}
_BEGINNING = (dt.datetime(1, 1, 1, tzinfo=dt.UTC), uuid.UUID(int=0))


def _prunable(cutoff: dt.datetime, statuses: Iterable[str]) -> models.QuerySet[Execution]:
    """Top-level runs in ``statuses`` that finished before ``cutoff`` and whose every
    descendant (composed children, async units) has finished too."""
    unfinished_descendant = (
        Execution.objects.using(using())
        .filter(root_id=OuterRef("pk"))
        .exclude(status__in=TERMINAL_STATUSES)
    )
    return (
        Execution.objects.using(using())
        .filter(
            parent__isnull=True,
            status__in=list(statuses),
            finished_at__isnull=False,
            finished_at__lt=cutoff,
        )
        .exclude(Exists(unfinished_descendant))
    )


def count_prunable(cutoff: dt.datetime, statuses: Iterable[str]) -> int:
    """How many top-level runs :func:`prune_finished` would delete now."""
    return _prunable(cutoff, statuses).count()


def prune_finished(cutoff: dt.datetime, statuses: Iterable[str], batch_size: int) -> Iterable[int]:
    """Delete finished top-level runs (see :func:`count_prunable`), ``batch_size`` at a time,
    oldest first.

    Each batch is its own transaction: the runs are selected and locked (rows another process
    holds are skipped), then deleted with their step records, trace, attributes, interrupts,
    dispatches, maps and child runs; other runs' ``retry_of`` and ``continued_from``,
    schedules' last run and fires' run that pointed at them become NULL. Where the dialect has
    it (PostgreSQL), a batch is one statement that goes on from where the previous one
    stopped, unless another model points at these tables or listens to their deletion
    signals: then, as on other databases, Django's collector deletes them, applying each
    foreign key's ``on_delete``. Yields how many top-level runs each batch deleted.
    """
    statuses = list(statuses)
    one_statement = one_statement_covers()
    after = _BEGINNING
    while True:
        with transaction.atomic(using=using()):
            done = (
                dialect().prune_batch(cutoff, statuses, batch_size, after)
                if one_statement
                else None
            )
            if done is not None:
                count, after = done
            else:
                count = _collect_batch(cutoff, statuses, batch_size)
        if not count:
            return
        yield count


def _collect_batch(cutoff: dt.datetime, statuses: list[str], batch_size: int) -> int:
    """One batch through Django's collector, in the caller's transaction."""
    # Only the runs' rows are locked where the database can say so (PostgreSQL).
    own_rows = ("self",) if connections[using()].features.has_select_for_update_of else ()
    ids = list(
        _prunable(cutoff, statuses)
        .select_for_update(skip_locked=True, of=own_rows)
        .order_by("finished_at", "id")
        .values_list("id", flat=True)[:batch_size]
    )
    if ids:
        Execution.objects.using(using()).filter(id__in=ids).delete()
    return len(ids)


def one_statement_covers() -> bool:
    """Whether the one-statement batch deletes what the collector would: no other model has a
    foreign key into the tables it deletes from (a project's own model pointing at a run), and
    nothing listens to their deletion signals."""
    for model in _DELETED:
        if signals.pre_delete.has_listeners(model) or signals.post_delete.has_listeners(model):
            return False
        for relation in model._meta.related_objects:
            if (relation.related_model, relation.field.name) not in _COVERED:
                return False
    return True
