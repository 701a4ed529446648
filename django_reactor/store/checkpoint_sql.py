"""The routine checkpoint's one statement on PostgreSQL (``dialects.PostgreSQL.checkpoint``).

The run's update (conditional on its fence), the step's record, the rollback's update, the
trace events and the attributes the step set, as data-modifying CTEs of one statement: one
round trip. The statement returns ``cancel_requested_at, cancel_reason`` of the run and the
pause that applies to it (see ``sql.PAUSE_OF_RUN``), or no row when the fence moved on. The ORM
path (``checkpoint.DatabaseJournal``) writes the same rows
(``tests/integration/test_checkpoint_paths.py``).

What differs from one checkpoint to the next is described once, in :data:`RECORD_WRITES` (how
the step's record is written) and the pieces below; a statement's text depends only on which
pieces it takes, so it is put together once per shape (and prepared once per connection). No
piece writes an indexed column of the run's row: a checkpoint is a HOT update.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import json
import uuid
from typing import Any

from django.utils import timezone

from ..engine.journal import UNSET, Event, JournalBatch, RollbackWrite, StepWrite
from . import trace
from .sql import (
    ATTRIBUTE,
    ENTRY_KIND,
    EVENT,
    EXECUTION,
    INSERT_ATTRIBUTES,
    PAUSE_OF_RUN,
    STEP_RECORD,
    attribute_rows,
)

#: ``json.dumps`` with its defaults (its encoder, without its frame): a checkpoint encodes
#: its step's arguments and result, its events' data, the run's result or failure.
_json = json.JSONEncoder().encode


class RecordWrite(enum.StrEnum):
    """How the statement writes the step's record (a string enum: hashed as its text, in C,
    where the statement's text is looked up by shape)."""

    #: Update the step's record if it has one (a retried step), else insert it.
    REPLACE = "replace"
    #: Insert it without looking for one (the step is believed new), in autocommit: a unique
    #: violation says the belief was wrong, and the statement did nothing.
    INSERT = "insert"
    #: Insert it only if the step has none (inside a transaction, which a violation would
    #: end); the statement returns a third column, 0 when it inserted nothing.
    INSERT_IF_ABSENT = "insert if absent"


#: The run's update; ``{sets}``: what the batch changes; ``{returning}``: the run's creation
#: time besides, when the step set attributes (they keep a copy of it).
_UPDATE_RUN = (
    f"ex AS (UPDATE {EXECUTION} SET {{sets}} WHERE id = %s AND fence = %s "
    "RETURNING id, reactor, parent_id, cancel_requested_at, cancel_reason{returning})"
)

#: The step's values, named once for whichever write takes them.
_STEP_VALUES = (
    "sv (step, status, seq, attempts, arguments, secret_arguments, result, error, "
    "compensable, started_at, finished_at, traced, duration_ms) AS (VALUES "
    "(%s::varchar, %s::varchar, %s::integer, %s::integer, %s::jsonb, %s::jsonb, "
    "%s::jsonb, %s::jsonb, %s::boolean, %s::timestamptz, %s::timestamptz, %s::boolean, "
    "%s::float8))"
)

#: A record about to be replaced that stood for a trace entry leaves that entry as an event
#: row (the trace stays append-only; a step checkpointed twice shows twice).
_KEEP_TRACE_ENTRY = (
    f"kp AS (INSERT INTO {EVENT} (execution_id, seq, kind, step, attempt, at, "
    "duration_ms, data) SELECT r.execution_id, r.seq, "
    f"{ENTRY_KIND.format(r='r.')}, r.step, r.attempts, r.finished_at, r.duration_ms, "
    f"'{{}}'::jsonb FROM {STEP_RECORD} AS r, ex, sv "
    "WHERE r.execution_id = ex.id AND r.step = sv.step AND r.traced)"
)

#: The step's record, if it has one, updated in place.
_UPDATE_RECORD = (
    f"su AS (UPDATE {STEP_RECORD} AS r SET status = sv.status, seq = sv.seq, "
    "attempts = sv.attempts, arguments = sv.arguments, "
    "secret_arguments = sv.secret_arguments, result = sv.result, error = sv.error, "
    "compensable = sv.compensable, rollback = '', rollback_error = NULL, "
    "rolled_back_at = NULL, started_at = sv.started_at, "
    "finished_at = sv.finished_at, traced = sv.traced, duration_ms = sv.duration_ms "
    "FROM ex, sv WHERE r.execution_id = ex.id AND r.step = sv.step RETURNING r.id)"
)

#: The step's record inserted; ``{only_if}``: the condition that guards the insert, if any.
_INSERT_RECORD = (
    f"st AS (INSERT INTO {STEP_RECORD} (execution_id, step, status, seq, attempts, "
    "arguments, secret_arguments, result, error, compensable, rollback, started_at, "
    "finished_at, traced, duration_ms) SELECT ex.id, sv.step, sv.status, sv.seq, "
    "sv.attempts, sv.arguments, sv.secret_arguments, sv.result, sv.error, "
    "sv.compensable, '', sv.started_at, sv.finished_at, sv.traced, sv.duration_ms "
    "FROM ex, sv{only_if})"
)

#: Each way of writing the step's record: its CTEs, after the run's update.
RECORD_WRITES: dict[RecordWrite, tuple[str, ...]] = {
    # An update, else an insert: not INSERT ... ON CONFLICT, whose speculative insertion
    # costs a WAL record more per step.
    RecordWrite.REPLACE: (
        _STEP_VALUES,
        _KEEP_TRACE_ENTRY,
        _UPDATE_RECORD,
        _INSERT_RECORD.format(only_if=" WHERE NOT EXISTS (SELECT 1 FROM su)"),
    ),
    RecordWrite.INSERT: (_STEP_VALUES, _INSERT_RECORD.format(only_if="")),
    RecordWrite.INSERT_IF_ABSENT: (
        _STEP_VALUES,
        _INSERT_RECORD.format(
            only_if=f" WHERE NOT EXISTS (SELECT 1 FROM {STEP_RECORD} AS r "
            "WHERE r.execution_id = ex.id AND r.step = sv.step) RETURNING 1"
        ),
    ),
}

#: What a rollback did to one step, on its record.
_ROLLBACK = (
    f"rb AS (UPDATE {STEP_RECORD} SET rollback = %s, "
    "rollback_error = %s::jsonb, rolled_back_at = %s "
    "WHERE execution_id = (SELECT id FROM ex) AND step = %s)"
)

#: The trace events; ``{rows}``: one row of placeholders each.
_EVENTS = (
    f"ev AS (INSERT INTO {EVENT} (execution_id, seq, kind, step, "
    "attempt, at, duration_ms, data) SELECT ex.id, v.seq, v.kind, v.step, v.attempt, "
    "v.at, v.duration_ms, v.data FROM ex CROSS JOIN (VALUES {rows}) "
    "AS v(seq, kind, step, attempt, at, duration_ms, data))"
)
_EVENT_ROW = "(%s::integer, %s, %s, %s::integer, %s::timestamptz, %s::float8, %s::jsonb)"

#: The attributes the step set, each inserted or its value replaced.
_SET_ATTRIBUTES = INSERT_ATTRIBUTES.format(
    name="sa",
    rows="{rows}",
    on=" ON CONFLICT (execution_id, key) DO UPDATE SET value = EXCLUDED.value",
)

#: The attributes the step removed (``%s``: their keys).
_REMOVE_ATTRIBUTES = (
    f"ra AS (DELETE FROM {ATTRIBUTE} WHERE execution_id = (SELECT id FROM ex) "
    "AND key = ANY(%s::varchar[]))"
)


def statement(
    execution_id: uuid.UUID,
    fence: int,
    batch: JournalBatch,
    record: RecordWrite = RecordWrite.REPLACE,
) -> tuple[str, list[Any]]:
    """The one statement of a routine checkpoint of ``batch``, and its parameters (in the
    order of the statement's pieces)."""
    sets, params = _run_changes(batch, timezone.now())
    params += [execution_id, fence]
    step = batch.step
    entry, events = trace.folded(step, batch.events)
    if step is not None:
        params += _step_values(step, entry)
    if batch.rollback is not None:
        params += _rollback_values(batch.rollback)
    for event in events:
        params += _event_values(event)
    attributes_set = 0
    removed: list[str] = []
    if batch.attributes:
        for key, value in batch.attributes.items():
            if value is None:
                removed.append(key)
            else:
                params += [key, value]
                attributes_set += 1
        if removed:
            params.append(removed)
    text = _text(
        sets,
        record if step is not None else None,
        batch.rollback is not None,
        len(events),
        attributes_set,
        bool(removed),
    )
    return text, params


@functools.lru_cache(maxsize=1024)
def _text(
    sets: tuple[str, ...],
    record: RecordWrite | None,
    rollback: bool,
    events: int,
    attributes_set: int = 0,
    attributes_removed: bool = False,
) -> str:
    """The statement's text for one shape of checkpoint."""
    created = ", created_at" if attributes_set else ""
    pieces = [_UPDATE_RUN.format(sets=", ".join(sets), returning=created)]
    if record is not None:
        pieces += RECORD_WRITES[record]
    if rollback:
        pieces.append(_ROLLBACK)
    if events:
        pieces.append(_EVENTS.format(rows=", ".join([_EVENT_ROW] * events)))
    if attributes_set:
        pieces.append(_SET_ATTRIBUTES.format(rows=attribute_rows(attributes_set)))
    if attributes_removed:
        pieces.append(_REMOVE_ATTRIBUTES)
    returned = f"cancel_requested_at, cancel_reason, {PAUSE_OF_RUN.format(run='ex')}"
    if record is RecordWrite.INSERT_IF_ABSENT:
        returned += ", (SELECT count(*) FROM st)"
    return "WITH " + ", ".join(pieces) + f" SELECT {returned} FROM ex"


def _run_changes(batch: JournalBatch, now: dt.datetime) -> tuple[tuple[str, ...], list[Any]]:
    """What the batch changes on the run's row: the ``SET`` clauses and their parameters."""
    sets = ["updated_at = %s"]
    params: list[Any] = [now]
    if batch.finished:
        sets.append("lease_owner = NULL, lease_expires_at = NULL, finished_at = %s")
        params.append(now)
    elif batch.release:  # parked: nobody owns it until it is woken
        sets.append("lease_owner = NULL, lease_expires_at = NULL")
    # Otherwise the lease is left alone: the heartbeat (``lease.LeaseKeeper``) extends it, and
    # a checkpoint that writes no indexed column is a HOT update.
    if batch.current_step is not None:
        sets.append("current_step = %s")
        params.append(batch.current_step)
    # As in the ORM path: a park sets the wake-up; otherwise a step's outcome ends any waiting.
    if batch.wake_after is not None:
        sets.append("wake_at = %s")
        params.append(now + dt.timedelta(seconds=batch.wake_after))
    if batch.wake_after is None and batch.step is not None:
        sets.append("current_attempt = 0, wake_at = NULL")
    elif batch.current_attempt is not None:
        sets.append("current_attempt = %s")
        params.append(batch.current_attempt)
    if batch.status is not None:
        sets.append("status = %s")
        params.append(str(batch.status))
    if batch.result is not UNSET:
        sets.append("result = %s::jsonb")
        params.append(_json(batch.result))
    if batch.failure is not UNSET:
        sets.append("failure = %s::jsonb")
        params.append(None if batch.failure is None else _json(batch.failure))
    return tuple(sets), params


def _step_values(step: StepWrite, entry: Event | None) -> list[Any]:
    """``sv``'s row: the step's record (``entry``: the trace entry it stands for, if any)."""
    return [
        step.step,
        str(step.status),
        step.seq,
        step.attempts,
        _json(step.arguments) if step.arguments else "{}",
        _json([list(p) for p in step.secret_arguments]) if step.secret_arguments else "[]",
        _json(step.result),
        None if step.error is None else _json(step.error),
        step.compensable,
        step.started_at,
        step.finished_at,
        entry is not None,
        entry.duration_ms if entry is not None else None,
    ]


def _rollback_values(rollback: RollbackWrite) -> list[Any]:
    return [
        str(rollback.status),
        None if rollback.error is None else _json(rollback.error),
        rollback.at,
        rollback.step,
    ]


def _event_values(e: Event) -> list[Any]:
    return [e.seq, str(e.kind), e.step, e.attempt, e.at, e.duration_ms, _json(e.data)]
