"""The deploy check: what the reactors in this code do to the runs in flight, before it is
deployed (``manage.py reactor_deploy_check``, and ``check --deploy --database ...``).

A worker that takes a run checks the steps the run has recorded against the run's reactor in
its code: a recorded step that is gone, or whose implementation or dependencies changed,
parks the run ``definition_changed`` (``ReactorDefinition.incompatibilities``); a run of a
reactor the code lacks parks ``reactor_missing``; a run of a version the code lacks
(``Meta.version``), or of a definition recorded after the code's (newer code: a rollback),
waits for a worker with its code. This module runs the same rules over every
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
from ..exceptions import ReactorNotRegistered, VersionMissing
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
    """A reactor with runs in flight: how many run the code's definition (of their version),
    and the others by the definition they started under. ``missing``: the code has no such
    reactor, so every run of it would park ``reactor_missing``. ``waiting``: runs whose code
    this code lacks, which would wait for a worker with it (never run by this code), by what
    they started on (``version 1``, or a newer definition)."""

    reactor: str
    current: str
    runs: int
    on_current: int
    definitions: list[DefinitionRuns] = field(default_factory=list)
    missing: bool = False
    version: str = ""
    waiting: dict[str, int] = field(default_factory=dict)

    @property
    def would_wait(self) -> int:
        """Its runs that would wait for code this code lacks."""
        return sum(self.waiting.values())

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
            "version": self.version or None,
            "missing": self.missing,
            "runs": self.runs,
            "runs_on_this_definition": self.on_current,
            "would_park": self.would_park,
            "would_wait": self.would_wait,
            "waiting": dict(self.waiting),
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

    @property
    def would_wait(self) -> int:
        """Runs in flight that would wait for code this code lacks."""
        return sum(r.would_wait for r in self.reactors)

    @property
    def ok(self) -> bool:
        """Whether every run in flight goes on under this code."""
        return not self.would_park and not self.would_wait

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "ok": self.ok,
            "would_park": self.would_park,
            "would_wait": self.would_wait,
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
            current = registry.get(reactor).definition
        except ReactorNotRegistered:
            found.append(ReactorRuns(reactor, "", total, 0, missing=True))
            continue
        report = ReactorRuns(reactor, current.definition_hash, total, 0, version=current.version)
        for group in groups:
            try:
                definition = registry.of_run(reactor, group.version).definition
            except VersionMissing:
                label = f"version {group.version}"
                report.waiting[label] = report.waiting.get(label, 0) + group.runs
                continue
            if group.definition_hash == definition.definition_hash:
                report.on_current += group.runs
                continue
            if store.deploys.recorded_after(group.definition_hash, definition.definition_hash):
                label = f"definition {group.definition_hash[:12]} (newer code)"
                report.waiting[label] = report.waiting.get(label, 0) + group.runs
                continue
            stored = shapes.get(group.definition_hash)
            report.definitions.append(
                _definition_runs(reactor, group, stored, definition.shape, sample)
            )
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
    for label, runs in other.waiting.items():
        into.waiting[label] = into.waiting.get(label, 0) + runs
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
    """Runs that would park or wait for other code, by reactor (the ``check --deploy``
    warning's figures)."""
    return Counter(
        {
            r.reactor: r.would_park + r.would_wait
            for r in check.reactors
            if r.would_park or r.would_wait
        }
    )
