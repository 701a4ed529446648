"""The fair anchor of ``background_throughput.py``: a hand-written durable Celery task.

What a competent Celery user writes for durable 10-step background runs without a framework,
following the design of ``/work/shared/anchors/durable_task_anchor.py`` (written anew here):

* the caller INSERTs the run row (one autocommit statement) and publishes one task (no outbox);
* the task (one per run, so one broker round trip, as a django_reactor background run) claims
  the run with one fenced ``UPDATE ... RETURNING`` that bumps the fence and returns the step
  results already recorded (a redelivered run resumes after its last checkpoint);
* each of the 10 no-op steps is checkpointed by one statement in autocommit, so one commit per
  step: a CTE that updates the run row under its fence and inserts the step's result, which
  inserts nothing when the fence moved on (another worker took the run: stop);
* a last fenced ``UPDATE`` marks the run completed with its result.

That is 13 commits per run (caller 1, claim 1, steps 10, finish 1). Celery settings as
django_reactor's worker: ``task_acks_late``, ``task_reject_on_worker_lost``, prefetch 1,
``task_ignore_result``, Redis broker (db 15 by default, ``DURABLE_BROKER``). One psycopg 3
connection per worker process, opened on its first task and kept (psycopg prepares a statement
it sees for the fifth time, its default). Database ``DURABLE_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/reactor_bench_durable``; :func:`create_schema` makes the
tables). The benchmark starts its worker with the same flags as the others::

    celery -A benchmarks.durable_task_anchor worker -P prefork -c 2 --without-mingle \\
        --without-gossip --without-heartbeat -l INFO
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from typing import Any

from celery import Celery, signals

BROKER = os.environ.get("DURABLE_BROKER", "redis://127.0.0.1:6379/15")
DSN = os.environ.get("DURABLE_DSN", "postgresql://postgres@127.0.0.1:5432/reactor_bench_durable")
STEPS = 10
RUN_TABLE = "durable_run"

app = Celery("durable_anchor", broker=BROKER, set_as_current=False)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    broker_transport_options={"visibility_timeout": 3600},
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS durable_run (
    id uuid PRIMARY KEY,
    status text NOT NULL,
    fence integer NOT NULL DEFAULT 0,
    worker text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz,
    finished_at timestamptz,
    result jsonb
);
CREATE TABLE IF NOT EXISTS durable_step (
    run_id uuid NOT NULL REFERENCES durable_run (id),
    position integer NOT NULL,
    result jsonb,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, position)
);
"""

CLAIM = """
UPDATE durable_run SET status = 'running', worker = %s, fence = fence + 1, updated_at = now()
WHERE id = %s AND status IN ('pending', 'running')
RETURNING fence, (
    SELECT coalesce(json_object_agg(s.position, s.result), '{}'::json)
    FROM durable_step s WHERE s.run_id = durable_run.id
)
"""

CHECKPOINT = """
WITH run AS (
    UPDATE durable_run SET updated_at = now() WHERE id = %s AND fence = %s RETURNING id
)
INSERT INTO durable_step (run_id, position, result)
SELECT run.id, %s, %s::jsonb FROM run
ON CONFLICT (run_id, position) DO UPDATE SET result = EXCLUDED.result, recorded_at = now()
RETURNING position
"""

FINISH = """
UPDATE durable_run
SET status = 'completed', finished_at = now(), updated_at = now(), worker = NULL,
    result = %s::jsonb
WHERE id = %s AND fence = %s
"""

_connection: Any = None


def connection() -> Any:
    """This worker process's connection, opened on first use (after the fork) and kept."""
    import psycopg

    global _connection
    if _connection is None or _connection.closed or _connection.broken:
        _connection = psycopg.connect(DSN, autocommit=True)
    return _connection


def noop(value: Any) -> Any:
    return value


@app.task(name="durable_anchor.run10")
def run10(run_id: str) -> None:
    conn = connection()
    claimed = conn.execute(CLAIM, (f"{os.getpid()}", run_id)).fetchone()
    if claimed is None:  # finished, or not ours
        return
    fence, recorded = claimed
    value: Any = None
    for position in range(STEPS):
        if str(position) in recorded:  # a redelivered run: the step is already done
            value = recorded[str(position)]
            continue
        value = noop(value)
        stored = conn.execute(CHECKPOINT, (run_id, fence, position, json.dumps(value)))
        if stored.fetchone() is None:  # the fence moved on: another worker owns the run
            return
    conn.execute(FINISH, (json.dumps(value), run_id, fence))


def submit(conn: Any) -> uuid.UUID:
    """The caller's side of one run: the run row (one commit), then the publish."""
    run_id = uuid.uuid4()
    conn.execute("INSERT INTO durable_run (id, status) VALUES (%s, 'pending')", (run_id,))
    run10.apply_async(args=[str(run_id)])
    return run_id


def create_schema(conn: Any, *, empty: bool = True) -> None:
    """Create the anchor's tables if missing (and empty them)."""
    conn.execute(SCHEMA)
    if empty:
        conn.execute("TRUNCATE durable_step, durable_run")


@signals.after_setup_logger.connect
def _quiet_task_logs(**kwargs: Any) -> None:
    # The worker runs with -l INFO for its "ready." line; per-task lines are not measured.
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)
