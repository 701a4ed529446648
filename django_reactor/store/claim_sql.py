"""A worker's claim of runs on PostgreSQL, one statement each (``dialects.PostgreSQL``):
the run taken under a new fence, its dispatches marked taken, and what resuming it needs read
in the same round trip."""

from __future__ import annotations

from .sql import DEFINITION, DISPATCH, EVENT, EXECUTION, PAUSE_OF_RUN, STEP_RECORD

#: A worker's claim (the pieces of :data:`CLAIM_FOR_WORKER` and :data:`CLAIM_AHEAD`): what it
#: sets, which runs it may take, and what it returns.
_CLAIM_SETS = """
    lease_owner = %(owner)s,
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    fence = fence + 1,
    recovery_attempts = recovery_attempts
        + CASE WHEN status = 'pending' OR lease_owner IS NULL OR lease_owner = %(owner)s
            THEN 0 ELSE 1 END,
    status = CASE WHEN status = 'rolling_back' THEN 'rolling_back' ELSE 'running' END,
    started_at = COALESCE(started_at, now()),
    wake_at = NULL,
    updated_at = now()"""

_CLAIMABLE = f"""
    status = ANY(%(statuses)s)
    AND (parent_id IS NULL OR detached)
    AND (lease_owner IS NULL OR lease_expires_at < now() OR lease_owner = %(owner)s)
    AND (wake_at IS NULL OR wake_at <= now())
    AND xmin = (SELECT seen.xmin FROM {EXECUTION} AS seen WHERE seen.id = {EXECUTION}.id)"""

_CLAIMED = f"""
RETURNING *,
    GREATEST(
        (SELECT COALESCE(MAX(ev.seq), 0) FROM {EVENT} ev
            WHERE ev.execution_id = {EXECUTION}.id),
        (SELECT COALESCE(MAX(sr.seq), 0) FROM {STEP_RECORD} sr
            WHERE sr.execution_id = {EXECUTION}.id AND sr.traced)) AS claimed_last_seq,
    (SELECT COALESCE(json_agg(json_build_object(
            'step', sr.step, 'status', sr.status, 'arguments', sr.arguments,
            'result', sr.result, 'error', sr.error, 'compensable', sr.compensable,
            'rollback', sr.rollback, 'rollback_error', sr.rollback_error) ORDER BY sr.seq),
        '[]'::json)
        FROM {STEP_RECORD} sr
        WHERE sr.execution_id = {EXECUTION}.id) AS claimed_steps,
    (SELECT df.shape FROM {DEFINITION} df
        WHERE df.hash = {EXECUTION}.definition_hash) AS claimed_shape,
    {PAUSE_OF_RUN.format(run=EXECUTION)} AS claimed_pause,
    recovery_attempts > (SELECT seen.recovery_attempts FROM {EXECUTION} AS seen
        WHERE seen.id = {EXECUTION}.id) AS claimed_taken_over
"""

#: The worker's claim on PostgreSQL (``claims.claim_for_worker``): one statement that marks the
#: run's dispatches taken (the sweeper leaves them alone) and returns the claimed row with the
#: run's step records, last trace sequence number and definition shape, so resuming costs one
#: round trip (the ORM's query building costs more than the statement itself on this
#: path, once per delivery). The run's dispatches are found through their ``execution_id``
#: index: written ``sent_at IS NULL``, the condition would let the planner take the partial
#: index of unsent rows instead, and scan every unsent row (and every entry of a row marked
#: sent since the last vacuum): after a burst of 10,000 sleeps woken at once, about 1 ms a
#: claim instead of 0.03. ``COALESCE(...)`` means the same and matches no index predicate.
#:
#: The ``xmin`` condition: when the claim waits for the row lock of an owner committing a
#: checkpoint (an owner stalled past its lease), PostgreSQL checks the conditions again on the
#: row that owner wrote, but the step records returned are read as of before its commit: the
#: claim would take the run without the step it just committed, and run that step again (an
#: atomic step's writes twice). The row the statement's snapshot sees must be the row it
#: updates; when it is not, the statement takes nothing and ``claim_for_worker`` sends it again
#: (with a snapshot that sees the commit). The same snapshot gives ``claimed_taken_over``: the
#: row as it was before, whose recovery count this claim raised (a takeover).
CLAIM_FOR_WORKER = f"""
WITH taken AS (
    UPDATE {DISPATCH} SET sent_at = now()
    WHERE execution_id = %(id)s AND COALESCE(sent_at IS NULL, false) AND map_run_id IS NULL
)
UPDATE {EXECUTION} SET{_CLAIM_SETS}
WHERE id = %(id)s AND{_CLAIMABLE}{_CLAIMED}"""

#: The worker's claim of several runs at once (``claims.claim_ahead``: a batch of wake-ups),
#: as :data:`CLAIM_FOR_WORKER` claims one, a row returned for each run claimed. Runs another
#: transaction holds locked are skipped (their turn claims them alone, waiting for the lock),
#: so that two workers claiming overlapping batches never wait for each other in a cycle.
CLAIM_AHEAD = f"""
WITH free AS (
    SELECT id FROM {EXECUTION} WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE {DISPATCH} SET sent_at = now()
    WHERE execution_id IN (SELECT id FROM free) AND COALESCE(sent_at IS NULL, false)
        AND map_run_id IS NULL
)
UPDATE {EXECUTION} SET{_CLAIM_SETS}
WHERE id IN (SELECT id FROM free) AND{_CLAIMABLE}{_CLAIMED}"""
