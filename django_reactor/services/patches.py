"""Patches, for the faces and the processes that run runs: a run on a removed branch parked for
a person (``park_removed``), and what the admin's patches page shows (``branches``)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from .. import store
from ..engine.outcomes import ErrorInfo, ErrorKind, Failed
from ..exceptions import PatchRemoved
from ..states import EventKind, ExecutionStatus

logger = logging.getLogger("django_reactor.services")


def park_removed(owned: store.Owned, reactor: str, removed: PatchRemoved) -> Failed:
    """Park the run ``owned`` (of ``reactor``) ``needs_attention`` (``patch_removed``): a step
    called ``deprecated_patch()`` in a run on the patch's old branch. Nothing is rolled back:
    the step's work stands, as after a crash, for code that still has the old branch."""
    message = str(removed)
    failure = ErrorInfo(
        kind=ErrorKind.PATCH_REMOVED, message=message, step=removed.step, reactor=reactor
    )
    logger.error("execution %s needs attention: %s", owned.execution_id, message)
    store.park_for_attention(
        owned,
        failure=failure.to_dict(),
        event_kind=EventKind.ATTENTION,
        data={
            "kind": ErrorKind.PATCH_REMOVED,
            "error": message,
            "patch": removed.patch,
            "step": removed.step,
            "branch": "old",
        },
    )
    return Failed(
        execution_id=owned.execution_id, error=failure, status=ExecutionStatus.NEEDS_ATTENTION
    )


@dataclass(frozen=True)
class PatchBranches:
    """One patch as the admin shows it: how many unfinished runs are on its new branch and on
    its old one, and how many runs decided it in all."""

    name: str
    new: int
    old: int
    runs: int


def branches() -> list[PatchBranches]:
    """Every patch some run decided, by name."""
    return [PatchBranches(*row) for row in store.patches.branch_counts()]


def decisions_of(execution_id: uuid.UUID) -> dict[str, bool]:
    """A run's decisions, by patch name."""
    return store.patches.decisions(execution_id)
