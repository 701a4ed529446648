"""What a change of a reactor's definition does to its runs in flight: the steps a deploy adds,
removes, renames, re-wires or re-implements, between the shape a run started under and the
shape in the code (``ReactorDefinition.shape``: each step's implementation and dependencies).

A run goes on under a new definition when every step it has recorded is still there, with the
same implementation and dependencies (``ReactorDefinition.incompatibilities``, which the worker
applies as it takes the run); steps it has not reached may change. So a change *blocks* the
runs that recorded its step (they park ``definition_changed``) and none other: an added step
blocks nobody, a removed, renamed, re-wired or re-implemented one blocks the runs past it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ADDED",
    "KINDS",
    "REIMPLEMENTED",
    "REMOVED",
    "RENAMED",
    "REWIRED",
    "Change",
    "blocking_steps",
    "changes",
    "why_blocked",
]

ADDED = "added"
REMOVED = "removed"
RENAMED = "renamed"
REWIRED = "rewired"
REIMPLEMENTED = "reimplemented"
KINDS = (ADDED, REMOVED, RENAMED, REWIRED, REIMPLEMENTED)


@dataclass(frozen=True)
class Change:
    """One step's change: its ``kind``, the ``step`` as the runs recorded it (the new name for
    an added step), and what it says in words."""

    kind: str
    step: str
    detail: str

    @property
    def blocks(self) -> bool:
        """Whether a run that recorded the step cannot go on under the new definition (every
        change but an added step, which no run has recorded)."""
        return self.kind != ADDED


def changes(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[Change]:
    """The changes from the ``stored`` shape to the ``current`` one, in the current shape's
    step order (removed steps last). A removed step and an added one with the same
    implementation and dependencies are one rename."""
    removed = [name for name in stored if name not in current]
    added = [name for name in current if name not in stored]
    renames: dict[str, str] = {}
    for old in removed:
        impl, after = _impl(stored[old]), _depends_on(stored[old])
        match = next(
            (
                new
                for new in added
                if new not in renames.values()
                and _impl(current[new]) == impl
                and _depends_on(current[new]) == after
            ),
            None,
        )
        if match is not None:
            renames[old] = match
    found: list[Change] = []
    new_names = {new: old for old, new in renames.items()}
    for name, step in current.items():
        if name in new_names:
            old = new_names[name]
            found.append(Change(RENAMED, old, f"step {old!r} renamed {name!r}"))
        elif name not in stored:
            follows = ", ".join(repr(d) for d in _depends_on(step)) or "nothing"
            found.append(Change(ADDED, name, f"step {name!r} added (after {follows})"))
        elif _impl(stored[name]) != _impl(step):
            found.append(
                Change(
                    REIMPLEMENTED,
                    name,
                    f"step {name!r} now runs {_impl(step)} (was {_impl(stored[name])})",
                )
            )
        elif _depends_on(stored[name]) != _depends_on(step):
            was = ", ".join(repr(d) for d in _depends_on(stored[name])) or "nothing"
            now = ", ".join(repr(d) for d in _depends_on(step)) or "nothing"
            found.append(
                Change(
                    REWIRED,
                    name,
                    f"step {name!r} now depends on {now} (was {was})",
                )
            )
    for name in removed:
        if name not in renames:
            found.append(Change(REMOVED, name, f"step {name!r} removed"))
    return found


def blocking_steps(
    stored: Mapping[str, Any], current: Mapping[str, Any], recorded: set[str]
) -> set[str]:
    """The steps among ``recorded`` that stop a run started under ``stored`` from going on
    under ``current`` (:func:`why_blocked` says why)."""
    return {name for name in recorded if why_blocked(name, stored, current) is not None}


def why_blocked(name: str, stored: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """Why the recorded step ``name`` stops a run started under ``stored`` from going on under
    ``current``, or None when it does not: the one rule the worker applies
    (``ReactorDefinition.incompatibilities``) and the deploy check predicts. An empty stored
    shape (kept before shapes were) checks only that the step still exists."""
    if name not in current:
        return f"step {name!r} ran but no longer exists"
    if not stored:
        return None
    if name not in stored:
        return f"step {name!r} ran but the run's stored definition lacks it"
    if stored[name] != current[name]:
        return f"step {name!r} ran but its implementation or inputs changed"
    return None


def _impl(step: Any) -> str:
    return str(step.get("impl", "")) if isinstance(step, Mapping) else ""


def _depends_on(step: Any) -> list[str]:
    value = step.get("depends_on", []) if isinstance(step, Mapping) else []
    return sorted(str(d) for d in value) if isinstance(value, list) else []
