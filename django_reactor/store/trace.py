"""A run's trace as stored: ``ExecutionEvent`` rows, and the step records that stand for the
entry of the step they record.

Every completed or skipped step writes its step record and a ``run`` (or ``skip``) trace entry
with the same sequence number and time. The store keeps that entry in the step record itself
(``StepRecord.traced``, with its ``duration_ms``) instead of in a row of its own: one heap row
and two index entries fewer per step. Reading the trace (``reads.event_rows``, one statement:
``sql.TRACE``) puts them back in place, so the trace reads exactly as written
(``tests/integration/test_checkpoint_paths.py``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import cast

from ..engine.journal import Event, StepWrite
from ..models import ExecutionEvent, StepRecord
from ..states import EventKind, StepStatus

#: The entry each step status's record stands for.
_KIND_OF = {StepStatus.COMPLETED: EventKind.RUN, StepStatus.SKIPPED: EventKind.SKIP}


def folded(step: StepWrite | None, events: Sequence[Event]) -> tuple[Event | None, list[Event]]:
    """The entry ``step``'s record stands for (if any), and the events still to insert."""
    if step is None:
        return None, list(events)
    kind = _KIND_OF.get(step.status)  # type: ignore[call-overload]
    for index, event in enumerate(events):
        if (
            event.kind == kind
            and event.seq == step.seq
            and event.step == step.step
            and event.at == step.finished_at
            and event.attempt == step.attempts
            and not event.data
        ):
            return event, [*events[:index], *events[index + 1 :]]
    return None, list(events)


def entry_of(record: StepRecord) -> ExecutionEvent:
    """The trace entry a traced step record stands for (not saved)."""
    return ExecutionEvent(
        execution_id=record.execution_id,
        seq=record.seq,
        kind=_KIND_OF.get(record.status, EventKind.RUN),  # type: ignore[call-overload]
        step=record.step,
        attempt=record.attempts,
        at=cast(dt.datetime, record.finished_at),  # a traced record is written finished
        duration_ms=record.duration_ms,
        data={},
    )
