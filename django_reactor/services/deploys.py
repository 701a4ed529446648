"""The deploy check: what the reactors in this code do to the runs in flight, before it is
deployed (``manage.py reactor_deploy_check``, and ``check --deploy --database ...``).

A worker that takes a run checks the steps the run has recorded against the run's reactor in
its code: a recorded step that is gone, or whose implementation or dependencies changed,
parks the run ``definition_changed`` (``ReactorDefinition.incompatibilities``); a run of a
reactor the code lacks parks ``reactor_missing``. This module runs the same rule over every
run in flight, from the database, without taking any: per reactor and per definition its runs
started under, the steps the code adds, removes, renames, re-wires or re-implements
(``engine.changes``), how many runs stand before, at and past each, and which would park.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .. import registry, store
from ..engine.changes import ADDED, blocking_steps, changes
from ..exceptions import ReactorNotRegistered
from .databases import in_each_database

#: How many ids of the runs that would park a report names, per definition.
SAMPLE = 5


@dataclass(frozen=True)
class StepChange:
    """One step's change as the runs of a definition meet it: ``before`` (not reached),
    ``at`` (standing at it), ``after`` (recorded it; for an added step: past its
    dependencies, so it runs next); ``blocks``: runs past it park."""

    kind: str
    step: str
    detail: str
    blocks: bool
    before: int
    at: int
    after: int

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "kind": self.kind,
            "step": self.step,
            "detail": self.detail,
            "blocks": self.blocks,
            "runs_before": self.before,
            "runs_at": self.at,
            "runs_after": self.after,
        }


@dataclass
class DefinitionRuns:
    """The runs in flight of one reactor that started under one definition other than the
    code's: the changes they meet, and how many would park (some of their ids)."""

    definition_hash: str
    runs: int
    shape_kept: bool
    changes: list[StepChange] = field(default_factory=list)
    would_park: int = 0
    parked_ids: list[uuid.UUID] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "definition": self.definition_hash,
            "runs": self.runs,
            "shape_kept": self.shape_kept,
            "changes": [change.as_dict() for change in self.changes],
            "would_park": self.would_park,
            "would_park_ids": [str(i) for i in self.parked_ids],
        }


@dataclass
class ReactorRuns:
    """A reactor with runs in flight: how many run the code's definition, and the others by
    the definition they started under. ``missing``: the code has no such reactor, so every
    run of it would park ``reactor_missing``."""

    reactor: str
    current: str
    runs: int
    on_current: int
    definitions: list[DefinitionRuns] = field(default_factory=list)
    missing: bool = False

    @property
    def would_park(self) -> int:
        """Its runs that would park after the deploy."""
        if self.missing:
            return self.runs
        return sum(d.would_park for d in self.definitions)

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "reactor": self.reactor,
            "definition": self.current or None,
            "missing": self.missing,
            "runs": self.runs,
            "runs_on_this_definition": self.on_current,
            "would_park": self.would_park,
            "definitions": [d.as_dict() for d in self.definitions],
        }


@dataclass
class DeployCheck:
    """Every reactor with runs in flight, as the code being deployed would meet them."""

    reactors: list[ReactorRuns]

    @property
    def would_park(self) -> int:
        """Runs in flight that would park (``definition_changed`` or ``reactor_missing``)."""
        return sum(r.would_park for r in self.reactors)

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "ok": self.would_park == 0,
            "would_park": self.would_park,
            "reactors": [r.as_dict() for r in self.reactors],
        }


def deploy_check(sample: int = SAMPLE) -> DeployCheck:
    """What the reactors of this process's code do to the runs in flight, in every database
    runs are written to (``sample``: ids named per definition of the runs that would park)."""
    reactors: dict[str, ReactorRuns] = {}
    for part in in_each_database(lambda: _here(sample)):
        for found in part:
            known = reactors.get(found.reactor)
            if known is None:
                reactors[found.reactor] = found
            else:
                _merge(known, found, sample)
    return DeployCheck(sorted(reactors.values(), key=lambda r: (-r.would_park, r.reactor)))


def _here(sample: int) -> list[ReactorRuns]:
    by_reactor: dict[str, list[store.deploys.RunsOn]] = {}
    for runs_on in store.deploys.runs_in_flight():
        by_reactor.setdefault(runs_on.reactor, []).append(runs_on)
    shapes = store.deploys.kept_shapes(r.definition_hash for rs in by_reactor.values() for r in rs)
    found = []
    for reactor, groups in by_reactor.items():
        total = sum(g.runs for g in groups)
        try:
            definition = registry.get(reactor).definition
        except ReactorNotRegistered:
            found.append(ReactorRuns(reactor, "", total, 0, missing=True))
            continue
        current = definition.shape
        report = ReactorRuns(reactor, definition.definition_hash, total, 0)
        for group in groups:
            if group.definition_hash == definition.definition_hash:
                report.on_current += group.runs
                continue
            stored = shapes.get(group.definition_hash)
            report.definitions.append(_definition_runs(reactor, group, stored, current, sample))
        found.append(report)
    return found


def _definition_runs(
    reactor: str,
    group: store.deploys.RunsOn,
    stored: Any,
    current: dict[str, Any],
    sample: int,
) -> DefinitionRuns:
    kept = isinstance(stored, dict) and bool(stored)
    shape: dict[str, Any] = stored if kept else {}
    recorded = store.deploys.recorded_steps(reactor, group.definition_hash)
    standing = store.deploys.current_steps(reactor, group.definition_hash)
    report = DefinitionRuns(group.definition_hash, group.runs, kept)
    for change in changes(shape, current) if kept else []:
        if change.kind == ADDED:
            after = store.deploys.recording_all(
                reactor, group.definition_hash, current[change.step].get("depends_on", [])
            )
            at = 0
        else:
            at = standing.get(change.step, 0)
            after = store.deploys.past_step(reactor, group.definition_hash, change.step)
        report.changes.append(
            StepChange(
                change.kind,
                change.step,
                change.detail,
                change.blocks,
                before=max(group.runs - at - after, 0),
                at=at,
                after=after,
            )
        )
    blocking = blocking_steps(shape, current, set(recorded))
    report.would_park, report.parked_ids = store.deploys.recording_any(
        reactor, group.definition_hash, sorted(blocking), sample
    )
    return report


def _merge(into: ReactorRuns, other: ReactorRuns, sample: int) -> None:
    """The same reactor's runs in another database, added up."""
    into.runs += other.runs
    into.on_current += other.on_current
    by_hash = {d.definition_hash: d for d in into.definitions}
    for theirs in other.definitions:
        ours = by_hash.get(theirs.definition_hash)
        if ours is None:
            into.definitions.append(theirs)
            continue
        ours.runs += theirs.runs
        ours.would_park += theirs.would_park
        ours.parked_ids = (ours.parked_ids + theirs.parked_ids)[:sample]
        counts = {c.step: c for c in theirs.changes}
        ours.changes = [
            StepChange(
                c.kind,
                c.step,
                c.detail,
                c.blocks,
                c.before + counts[c.step].before if c.step in counts else c.before,
                c.at + counts[c.step].at if c.step in counts else c.at,
                c.after + counts[c.step].after if c.step in counts else c.after,
            )
            for c in ours.changes
        ]


def parking_summary(check: DeployCheck) -> Counter[str]:
    """Runs that would park, by reactor (the ``check --deploy`` warning's figures)."""
    return Counter({r.reactor: r.would_park for r in check.reactors if r.would_park})
