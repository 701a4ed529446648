"""The child runner of a :class:`~.memory_world.World`'s executions: composed children and
async units (``runtime.children.DatabaseChildRunner``) and inline maps (``runtime.maps``).

A child is an execution of the world's, continued from its own records when its parent runs
its step again: a finished child gives its outcome, a child rolling back finishes its rollback.

Map elements are kept as ``store.maps`` keeps them and run and undone as ``runtime.maps``
does them. Each element slot is written when its chunk settles; a chunk is claimed first (the
claim of the next chunk commits with the settle of the last, as in ``store.maps.settle``). A
chunk a dead process claimed and never settled is, when the map is continued, settled failed:
part of its elements' work may be done and nothing records how to undo it
(``store.maps.abandon_running``); a chunk a dead process was undoing is taken again, as a
lapsed claim is.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django_reactor.engine.constructs.map import MapDone, MapSpec, MapStopped
from django_reactor.engine.elements import (
    ElementOutcome,
    element_id,
    rollback_element,
    run_element,
)
from django_reactor.engine.outcomes import (
    Cancelled,
    Completed,
    ErrorInfo,
    ErrorKind,
    Failed,
    Halted,
    Outcome,
    RollbackFailure,
)
from django_reactor.engine.serialization import decode, encode
from django_reactor.engine.spec import ReactorDefinition
from django_reactor.engine.state import RunState
from django_reactor.states import (
    TERMINAL_STATUSES,
    ElementStatus,
    ExecutionStatus,
    MapStatus,
    StepStatus,
)

if TYPE_CHECKING:
    from tests.unit.engine.memory_world import RunRow, World

FINISHED = TERMINAL_STATUSES | {ExecutionStatus.NEEDS_ATTENTION, ExecutionStatus.ABORTED}


@dataclass
class Chunk:
    first: int
    size: int
    status: str = "pending"  # pending, running, settled, not_started, undoing, undone
    holder: int = 0  # the fence of the process that claimed it

    @property
    def indices(self) -> range:
        return range(self.first, self.first + self.size)


@dataclass
class Slot:
    item: Any
    status: str = ElementStatus.PENDING
    value: Any = None
    error: Any = None
    undo: Any = None


@dataclass
class MapRow:
    """A map's elements, as ``store.maps`` keeps them (inline maps only)."""

    map_id: uuid.UUID
    atomic: bool
    tolerated: int | None
    shared: Any
    slots: list[Slot]
    chunks: list[Chunk]
    status: str = MapStatus.RUNNING
    stop_reason: str = ""
    failed: int = 0
    halted: int = 0


class MemoryMaps:
    """The world's maps, by label (``"<run>.<step>"``)."""

    def __init__(self, world: World, abandon: Mapping[str, frozenset[int]]) -> None:
        self.world = world
        self.rows: dict[str, MapRow] = {}
        # Reference runs only: elements settled as abandoned instead of run, as the restore
        # of a cut run settles the elements its dead process held.
        self.inject_abandon = dict(abandon)
        # What the restores found: the elements a dead process held, by map.
        self.abandoned: dict[str, set[int]] = {}

    def run_map(self, label: str, spec: MapSpec, source: Any, shared: Any, fence: int) -> Any:
        row = self.rows.get(label)
        if row is None:
            items = [encode(item) for item in source]
            size = spec.config.chunk_size
            with self.world.committing(fence, f"{label}:start"):
                row = MapRow(
                    map_id=uuid.uuid4(),
                    atomic=spec.config.atomic,
                    tolerated=spec.tolerated(len(items)),
                    shared=encode(dict(shared)),
                    slots=[Slot(item) for item in items],
                    chunks=[
                        Chunk(first, min(size, len(items) - first))
                        for first in range(0, len(items), size)
                    ],
                    status=MapStatus.RUNNING if items else MapStatus.SETTLED,
                )
                self.rows[label] = row
        if row.status == MapStatus.RUNNING:
            held = [c for c in row.chunks if c.status == "running"]
            if held:  # the process that claimed them died: their elements count failed
                self._abandon(label, row, held, fence)
            self._forward(label, row, spec, fence)
        return _map_outcome(row, spec)

    def _abandon(self, label: str, row: MapRow, held: list[Chunk], fence: int) -> None:
        indices = [i for chunk in held for i in chunk.indices]
        error = {"kind": ErrorKind.INTERRUPTED, "message": "the element's process stopped"}
        with self.world.committing(fence, f"{label}:abandon{indices}"):
            for chunk in held:
                chunk.status = "settled"
            for index in indices:
                row.slots[index].status = ElementStatus.FAILED
                row.slots[index].error = error
            row.failed += len(indices)
            self.abandoned.setdefault(label, set()).update(indices)
            _settled(row)

    def _claim(self, label: str, row: MapRow, fence: int, *, forward: bool) -> Chunk | None:
        """The next chunk to run (the lowest pending) or to undo (the highest with succeeded
        elements, or one a dead process held), claimed by ``fence``; call inside a commit."""
        if forward:
            if row.stop_reason:
                return None
            chunk = next((c for c in row.chunks if c.status == "pending"), None)
        else:
            chunk = next(
                (
                    c
                    for c in reversed(row.chunks)
                    if (c.status == "undoing" and c.holder != fence)
                    or (
                        c.status == "settled"
                        and any(row.slots[i].status == ElementStatus.SUCCEEDED for i in c.indices)
                    )
                ),
                None,
            )
        if chunk is not None:
            chunk.status = "running" if forward else "undoing"
            chunk.holder = fence
        return chunk

    def _forward(self, label: str, row: MapRow, spec: MapSpec, fence: int) -> None:
        with self.world.committing(fence, f"{label}:claim"):
            chunk = self._claim(label, row, fence, forward=True)
        while chunk is not None:
            if set(chunk.indices) & self.inject_abandon.get(label, frozenset()):
                self._abandon(label, row, [chunk], fence)
                with self.world.committing(fence, f"{label}:claim"):
                    chunk = self._claim(label, row, fence, forward=True)
                continue
            mark = self.world.mark()
            shared = decode(row.shared)
            outcomes: list[ElementOutcome] = []
            failed = row.failed
            for index in chunk.indices:
                if outcomes and (
                    outcomes[-1].status == ElementStatus.HALTED
                    or (failed and (row.tolerated is None or failed > row.tolerated))
                ):  # the map must stop: the rest of the chunk never starts
                    outcomes.append(ElementOutcome(ElementStatus.NOT_STARTED))
                    continue
                item = decode(row.slots[index].item)
                outcomes.append(
                    run_element(
                        spec.element_definition,
                        spec.element_inputs(shared, item),
                        identity=element_id(row.map_id, index),
                        max_retry_delay=0.0,
                        sleep=no_waiting,
                    )
                )
                failed += outcomes[-1].status == ElementStatus.FAILED
            keys = self.world.calls_since(mark)
            site = f"{label}:settle{list(chunk.indices)}"
            with self.world.committing(fence, site, covers=keys, final=keys):
                for index, outcome in zip(chunk.indices, outcomes, strict=True):
                    slot = row.slots[index]
                    slot.status, slot.value = outcome.status, outcome.value
                    slot.error, slot.undo = outcome.error, outcome.undo
                    row.failed += outcome.status == ElementStatus.FAILED
                    row.halted += outcome.status == ElementStatus.HALTED
                chunk.status = "settled"
                _settled(row)
                chunk = self._claim(label, row, fence, forward=True)

    def rollback_map(self, label: str, spec: MapSpec, fence: int) -> list[RollbackFailure]:
        row = self.rows.get(label)
        if row is None:
            return []
        if row.status == MapStatus.RUNNING:
            held = [c for c in row.chunks if c.status == "running"]
            if held:
                self._abandon(label, row, held, fence)
            with self.world.committing(fence, f"{label}:stop"):
                _stop(row, "cancelled")
                _settled(row)
        if row.status == MapStatus.SETTLED:
            with self.world.committing(fence, f"{label}:undo-start"):
                succeeded = any(s.status == ElementStatus.SUCCEEDED for s in row.slots)
                row.status = MapStatus.ROLLING_BACK if succeeded else MapStatus.ROLLED_BACK
        if row.status == MapStatus.ROLLING_BACK:
            with self.world.committing(fence, f"{label}:undo-claim"):
                chunk = self._claim(label, row, fence, forward=False)
            while chunk is not None:
                mark = self.world.mark()
                shared = decode(row.shared)
                undone: dict[int, list[RollbackFailure]] = {}
                for index in reversed(chunk.indices):
                    slot = row.slots[index]
                    if slot.status == ElementStatus.SUCCEEDED:
                        undone[index] = rollback_element(
                            spec.element_definition,
                            spec.element_inputs(shared, decode(slot.item)),
                            slot.undo,
                            identity=element_id(row.map_id, index),
                        )
                keys = self.world.calls_since(mark)
                site = f"{label}:undo-settle{list(chunk.indices)}"
                with self.world.committing(fence, site, covers=keys, final=keys):
                    for index, failures in undone.items():
                        slot = row.slots[index]
                        slot.status = (
                            ElementStatus.UNDO_FAILED if failures else ElementStatus.UNDONE
                        )
                        slot.error = [f.to_dict() for f in failures] or slot.error
                    chunk.status = "undone"
                    chunk = self._claim(label, row, fence, forward=False)
                    if chunk is None and not any(c.status == "undoing" for c in row.chunks):
                        row.status = MapStatus.ROLLED_BACK
        return [
            RollbackFailure(step=f"{label}[{i}]", action="undo", exception_class=None, message="")
            for i, slot in enumerate(row.slots)
            if slot.status == ElementStatus.UNDO_FAILED
        ]


def no_waiting(seconds: float) -> None:
    assert not seconds, f"a worker waited {seconds} s in its process instead of parking"


def _stop(row: MapRow, reason: str) -> None:
    """No new element starts: the chunks never claimed settle ``not_started``."""
    row.stop_reason = row.stop_reason or reason
    for chunk in row.chunks:
        if chunk.status == "pending":
            chunk.status = "not_started"
            for index in chunk.indices:
                row.slots[index].status = ElementStatus.NOT_STARTED


def _settled(row: MapRow) -> None:
    """After a settle: stop the map past its failure line; fan in once nothing is unsettled."""
    if not row.stop_reason and (
        row.halted or (row.failed and (row.tolerated is None or row.failed > row.tolerated))
    ):
        _stop(row, "halted" if row.halted else "failed")
    if row.status == MapStatus.RUNNING and all(
        c.status in ("settled", "not_started") for c in row.chunks
    ):
        row.status = MapStatus.SETTLED


def _map_outcome(row: MapRow, spec: MapSpec) -> MapDone | MapStopped:
    """The settled map as its step's outcome (``runtime.maps._outcome``)."""
    if row.status in (MapStatus.ROLLING_BACK, MapStatus.ROLLED_BACK):
        return MapStopped(error=ErrorInfo(kind=ErrorKind.STEP, message="rolled back"))
    if row.stop_reason == "halted":
        return MapStopped(halt_reason="a map element halted")
    if row.failed:
        index = next(i for i, s in enumerate(row.slots) if s.status == ElementStatus.FAILED)
        inner = ErrorInfo.from_dict(row.slots[index].error)
        return MapStopped(
            error=ErrorInfo(
                kind=inner.kind,
                message=f"map element {index} (of {len(row.slots)}) failed: {inner.message}",
                retryable=False,
            )
        )
    values = [decode(s.value) for s in row.slots if s.status == ElementStatus.SUCCEEDED]
    collect = spec.config.collect
    return MapDone(collect(values) if collect is not None else values)


def outcome_of(row: RunRow) -> Outcome:
    """The outcome of a finished execution as its records say (``store.outcome_of``)."""
    journal = row.journal
    status = row.status
    if status == ExecutionStatus.COMPLETED:
        return Completed(execution_id=journal.execution_id, value=decode(journal.result))
    if status in (ExecutionStatus.FAILED, ExecutionStatus.NEEDS_ATTENTION) and journal.failure:
        error = ErrorInfo.from_dict(dict(journal.failure))
        return Failed(execution_id=journal.execution_id, error=error, status=status)
    if status == ExecutionStatus.HALTED:
        result = journal.result or {}
        return Halted(
            execution_id=journal.execution_id,
            reason=decode(result.get("reason")),
            step=result.get("halted_at"),
        )
    assert status == ExecutionStatus.CANCELLED, f"{row.label} is {status}, not finished"
    return Cancelled(execution_id=journal.execution_id)


class MemoryRunner:
    """The child runner of one execution (``runtime.children.DatabaseChildRunner`` and
    ``runtime.maps.MapRunnerMixin``, in the world): composed children, async units, maps."""

    def __init__(self, world: World, label: str, fence: int) -> None:
        self.world = world
        self.label = label
        self.fence = fence

    def _label(self, step: str) -> str:
        return f"{self.label}.{step}"

    def run(self, step: str, definition: ReactorDefinition, inputs: Mapping[str, Any]) -> Outcome:
        """Run a new child, or continue one from its records: a finished child gives its
        outcome, a child rolling back finishes its rollback."""
        world = self.world
        row = world.runs.get(self._label(step))
        if row is None:
            row = world.create(self._label(step), "child", definition, inputs, self.fence)
        if row.status in FINISHED:
            return outcome_of(row)
        if row.status == ExecutionStatus.PAUSED:
            row.journal.statuses.append(ExecutionStatus.RUNNING)  # adopt_child(continuing)
        return world.segment(row, self.fence)

    def accepted(self, step: str) -> tuple[str, ...] | None:
        row = self.world.runs.get(self._label(step))
        if row is None or row.status != ExecutionStatus.PAUSED:
            return ()
        resumed = [n for n, w in row.journal.steps.items() if w.status == StepStatus.RESUMED]
        return tuple(resumed) or None

    def rollback(self, step: str) -> list[RollbackFailure]:
        row = self.world.runs.get(self._label(step))
        if row is None:
            return []
        state = RunState.restore(row.definition, row.journal.read())
        if not state.undo_stack and not state.pending_compensation:
            return []
        executor = self.world.executor(row, state, self.fence)
        return executor.finish_rollback("its parent rolled back")

    def dispatch(self, step: str, definition: ReactorDefinition, inputs: Mapping[str, Any]) -> Any:
        row = self.world.runs.get(self._label(step))
        if row is None:  # dispatched before a crash: never twice
            row = self.world.create(self._label(step), "unit", definition, inputs, self.fence)
        return row.journal.execution_id

    def settle(self, step: str, *, wait: bool) -> Outcome | None:
        assert not wait, "a worker never waits for a unit in its process"
        row = self.world.runs[self._label(step)]
        return outcome_of(row) if row.status in FINISHED else None

    def run_map(self, step: str, spec: MapSpec, source: Any, shared: Mapping[str, Any]) -> Any:
        assert not spec.fan_out, "the world runs inline maps only"
        return self.world.maps.run_map(self._label(step), spec, source, shared, self.fence)

    def map_parked(self, step: str) -> None:
        return None

    def rollback_map(self, step: str, spec: MapSpec) -> list[RollbackFailure]:
        return self.world.maps.rollback_map(self._label(step), spec, self.fence)
