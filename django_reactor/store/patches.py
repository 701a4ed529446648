"""Runs' patch decisions (``PatchDecision`` rows): read back, recorded once, copied to a fork,
and counted for the admin's patches page."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, Q, QuerySet

from ..models import PatchDecision
from ..states import TERMINAL_STATUSES
from .db import using


def decisions(execution_id: uuid.UUID) -> dict[str, bool]:
    """Every decision the run recorded, by patch name."""
    return dict(
        PatchDecision.objects.using(using())
        .filter(execution_id=execution_id)
        .values_list("name", "taken")
    )


def decide(execution_id: uuid.UUID, name: str, taken: bool, step: str) -> bool:
    """Record the run's decision for ``name`` (``taken``, made in ``step``) unless it has one,
    and return the one recorded: an insert that ignores the unique conflict, then a read, so
    that two steps of the run deciding at once (or two processes) agree on the first."""
    PatchDecision.objects.using(using()).bulk_create(
        [PatchDecision(execution_id=execution_id, name=name, taken=taken, step=step)],
        ignore_conflicts=True,
    )
    return bool(
        PatchDecision.objects.using(using())
        .filter(execution_id=execution_id, name=name)
        .values_list("taken", flat=True)
        .get()
    )


def copy_to_fork(original_id: uuid.UUID, fork_id: uuid.UUID, steps: Iterable[str]) -> None:
    """Give a fork the original's decisions made in the steps it carries (its records say it
    did what those decisions chose); the steps it runs again decide anew."""
    kept = list(
        PatchDecision.objects.using(using()).filter(execution_id=original_id, step__in=list(steps))
    )
    PatchDecision.objects.using(using()).bulk_create(
        [
            PatchDecision(execution_id=fork_id, name=d.name, taken=d.taken, step=d.step)
            for d in kept
        ],
        ignore_conflicts=True,
    )


def branch_counts() -> list[tuple[str, int, int, int]]:
    """Per patch name seen, by name: how many unfinished runs are on its new branch, how many
    on its old one, and how many runs decided it in all."""
    unfinished = ~Q(execution__status__in=list(TERMINAL_STATUSES))
    rows = (
        PatchDecision.objects.using(using())
        .values("name")
        .annotate(
            new=Count("id", filter=unfinished & Q(taken=True)),
            old=Count("id", filter=unfinished & Q(taken=False)),
            runs=Count("id"),
        )
        .values_list("name", "new", "old", "runs")
        .order_by("name")
    )
    return list(rows)


def runs_on_branch(name: str, taken: bool) -> QuerySet[PatchDecision, Any]:
    """The ids of the runs that decided patch ``name`` as ``taken``: a subquery for a run
    list's filter."""
    return (
        PatchDecision.objects.using(using()).filter(name=name, taken=taken).values("execution_id")
    )


def of_run(execution_id: uuid.UUID) -> list[PatchDecision]:
    """A run's decisions, by name (its change page)."""
    return list(PatchDecision.objects.using(using()).filter(execution_id=execution_id))
