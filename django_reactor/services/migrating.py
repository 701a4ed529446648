"""Moving runs parked ``definition_changed`` (or ``patch_removed``: the code that took them had
removed the branch of a patch they are on) onto the code's definition (``reactor_migrate``, the
admin's "Migrate onto the deployed definition").

A run parks ``definition_changed`` when a step it recorded is gone or changed in the code that
took it (see ``services.deploys``). It moves onto the code's definition when its recorded
steps map onto that definition: each, under its name or under the new name ``renames`` gives
it (``old=new``, a step the deploy renamed), exists in the code with the implementation and
dependencies it ran with (its dependencies renamed the same way). Its records keep their
results, attempts and rollback state (its undo stack), and a worker takes it again from where
it stopped. A run whose steps do not map is refused with the reason, and nothing changes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import store
from ..exceptions import InvalidTransition, ReactorError
from ..models import Execution
from ..states import ExecutionStatus
from . import audit
from .databases import across_databases
from .guards import reactor_named


@dataclass(frozen=True)
class Migration:
    """What migrating one parked run did (or, in a dry run, would do): ``moved``, or why not;
    ``renames``: its recorded steps that take new names."""

    execution_id: uuid.UUID
    moved: bool
    reason: str
    renames: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "execution_id": str(self.execution_id),
            "moved": self.moved,
            "reason": self.reason,
            "renames": self.renames,
        }


def parse_renames(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["old=new", ...]`` as a mapping; ReactorError saying which pair is malformed."""
    renames: dict[str, str] = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        old, new = old.strip(), new.strip()
        if not sep or not old or not new:
            raise ReactorError(f"--map takes old=new (a step's old and new names), got {pair!r}")
        if old in renames and renames[old] != new:
            raise ReactorError(f"--map gives step {old!r} two new names: {renames[old]!r}, {new!r}")
        renames[old] = new
    return renames


@across_databases
def migrate_parked(
    reactor: Any,
    *,
    renames: Mapping[str, str] | None = None,
    execution_ids: list[uuid.UUID] | None = None,
    dry_run: bool = False,
    reason: str = "",
) -> list[Migration]:
    """Move the runs of ``reactor`` parked ``definition_changed`` (all of them, or those of
    ``execution_ids``) onto the code's definition; ``renames`` maps old step names to new ones.
    With ``dry_run``, say what would happen and change nothing. Each move is recorded with who
    asked and ``reason`` (a ``steer`` entry on the run's trace, and the steering history)."""
    reactor_class = reactor_named(reactor)
    definition = reactor_class.definition
    renames = dict(renames or {})
    unknown = sorted(new for new in set(renames.values()) if new not in definition.by_name)
    if unknown:
        raise ReactorError(
            f"--map names step(s) {', '.join(map(repr, unknown))} that {definition.name} does "
            f"not have (its steps: {', '.join(definition.by_name)})"
        )
    audit.check_reason(reason, "migrate")
    rows = _parked(definition.name, execution_ids)
    return [_migrate(row, definition, renames, dry_run, reason) for row in rows]


def _parked(reactor: str, execution_ids: list[uuid.UUID] | None) -> list[Execution]:
    if execution_ids is None:
        return store.migrating.parked(reactor)
    rows = []
    for execution_id in execution_ids:
        row = store.get_row(execution_id)
        failure = row.failure or {}
        if row.reactor != reactor:
            raise InvalidTransition(
                f"execution {row.id} is a run of {row.reactor}, not {reactor}", status=row.status
            )
        if row.status != ExecutionStatus.NEEDS_ATTENTION or (
            failure.get("kind") not in store.migrating.MIGRATABLE
        ):
            raise InvalidTransition(
                f"cannot migrate execution {row.id}: it is {row.status}"
                + (f" ({failure.get('kind')})" if failure.get("kind") else "")
                + "; only runs parked definition_changed or patch_removed are migrated",
                status=row.status,
            )
        rows.append(row)
    return rows


def _migrate(
    row: Execution, definition: Any, renames: dict[str, str], dry_run: bool, reason: str
) -> Migration:
    recorded = store.migrating.recorded_steps(row.id)
    stored = store.stored_shape(row, strict=False)
    mapped = [renames.get(step, step) for step in recorded]
    used = {old: new for old, new in renames.items() if old in recorded and old != new}
    clash = sorted({step for step in mapped if mapped.count(step) > 1})
    if clash:
        return Migration(
            row.id,
            False,
            f"two recorded steps would both be {', '.join(map(repr, clash))}: map each to a step "
            "of its own",
            used,
        )
    taken = sorted(
        new
        for old, new in renames.items()
        if old in stored and new in stored and new not in renames
    )
    if taken:
        return Migration(
            row.id,
            False,
            f"the definition it ran with has step(s) {', '.join(map(repr, taken))} already: a "
            "step can be renamed only to a name its run's definition did not use",
            used,
        )
    renamed_shape = {
        renames.get(name, name): {
            "impl": step.get("impl"),
            "depends_on": sorted(renames.get(d, d) for d in step.get("depends_on", [])),
        }
        for name, step in stored.items()
    }
    problems = definition.incompatibilities(renamed_shape, set(mapped))
    if problems:
        hint = (
            "; map a renamed step with --map old=new"
            if any("no longer exists" in p for p in problems)
            else ""
        )
        return Migration(row.id, False, "; ".join(problems) + hint, used)
    if dry_run:
        return Migration(row.id, True, "would move (dry run)", used)
    steering = audit.steering("migrate", reason=reason, detail={"renamed": used}).on(
        row.id, row.reactor
    )
    moved = store.migrating.move_to_definition(
        row.id,
        parked_on=row.definition_hash,
        definition_hash=definition.definition_hash,
        version=definition.version,
        shape=definition.shape,
        renames=used,
        current_step=renames.get(row.current_step, row.current_step),
        steering=steering,
    )
    if not moved:
        return Migration(row.id, False, "it moved on meanwhile (no longer parked)", used)
    return Migration(row.id, True, "moved: a worker takes it again", used)
