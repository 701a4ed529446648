"""What forking a run from a step does, worked out from its records (no database).

A fork is a new run of the reactor's current definition that takes over ("carries") the
records of the steps the original completed before the fork step, so their bodies never run
again, and runs the rest with the code deployed now. A step is carried when its effect stands
(it completed, or was skipped, and was not undone) and every step it depends on is carried; a
composed child, a map and an async unit are never carried (their work lives in rows of the
original's own), nor anything after them. What the original completed past the cut and was not
undone is the *abandoned branch*: it is undone, newest first, by the original's ordinary undo
before the fork runs. The rollback rule holds across the two runs: the fork's own rollback
undoes the carried steps (the original never does: their records say ``carried``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..exceptions import InvalidFork
from ..states import RollbackStatus, StepStatus
from .journal import RecordedStep, RunRecords
from .spec import ReactorDefinition, StepSpec

#: Rollback states after which a completed step's effect still stands (an undo that failed
#: may have left it).
_STANDING = frozenset({RollbackStatus.NONE, RollbackStatus.NO_HANDLER, RollbackStatus.FAILED})
#: Rollback states after which a completed step is still due an undo.
_UNDO_DUE = frozenset({RollbackStatus.NONE, RollbackStatus.FAILED})


@dataclass(frozen=True, slots=True)
class ForkPlan:
    """What a fork of a run from ``from_step`` does.

    ``carried``: the steps the fork takes over, results and all (in the order they ran);
    ``undo``: completed steps of the original past the cut whose effects stand, undone newest
    first before the fork runs (the rollback plan of the abandoned branch); ``again``: steps the
    original completed that the fork runs again; ``warnings``: what may happen twice.
    """

    from_step: str
    carried: tuple[str, ...]
    undo: tuple[str, ...]
    again: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def needs_undo(self) -> bool:
        """Whether the original has effects past the cut to undo first."""
        return bool(self.undo)

    def as_dict(self) -> dict[str, object]:
        """The plan as JSON (the API's and the commands' preview)."""
        return {
            "from_step": self.from_step,
            "carried": list(self.carried),
            "undo": list(self.undo),
            "again": list(self.again),
            "warnings": list(self.warnings),
        }


def plan_fork(definition: ReactorDefinition, records: RunRecords, from_step: str) -> ForkPlan:
    """The plan of a fork of a run holding ``records`` from ``from_step`` with ``definition``
    (the code deployed now). Raises InvalidFork when ``from_step`` is none of its steps, or a
    step to undo is gone from it."""
    if from_step not in definition.by_name:
        names = ", ".join(spec.name for spec in definition.steps)
        raise InvalidFork(
            f"{definition.name} has no step {from_step!r} to fork from; its steps: {names}"
        )
    steps = sorted(records.steps, key=lambda record: record.seq)
    cut = next((r.seq for r in steps if r.step == from_step), None)
    eligible = {
        r.step: r
        for r in steps
        if (cut is None or r.seq < cut)
        and r.step != from_step
        and _stands(r)
        and _carriable(definition.by_name.get(r.step))
    }
    carried = _closed(definition, eligible)
    undo = [
        r
        for r in reversed(steps)
        if r.status == StepStatus.COMPLETED and r.rollback in _UNDO_DUE and r.step not in carried
    ]
    gone = [r.step for r in undo if r.step not in definition.by_name]
    if gone:
        raise InvalidFork(
            f"forking from {from_step!r} abandons completed steps that {definition.name} no "
            f"longer has ({', '.join(gone)}), so they could not be undone; deploy them back, "
            "or fork from a step after them"
        )
    again = [
        r.step
        for r in steps
        if r.status in (StepStatus.COMPLETED, StepStatus.SKIPPED)
        and r.step not in carried
        and r.step in definition.by_name
    ]
    return ForkPlan(
        from_step=from_step,
        carried=tuple(r.step for r in steps if r.step in carried),
        undo=tuple(r.step for r in undo),
        again=tuple(again),
        warnings=tuple(_warnings(definition, steps, carried, {r.step for r in undo})),
    )


def _stands(record: RecordedStep) -> bool:
    if record.status == StepStatus.SKIPPED:
        return True
    return record.status == StepStatus.COMPLETED and record.rollback in _STANDING


def _carriable(spec: StepSpec | None) -> bool:
    """A step whose record alone holds what it did (not a composed child, a map or an async
    unit, whose work lives in rows of the original's)."""
    return spec is not None and spec.map is None and spec.unit is None and spec.child is None


def _closed(definition: ReactorDefinition, eligible: dict[str, RecordedStep]) -> set[str]:
    """The eligible steps whose dependencies are all carried too (a step whose input runs
    again runs again)."""
    carried = set(eligible)
    changed = True
    while changed:
        changed = False
        for name in list(carried):
            if not definition.by_name[name].depends_on <= carried:
                carried.discard(name)
                changed = True
    return carried


def _warnings(
    definition: ReactorDefinition,
    steps: Sequence[RecordedStep],
    carried: set[str],
    undone: set[str],
) -> list[str]:
    said = []
    for r in steps:
        spec = definition.by_name.get(r.step)
        if r.step in carried or spec is None or r.status != StepStatus.COMPLETED:
            continue
        if r.step in undone and not spec.has_undo:
            said.append(
                f"{r.step} declares no undo: undoing the abandoned branch leaves its effect, "
                "and the fork runs it again"
            )
        elif r.rollback == RollbackStatus.NO_HANDLER:
            said.append(
                f"{r.step} declares no undo, so its effect from the original stands; the fork "
                "runs it again (with an idempotency key of its own)"
            )
        elif r.rollback == RollbackStatus.FAILED and r.step not in undone:
            said.append(f"{r.step}'s undo failed in the original; the fork runs it again")
    return said
