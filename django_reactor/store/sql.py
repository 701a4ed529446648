"""The store's hand-written SQL: each statement named, tables taken from the models'
``_meta`` (the checkpoint's, put together from its pieces, in :mod:`.checkpoint_sql`), and the
one function that sends a statement on Django's connection. PostgreSQL's dialect sends them
(``store.dialects``).

Hand-written where the ORM costs more than the statement on a hot path (every checkpoint, every
claim, every settle of map elements), or cannot say it in one round trip.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from django.db import DatabaseError, connections, models

try:
    import psycopg
except ImportError:  # psycopg2 or another driver: statements go through Django's cursor
    psycopg = None  # type: ignore[assignment]

from ..conf import reactor_settings
from ..models import (
    BatchItem,
    CancelSubscription,
    Definition,
    Dispatch,
    Execution,
    ExecutionAttribute,
    ExecutionEvent,
    Interrupt,
    MapChunk,
    MapResult,
    MapRun,
    MapTally,
    Message,
    PatchDecision,
    Pause,
    Schedule,
    ScheduleFire,
    StepRecord,
)
from .db import logger, using

#: A statement's parameters: positional (``%s``) or named (``%(name)s``).
Params = Sequence[Any] | Mapping[str, Any]

T = TypeVar("T")
P = ParamSpec("P")

EXECUTION = Execution._meta.db_table
STEP_RECORD = StepRecord._meta.db_table
EVENT = ExecutionEvent._meta.db_table
ATTRIBUTE = ExecutionAttribute._meta.db_table
DISPATCH = Dispatch._meta.db_table
DEFINITION = Definition._meta.db_table
MAP_RESULT = MapResult._meta.db_table
MAP_RUN = MapRun._meta.db_table
MAP_CHUNK = MapChunk._meta.db_table
MAP_TALLY = MapTally._meta.db_table
INTERRUPT = Interrupt._meta.db_table
MESSAGE = Message._meta.db_table
CANCEL_SUBSCRIPTION = CancelSubscription._meta.db_table
PAUSE = Pause._meta.db_table
BATCH_ITEM = BatchItem._meta.db_table
PATCH_DECISION = PatchDecision._meta.db_table

#: The pause that applies to run ``{run}`` (a relation with ``id``, ``reactor``, ``parent_id``):
#: its own, else its reactor's, as ``[reason, paused_by, of the reactor]``; NULL when none (or
#: for a child run, which goes on with its parent).
PAUSE_OF_RUN = (
    "(SELECT json_build_array(p.reason, p.paused_by, p.execution_id IS NULL) "
    f"FROM {PAUSE} AS p WHERE {{run}}.parent_id IS NULL AND p.reactor = {{run}}.reactor "
    "AND (p.execution_id IS NULL OR p.execution_id = {run}.id) "
    "ORDER BY p.execution_id NULLS LAST LIMIT 1)"
)
SCHEDULE = Schedule._meta.db_table
SCHEDULE_FIRE = ScheduleFire._meta.db_table

#: The highest trace sequence number of a run (its events, and the step records that stand for
#: their trace entry: ``store.trace``).
LAST_SEQ = f"""SELECT MAX(seq) FROM (
    SELECT seq FROM {EVENT} WHERE execution_id = %(id)s
    UNION ALL SELECT seq FROM {STEP_RECORD} WHERE execution_id = %(id)s AND traced) AS t"""

#: A run's attributes (``{rows}``: ``(%s, %s)`` per key and value) inserted with the run's row,
#: the data-modifying CTE ``ex`` that returns its id and creation time; ``{on}``: what a key
#: the run has already does.
INSERT_ATTRIBUTES = (
    f"{{name}} AS (INSERT INTO {ATTRIBUTE} (execution_id, key, value, run_created_at) "
    "SELECT ex.id, v.key, v.value, ex.created_at FROM ex CROSS JOIN (VALUES {rows}) "
    "AS v(key, value){on})"
)


def attribute_rows(count: int) -> str:
    """``{rows}`` of :data:`INSERT_ATTRIBUTES` for ``count`` attributes."""
    return ", ".join(["(%s::varchar, %s::varchar)"] * count)


#: The trace entry kind a traced step record (``{r}``: its table's alias and a dot) stands for
#: (``store.trace``), in SQL.
ENTRY_KIND = "CASE WHEN {r}status = 'skipped' THEN 'skip' ELSE 'run' END"

#: A run's whole trace in sequence order: its events, and the entries its step records stand
#: for (``store.trace``; those have no event id).
TRACE = f"""
SELECT id, execution_id, seq, kind, step, attempt, at, duration_ms, data FROM {EVENT}
    WHERE execution_id = %(id)s
UNION ALL
SELECT NULL, execution_id, seq, {ENTRY_KIND.format(r="")}, step, attempts, finished_at,
    duration_ms, '{{}}' FROM {STEP_RECORD}
    WHERE execution_id = %(id)s AND traced
ORDER BY seq"""

#: A run's step records in completion order (raw: this runs on every resume).
STEP_ROWS = f"SELECT * FROM {STEP_RECORD} WHERE execution_id = %s ORDER BY seq"

#: Mark dispatches the sweeper published again sent (``{ids}``: one placeholder per id).
MARK_SENT = f"UPDATE {DISPATCH} SET sent_at = %s WHERE id IN ({{ids}})"

#: The sweeper ends the sleeps that are over of the runs it wakes (``store.sleeps``), in one
#: statement: each ``sleeping`` record of ``%(ids)s`` (record ids, whose time has come) is
#: written completed, as the worker would write it (one attempt, started and finished at
#: ``%(now)s``, its ``run`` trace entry with its run's next sequence number; the ``sleep``
#: entry of the trace keeps when it began). Returns how many.
END_SLEEPS = f"""
WITH due AS (
    SELECT r.id, row_number() OVER (PARTITION BY r.execution_id ORDER BY r.seq) AS n,
        GREATEST(
            (SELECT COALESCE(MAX(ev.seq), 0) FROM {EVENT} ev
                WHERE ev.execution_id = r.execution_id),
            (SELECT COALESCE(MAX(sr.seq), 0) FROM {STEP_RECORD} sr
                WHERE sr.execution_id = r.execution_id AND sr.traced)) AS last
    FROM {STEP_RECORD} r
    WHERE r.id = ANY(%(ids)s) AND r.status = 'sleeping' AND NOT r.traced
), ended AS (
    UPDATE {STEP_RECORD} AS r SET status = 'completed', seq = due.last + due.n, attempts = 1,
        started_at = %(now)s, finished_at = %(now)s, traced = true, duration_ms = 0
    FROM due WHERE r.id = due.id
    RETURNING 1
)
SELECT count(*) FROM ended
"""

#: Test time moves (``time_in_tests.shift_due_times``): the time each sleep waits until (its
#: record's result, ISO 8601 text) comes ``%(seconds)s`` closer, written as Python's
#: ``isoformat()`` writes it in UTC, in one statement (a time that does not read is left as it
#: is).
SHIFT_SLEEPS = f"""
UPDATE {STEP_RECORD} SET result = to_jsonb(to_char(
    ((result #>> '{{}}')::timestamptz - make_interval(secs => %(seconds)s)) AT TIME ZONE 'UTC',
    'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))
WHERE status = 'sleeping' AND jsonb_typeof(result) = 'string'
    AND (result #>> '{{}}') ~ '^\\d{{4}}-\\d{{2}}-\\d{{2}}[T ]\\d{{2}}:\\d{{2}}'
"""

# ---------------------------------------------------------------------------- maps
#
# A map's elements are claimed and settled a chunk at a time (``store.maps``): the chunk row
# holds the claim and its lease (an element in flight is an item of a held chunk); an
# element's slot is written once, when its chunk settles (again only when an undo settles).

#: A batch of a map's source items as pending chunks: pieces ``(first index of the chunk, size
#: of the chunk up to the piece's end, items)``. A piece that starts inside a chunk (the batch
#: before ended there) keeps the chunk's items before it; a re-read overwrites them.
WRITE_CHUNKS = f"""
INSERT INTO {MAP_CHUNK} AS c (map_run_id, first, size, items, status, attempts, claimed_by,
    succeeded)
SELECT %s, u.first, u.size, u.items::jsonb, 'pending', 0, '', 0
FROM unnest(%s::int[], %s::int[], %s::text[]) AS u(first, size, items)
ON CONFLICT (map_run_id, first) DO UPDATE SET
    items = (SELECT COALESCE(jsonb_agg(e.x ORDER BY e.n), '[]'::jsonb)
        FROM jsonb_array_elements(c.items) WITH ORDINALITY AS e(x, n)
        WHERE e.n <= EXCLUDED.size - jsonb_array_length(EXCLUDED.items)) || EXCLUDED.items,
    size = EXCLUDED.size, status = 'pending'
"""

#: The chunk a claim takes: the first one never claimed (``fresh``, in ``{order}``), else the
#: first whose holder's lease lapsed (``taken`` and expired: its process died). Each lookup is
#: served by the (map, status, first) index. ``{{exclude}}`` leaves out the chunk the same
#: statement settles (its lease may have lapsed: it is still ``taken`` in the statement's
#: snapshot).
_PICK_CHUNK = f"""
pick AS (
    SELECT COALESCE(
        (SELECT id FROM {MAP_CHUNK} WHERE map_run_id = %(map)s AND status = %(fresh)s
            {{fresh_filter}} ORDER BY first {{order}} LIMIT 1 FOR UPDATE SKIP LOCKED),
        (SELECT id FROM {MAP_CHUNK} WHERE map_run_id = %(map)s AND status = %(taken)s
            AND lease_until < now() {{exclude}} ORDER BY first {{order}} LIMIT 1
            FOR UPDATE SKIP LOCKED)
    ) AS id
),
taken AS (
    UPDATE {DISPATCH} SET sent_at = now()
    WHERE map_run_id = %(map)s AND COALESCE(sent_at IS NULL, false)
),
claimed AS (
    UPDATE {MAP_CHUNK} AS c SET status = %(taken)s, claimed_by = %(token)s,
        lease_until = now() + make_interval(secs => %(lease)s),
        attempts = c.attempts + %(plus)s
    FROM pick WHERE c.id = pick.id
    RETURNING c.id, c.first, c.size, c.items, c.attempts
)"""

#: A forward claim: the chunk taken (its dispatches marked sent: the sweeper leaves them).
#: No slot is written: the chunk's items are what runs. Returns ``(chunk id, first index,
#: items, attempts)``, or no row.
CLAIM_CHUNK = f"""
WITH {_PICK_CHUNK.format(fresh_filter="", order="ASC", exclude="")}
SELECT id, first, items::text, attempts FROM claimed
"""

#: A rollback claim: the highest settled chunk with elements to undo (or a lapsed one), and
#: the succeeded slots in it, highest index first: ``(chunk id, index, item, undo)`` rows (one
#: row with a NULL index when none of its slots is left).
CLAIM_UNDO_CHUNK = f"""
WITH {_PICK_CHUNK.format(fresh_filter="AND succeeded > 0", order="DESC", exclude="")}
SELECT claimed.id, r.index, r.item::text, r.undo::text
FROM claimed LEFT JOIN {MAP_RESULT} AS r ON r.map_run_id = %(map)s
    AND r.index >= claimed.first AND r.index < claimed.first + claimed.size
    AND r.status = 'succeeded'
ORDER BY r.index DESC
"""

#: The map's counters moved by a settle (``{{counters}}``), only when the chunk was still held
#: (``ch`` returned it): the map's progress as the settle leaves it. ``updated_at`` (indexed:
#: the sweeper's stalled maps) moves at most once a second, so that most settles leave every
#: indexed column as it was and update the map's row in place (HOT).
_SETTLE_COUNTERS = f"""
run AS (
    UPDATE {MAP_RUN} SET {{counters}}, updated_at = CASE
        WHEN updated_at < %(now)s - interval '1 second' THEN %(now)s ELSE updated_at END
    WHERE id = %(map)s AND EXISTS (SELECT 1 FROM ch)
    RETURNING settled, size, failed, halted, stop_reason, collected, status,
        rollback_settled, rollback_total
)"""

#: A forward settle, fenced by its claim: the chunk (only while ``token`` holds it), its
#: elements' slots written with their outcomes (``outcomes``: a JSON array of ``[index,
#: status, value, error, undo]``; the slot's first write, its item taken from the chunk) and
#: the task's tally (``MapTally``: the map's own row is not written, so that settles of other
#: tasks never wait for this one's commit); with ``{claim}`` the task's next chunk is claimed
#: in the same statement. The progress it returns is the map's counters, the other tallies (as
#: of the statement's snapshot) and this one's.
#: A chunk on its first claim has no slot (only the settle that holds a chunk writes its slots,
#: or the stop of a chunk nobody will claim again), so its slots are inserted plainly (``{again}``
#: empty): no speculative insertion, one WAL record fewer per element, and one insert, so that
#: ``slots`` is not materialised; a chunk claimed again (its holder died) overwrites any slot
#: it finds (``{again}``: ``SETTLE_AGAIN``). A plain insert that met a slot would fail on the
#: unique index, never skip it. One row: the map's progress (NULLs
#: when the claim was lost: nothing is written then) and the next chunk ``(id, first, items,
#: attempts)`` (NULLs when none was claimed). Atomic on its own: sent in autocommit.
SETTLE_FORWARD = f"""
WITH ch AS (
    UPDATE {MAP_CHUNK} SET status = 'settled', claimed_by = '', lease_until = NULL,
        succeeded = %(succeeded)s
    WHERE id = %(chunk)s AND claimed_by = %(token)s AND status = 'running'
    RETURNING first, items, attempts
),
v AS (
    SELECT (o->>0)::int AS i, o->>1 AS status, NULLIF(o->2, 'null') AS value,
        NULLIF(o->3, 'null') AS error, NULLIF(o->4, 'null') AS undo
    FROM jsonb_array_elements(%(outcomes)s::jsonb) AS o
),
slots AS (
    SELECT %(map)s::uuid AS map_run_id, v.i, v.status, e.item, ch.attempts, v.value, v.error,
        v.undo, %(now)s::timestamptz AS finished_at
    FROM ch CROSS JOIN LATERAL jsonb_array_elements(ch.items) WITH ORDINALITY AS e(item, n)
    JOIN v ON v.i = ch.first + e.n::int - 1
),
sl AS (
    INSERT INTO {MAP_RESULT} AS r (map_run_id, index, status, item, attempts, value, error,
        undo, finished_at)
    SELECT * FROM slots{{again}}
),
tally AS (
    INSERT INTO {MAP_TALLY} AS t (map_run_id, token, settled, succeeded, failed, halted,
        not_started, first_failure)
    SELECT %(map)s, %(token)s, %(settled)s, %(succeeded)s, %(failed)s, %(halted)s,
        %(not_started)s, %(first_failure)s
    FROM ch
    ON CONFLICT (map_run_id, token) DO UPDATE SET settled = t.settled + EXCLUDED.settled,
        succeeded = t.succeeded + EXCLUDED.succeeded, failed = t.failed + EXCLUDED.failed,
        halted = t.halted + EXCLUDED.halted,
        not_started = t.not_started + EXCLUDED.not_started,
        first_failure = COALESCE(t.first_failure, EXCLUDED.first_failure)
    RETURNING settled, failed, halted
),
others AS (
    SELECT COALESCE(sum(settled), 0) AS settled, COALESCE(sum(failed), 0) AS failed,
        COALESCE(sum(halted), 0) AS halted
    FROM {MAP_TALLY} WHERE map_run_id = %(map)s AND token <> %(token)s
),
run AS (
    SELECT m.settled + others.settled + tally.settled AS settled, m.size,
        m.failed + others.failed + tally.failed AS failed,
        m.halted + others.halted + tally.halted AS halted, m.stop_reason, m.collected,
        m.status, m.rollback_settled, m.rollback_total
    FROM {MAP_RUN} AS m, tally, others WHERE m.id = %(map)s
){{claim}}
SELECT run.settled, run.size, run.failed, run.halted, run.stop_reason, run.collected,
    run.status, run.rollback_settled, run.rollback_total, {{next_chunk}}
FROM (SELECT 1) AS one LEFT JOIN run ON true {{join_next}}
"""

#: How ``SETTLE_FORWARD`` inserts the slots of a chunk claimed before: over any it finds.
SETTLE_AGAIN = """
    ON CONFLICT (map_run_id, index) DO UPDATE SET status = EXCLUDED.status,
        attempts = EXCLUDED.attempts, value = EXCLUDED.value, error = EXCLUDED.error,
        undo = EXCLUDED.undo, finished_at = EXCLUDED.finished_at"""

#: What ``SETTLE_FORWARD`` adds to claim the next chunk (another than the one it settles).
SETTLE_FORWARD_CLAIM = ",\n" + _PICK_CHUNK.format(
    fresh_filter="", order="ASC", exclude="AND id <> %(chunk)s"
)

#: An undo's settle, fenced by its claim: the chunk (only while ``token`` holds it), its
#: slots' rollback outcomes (``outcomes``: ``[index, status, rollback error]``) and the map's
#: counters, in one statement. Returns the map's
#: progress, or no row when the claim was lost (nothing is written then).
SETTLE_UNDO = f"""
WITH ch AS (
    UPDATE {MAP_CHUNK} SET status = 'undone', claimed_by = '', lease_until = NULL
    WHERE id = %(chunk)s AND claimed_by = %(token)s AND status = 'undoing'
    RETURNING id
),
sl AS (
    UPDATE {MAP_RESULT} AS r SET status = o->>1, rollback_error = NULLIF(o->2, 'null'),
        finished_at = %(now)s
    FROM ch, jsonb_array_elements(%(outcomes)s::jsonb) AS o
    WHERE r.map_run_id = %(map)s AND r.index = (o->>0)::int
),
{_SETTLE_COUNTERS}
SELECT * FROM run
"""

#: Chunks never claimed of a map that stopped: their slots are written ``not_started``.
#: Returns how many.
NEVER_START = f"""
WITH ch AS (
    UPDATE {MAP_CHUNK} SET status = 'not_started'
    WHERE map_run_id = %(map)s AND status = 'pending'
    RETURNING first, items
),
sl AS (
    INSERT INTO {MAP_RESULT} (map_run_id, index, status, item, attempts, finished_at)
    SELECT %(map)s, ch.first + e.n::int - 1, 'not_started', e.item, 0, %(now)s
    FROM ch CROSS JOIN LATERAL jsonb_array_elements(ch.items) WITH ORDINALITY AS e(item, n)
    ON CONFLICT (map_run_id, index) DO UPDATE
        SET status = 'not_started', finished_at = EXCLUDED.finished_at
    RETURNING 1
)
SELECT count(*) FROM sl
"""


#: A schedule's tick, recorded unless it is already (``store.schedules``). Of any number of
#: sweepers racing for a tick, one inserts the row; the others wait for its transaction (the
#: unique index on schedule and fire time) and get no row back, without an error.
INSERT_FIRE = f"""
INSERT INTO {SCHEDULE_FIRE} (schedule_id, fire_at, "until", outcome, manual, note, created_at)
VALUES (%s, %s, %s, %s, %s, '', %s)
ON CONFLICT (schedule_id, fire_at) DO NOTHING
RETURNING id, created_at"""

#: Many schedules' ticks at once (``store.schedules.record_ticks``), PostgreSQL only. Their
#: fire rows, in schedule order (two sweepers inserting overlapping batches wait for each other
#: in one order, never in a cycle): those inserted are this sweeper's.
INSERT_FIRES = f"""
INSERT INTO {SCHEDULE_FIRE} (schedule_id, fire_at, "until", outcome, manual, note, created_at)
VALUES {{rows}}
ON CONFLICT (schedule_id, fire_at) DO NOTHING
RETURNING id, schedule_id, created_at"""
INSERT_FIRES_ROW = "(%s, %s, NULL, %s, false, '', %s)"

#: ... their next fire times moved on, each only if still the one planned from.
ADVANCE_SCHEDULES = f"""
UPDATE {SCHEDULE} AS s
SET next_fire_at = v.following, last_fire_at = v.fire_at, updated_at = %s
FROM (VALUES {{rows}}) AS v (id, fire_at, following)
WHERE s.id = v.id AND s.enabled AND s.next_fire_at = v.fire_at
RETURNING s.id"""
ADVANCE_SCHEDULES_ROW = "(%s::bigint, %s::timestamptz, %s::timestamptz)"

#: ... and what each tick did: its fire's outcome, and the schedule's latest run or queued
#: tick.
SETTLE_FIRES = f"""
WITH v (fire_id, schedule_id, outcome, note, execution_id, queued) AS (VALUES {{rows}}),
fires AS (
    UPDATE {SCHEDULE_FIRE} AS f
    SET outcome = v.outcome, note = v.note, execution_id = v.execution_id
    FROM v WHERE f.id = v.fire_id
)
UPDATE {SCHEDULE} AS s
SET last_execution_id = COALESCE(v.execution_id, s.last_execution_id),
    queued_fire_id = CASE WHEN v.queued THEN v.fire_id ELSE s.queued_fire_id END
FROM v
WHERE s.id = v.schedule_id AND (v.execution_id IS NOT NULL OR v.queued)"""
SETTLE_FIRES_ROW = "(%s::bigint, %s::bigint, %s, %s, %s::uuid, %s::boolean)"


#: One batch of ``store.prune``: the oldest top-level runs past the cutoff whose whole tree has
#: finished (after the last batch's last run, in ``finished_at`` order, so no batch walks the
#: index entries its predecessors deleted), locked (rows another process holds are skipped),
#: deleted with their descendants and everything that points at them; the references other
#: runs, schedules and fires keep to them are set to NULL, as their ``on_delete`` says. The
#: ids go around as arrays, so that every table is reached through its index on the run (or
#: the map), whatever its size. Returns how many top-level runs went, and the last one's
#: ``finished_at`` and id.
PRUNE_BATCH = f"""
WITH picked AS (
    SELECT r.id, r.finished_at FROM {EXECUTION} r
    WHERE r.parent_id IS NULL AND r.status = ANY(%(statuses)s)
        AND r.finished_at IS NOT NULL AND r.finished_at < %(cutoff)s
        AND r.finished_at >= %(after_at)s AND (r.finished_at, r.id) > (%(after_at)s, %(after_id)s)
        AND NOT EXISTS (
            SELECT 1 FROM {EXECUTION} d WHERE d.root_id = r.id AND d.status <> ALL(%(finished)s)
        )
    ORDER BY r.finished_at, r.id
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
),
tree AS (
    SELECT array_agg(id) AS ids FROM (
        SELECT id FROM picked
        UNION ALL
        SELECT d.id FROM {EXECUTION} d
        WHERE d.root_id = ANY(ARRAY(SELECT id FROM picked))
    ) AS t
),
maps AS (
    SELECT array_agg(m.id) AS ids FROM {MAP_RUN} m
    WHERE m.execution_id = ANY((SELECT ids FROM tree)::uuid[])
),
results AS (DELETE FROM {MAP_RESULT} WHERE map_run_id = ANY((SELECT ids FROM maps)::uuid[])),
tallies AS (DELETE FROM {MAP_TALLY} WHERE map_run_id = ANY((SELECT ids FROM maps)::uuid[])),
chunks AS (DELETE FROM {MAP_CHUNK} WHERE map_run_id = ANY((SELECT ids FROM maps)::uuid[])),
dispatches AS (
    DELETE FROM {DISPATCH}
    WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])
        OR map_run_id = ANY((SELECT ids FROM maps)::uuid[])
),
map_runs AS (DELETE FROM {MAP_RUN} WHERE id = ANY((SELECT ids FROM maps)::uuid[])),
records AS (DELETE FROM {STEP_RECORD} WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])),
events AS (DELETE FROM {EVENT} WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])),
attributes AS (
    DELETE FROM {ATTRIBUTE} WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])
),
interrupts AS (DELETE FROM {INTERRUPT} WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])),
messages AS (DELETE FROM {MESSAGE} WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])),
batch_items AS (
    DELETE FROM {BATCH_ITEM} WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])
),
patch_decisions AS (
    DELETE FROM {PATCH_DECISION} WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])
),
cancels AS (
    DELETE FROM {CANCEL_SUBSCRIPTION} WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])
),
pauses AS (
    DELETE FROM {PAUSE}
    WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])
        OR waits_for_id = ANY((SELECT ids FROM tree)::uuid[])
),
retries AS (
    UPDATE {EXECUTION} SET
        retry_of_id = CASE WHEN retry_of_id = ANY((SELECT ids FROM tree)::uuid[])
            THEN NULL ELSE retry_of_id END,
        continued_from_id = CASE WHEN continued_from_id = ANY((SELECT ids FROM tree)::uuid[])
            THEN NULL ELSE continued_from_id END
    WHERE (
        retry_of_id = ANY((SELECT ids FROM tree)::uuid[])
        OR continued_from_id = ANY((SELECT ids FROM tree)::uuid[])
    )
        AND NOT id = ANY((SELECT ids FROM tree)::uuid[])
),
schedules AS (
    UPDATE {SCHEDULE} SET last_execution_id = NULL
    WHERE last_execution_id = ANY((SELECT ids FROM tree)::uuid[])
),
fires AS (
    UPDATE {SCHEDULE_FIRE} SET execution_id = NULL
    WHERE execution_id = ANY((SELECT ids FROM tree)::uuid[])
),
runs AS (DELETE FROM {EXECUTION} WHERE id = ANY((SELECT ids FROM tree)::uuid[]))
SELECT count(*),
    (SELECT finished_at FROM picked ORDER BY finished_at DESC, id DESC LIMIT 1),
    (SELECT id FROM picked ORDER BY finished_at DESC, id DESC LIMIT 1)
FROM picked
"""


@functools.cache
def insert_fields(model: type[models.Model]) -> tuple[models.Field[Any, Any], ...]:
    """The columns a new row of ``model`` is inserted with (serial ids left to the database)."""
    return tuple(
        f
        for f in model._meta.concrete_fields
        if not (f.primary_key and isinstance(f, models.AutoField | models.BigAutoField))
    )


#: What a run's insert stores as its concurrency key when it takes the key's room in the same
#: statement: the key, or the error ``KEY_FULL`` (migration ``0034_batches``); parameters:
#: the reactor, the key and its limit.
HOLD_KEY = "django_reactor_hold_key(%s, %s, %s)"
#: The SQLSTATE ``HOLD_KEY`` raises when the key has no room.
KEY_FULL = "RXK01"


#: Whether runs are queued for a concurrency key (parameters: the reactor, the key); written to
#: match the key's partial index.
KEY_HAS_QUEUED = f"""
SELECT EXISTS (
    SELECT 1 FROM {EXECUTION}
    WHERE reactor = %s AND concurrency_key = %s AND concurrency_key <> '' AND status = 'queued'
)
"""


class KeyFull(Exception):
    """A run's insert found its concurrency key without room (:data:`HOLD_KEY`): nothing was
    written; the start decides under the key's lock instead."""


def raised_key_full(exc: BaseException) -> bool:
    """Whether a database error is :data:`HOLD_KEY`'s refusal."""
    cause = exc.__cause__
    return KEY_FULL in (getattr(cause, "sqlstate", None), getattr(cause, "pgcode", None))


def literal(value: Any) -> str | None:
    """The SQL literal written into a statement's text for ``value`` instead of a parameter,
    when it is one of the few values most columns of a new run hold (NULL, false, true, 0,
    ''); None for any other value."""
    if value is None:
        return "NULL"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int) and value == 0:
        return "0"
    if isinstance(value, str) and value == "":
        return "''"
    return None


@functools.lru_cache(maxsize=256)
def insert_all(
    events: int,
    with_dispatch: bool,
    with_definition: bool = False,
    attributes: int = 0,
    hold_key: bool = False,
    literals: tuple[str | None, ...] = (),
) -> str:
    """A new run's one statement: its execution row, first events, dispatch, (unless kept
    already) its definition and its ``attributes`` (a key and a value each, with the run's
    creation time), each a data-modifying CTE; parameters in that order. ``hold_key``: the
    row's concurrency key is :data:`HOLD_KEY`'s (its three parameters in the key's place).

    ``literals``: for each column of the rows in that order, the literal written in its place
    (:func:`literal`), or None for a parameter. Most of a new run's columns are empty: written
    as literals, the statement keeps under psycopg's 50 parameters, above which it parses the
    statement's text again for every run, and adapts fewer values."""
    connection = connections[using()]
    models_named: list[tuple[type[models.Model], str]] = []
    if with_definition:
        models_named.append((Definition, "df"))
    models_named.append((Execution, "ex"))
    models_named += [(ExecutionEvent, f"ev{i}") for i in range(events)]
    if with_dispatch:
        models_named.append((Dispatch, "dp"))
    parts = []
    written = iter(literals)
    for model, name in models_named:
        fields = insert_fields(model)
        columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in fields)
        marks = []
        for f in fields:
            inline = next(written, None)
            if hold_key and name == "ex" and f.name == "concurrency_key":
                marks.append(HOLD_KEY)
            else:
                marks.append("%s" if inline is None else inline)
        returning = " RETURNING id" if name == "dp" else ""
        if name == "ex" and attributes:
            returning = " RETURNING id, created_at"
        # A definition is kept once: the first run of each fingerprint writes it.
        conflict = " ON CONFLICT DO NOTHING" if name == "df" else ""
        table = model._meta.db_table
        parts.append(
            f"{name} AS (INSERT INTO {table} ({columns}) VALUES ({', '.join(marks)})"
            f"{conflict}{returning})"
        )
    if attributes:
        parts.append(INSERT_ATTRIBUTES.format(name="at", rows=attribute_rows(attributes), on=""))
    return "WITH " + ", ".join(parts) + (" SELECT id FROM dp" if with_dispatch else " SELECT 1")


# The server refused a prepared checkpoint (a transaction pooler that cannot route prepared
# statements): preparation stays off for the rest of the process.
_preparation_refused = threading.Event()


def _prepared_statement_refused(exc: Exception) -> bool:
    """Whether ``exc`` says a prepared statement is not where psycopg prepared it."""
    sqlstate = getattr(getattr(exc, "diag", None), "sqlstate", None)
    # 26000 invalid_sql_statement_name ("prepared statement ... does not exist"),
    # 42P05 duplicate_prepared_statement ("... already exists").
    return sqlstate in ("26000", "42P05")


def _turn_preparation_off(exc: Exception) -> None:
    if not _preparation_refused.is_set():
        _preparation_refused.set()
        logger.error(
            "the database refused a prepared checkpoint (%s): the connection goes through a "
            "pooler that cannot route prepared statements (a transaction-pooling PgBouncer "
            "before 1.21, or without max_prepared_statements). Checkpoints are no longer "
            "prepared in this process; set REACTOR['CHECKPOINT_PREPARED_STATEMENTS'] = False "
            "(python manage.py check --deploy --database default reports it as "
            "django_reactor.W003)",
            str(exc).strip().splitlines()[0] if str(exc) else type(exc).__name__,
        )


def execute(sql: str, params: Params, connection: Any = None) -> tuple[Any, ...] | None:
    """Run the checkpoint statement on Django's connection (``connection``: the caller's
    ``connections[using()]``, when it has it at hand); return its row."""
    return _execute(sql, params, named=False, connection=connection)[1]


def execute_named(sql: str, params: Params) -> tuple[list[str], tuple[Any, ...] | None]:
    """Like :func:`execute` (prepared the same way), with the names of the returned columns."""
    return _execute(sql, params, named=True)


def execute_named_rows(sql: str, params: Params) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Like :func:`execute_named`, with every row the statement returns."""
    return _execute(sql, params, named=True, every=True)


def _execute(
    sql: str, params: Params, *, named: bool, connection: Any = None, every: bool = False
) -> tuple[list[str], Any]:
    """Send one statement on Django's connection; return its column names and first row (its
    rows, with ``every``).

    With psycopg 3 the statement goes through a server-binding cursor of the same connection
    (same transaction state), prepared once per connection when
    ``REACTOR["CHECKPOINT_PREPARED_STATEMENTS"]`` is on: planning the statement costs about as
    much as running it. Django disables prepared statements connection-wide (for transaction
    poolers), so preparation is enabled around this one statement only. Django's query logging
    and execute wrappers do not see this statement.
    """
    if connection is None:
        connection = connections[using()]
    raw = connection.connection
    if raw is None:
        connection.ensure_connection()
        raw = connection.connection
    if psycopg is None or not isinstance(raw, psycopg.Connection):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall() if every else cursor.fetchone()
            return _names(cursor.description) if named else [], rows
    if connection.needs_rollback:
        connection.validate_no_broken_transaction()  # raises, as Django's cursor would
    prepare = reactor_settings.CHECKPOINT_PREPARED_STATEMENTS and not _preparation_refused.is_set()
    with connection.wrap_database_errors:
        threshold = raw.prepare_threshold
        if prepare:
            raw.prepare_threshold = 0
        try:
            cursor = _cursor_of(connection, raw)
            try:
                cursor.execute(sql, params, prepare=prepare)
            except psycopg.Error as exc:
                if not (prepare and _prepared_statement_refused(exc)):
                    raise
                _turn_preparation_off(exc)
                if connection.in_atomic_block:
                    raise  # the transaction is aborted; the caller's next try is unprepared
                # On its own (autocommit) the refused statement did nothing: send it again.
                raw.prepare_threshold = threshold
                cursor.execute(sql, params, prepare=False)
            rows = cursor.fetchall() if every else cursor.fetchone()
            return _result_names(cursor) if named else [], rows
        finally:
            raw.prepare_threshold = threshold


def _cursor_of(connection: Any, raw: Any) -> Any:
    """A cursor of the psycopg connection ``raw`` (Django's ``connection``), kept on the
    Django connection for its next statement: a cursor costs as much Python to make and close
    as a checkpoint spends building its parameters. A new connection gets a new cursor."""
    kept = getattr(connection, "_reactor_cursor", None)
    # Kept with its psycopg connection: compared without a property call per statement.
    if kept is not None and kept[0] is raw and not kept[1].closed:
        return kept[1]
    cursor = psycopg.Cursor(raw)
    connection._reactor_cursor = (raw, cursor)
    return cursor


def _names(description: Any) -> list[str]:
    return [column[0] for column in description or ()]


def _result_names(cursor: Any) -> list[str]:
    """The result's column names, read from libpq (``cursor.description`` builds a ``Column``
    with its type information for each: a tenth of a worker's CPU for a claim's 40 columns)."""
    result = cursor.pgresult
    if result is None:
        return []
    encoding = cursor.connection.info.encoding
    return [result.fname(i).decode(encoding) for i in range(result.nfields)]


def again_unprepared(function: Callable[P, T]) -> Callable[P, T]:
    """Run ``function`` once more when its transaction failed only because the database just
    refused a prepared checkpoint (preparation is off now, so the second try goes through)."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        refused = _preparation_refused.is_set()
        try:
            return function(*args, **kwargs)
        except DatabaseError:
            if refused or not _preparation_refused.is_set() or connections[using()].in_atomic_block:
                raise
            return function(*args, **kwargs)

    return wrapper
