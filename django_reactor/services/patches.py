"""Patches, for the faces and the processes that run runs: a run on a removed branch parked for
a person (``park_removed``), and what the admin's patches page shows (``branches``)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import store
from ..engine.outcomes import ErrorKind, Failed
from ..exceptions import PatchRemoved
from .attention import park


def park_removed(owned: store.Owned, reactor: str, removed: PatchRemoved) -> Failed:
    """Park the run ``owned`` (of ``reactor``) ``needs_attention`` (``patch_removed``): a step
    called ``deprecated_patch()`` in a run on the patch's old branch. Nothing is rolled back:
    the step's work stands, as after a crash, for code that still has the old branch."""
    return park(
        owned,
        reactor,
        ErrorKind.PATCH_REMOVED,
        str(removed),
        step=removed.step,
        data={"patch": removed.patch, "step": removed.step, "branch": "old"},
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
