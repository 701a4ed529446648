"""Deleting old finished runs, in batches (``reactor_prune``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from django.db import models, transaction
from django.db.models import Exists, OuterRef

from ..models import Execution
from ..states import TERMINAL_STATUSES
from .db import using


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
    """Delete finished top-level runs (see :func:`count_prunable`), ``batch_size`` at a time.

    Each batch is its own transaction: the runs are selected and locked (rows another process
    holds are skipped), then deleted with their step records, trace, interrupts, dispatches and
    child runs. Yields how many top-level runs each batch deleted.
    """
    statuses = list(statuses)
    while True:
        with transaction.atomic(using=using()):
            ids = list(
                _prunable(cutoff, statuses)
                .select_for_update(skip_locked=True, of=("self",))
                .order_by("finished_at", "id")
                .values_list("id", flat=True)[:batch_size]
            )
            if not ids:
                return
            Execution.objects.using(using()).filter(id__in=ids).delete()
        yield len(ids)
