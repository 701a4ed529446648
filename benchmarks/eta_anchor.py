"""The anchor of ``sleeping_runs.py``: durable runs woken by Celery's ``apply_async(eta=...)``.

What a Celery user writes for "run this at 9:00" without a framework: the caller INSERTs the
run row (``sleeping``, with its wake-up time) and publishes one task with ``eta`` set; the
broker hands the task to a worker, which holds it until the time comes, then:

* claims the run with one fenced ``UPDATE ... RETURNING`` (``sleeping`` to ``running``, the
  fence bumped; a redelivered task finds the run taken and stops),
* runs its one no-op step after the nap and marks the run completed with the step's result,
  under the fence, in one statement.

That is 2 commits per woken run, as a ``NapsUntil`` run of django_reactor woken by the sweeper
(its claim, then the step's checkpoint that completes it). Celery settings as django_reactor's
worker: ``task_acks_late``, ``task_reject_on_worker_lost``, prefetch 1 (Celery reserves ETA
tasks beyond it), ``task_ignore_result``, Redis broker (db 10 by default, ``ETA_BROKER``), a
visibility timeout of an hour. One psycopg 3 connection per worker process, opened on its
first task and kept. Database ``ETA_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/reactor_bench_eta``; :func:`create_schema` makes the
table). ``sleeping_runs.py`` starts its worker with the same flags as django_reactor's::

    celery -A benchmarks.eta_anchor worker -P prefork -c 2 --without-mingle \\
        --without-gossip --without-heartbeat -l INFO
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import uuid
from typing import Any

from celery import Celery, signals

BROKER = os.environ.get("ETA_BROKER", "redis://127.0.0.1:6379/10")
DSN = os.environ.get("ETA_DSN", "postgresql://postgres@127.0.0.1:5432/reactor_bench_eta")
QUEUE = "eta_anchor"

app = Celery("eta_anchor", broker=BROKER, set_as_current=False)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_transport_options={"visibility_timeout": 3600},
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS eta_run (
    id uuid PRIMARY KEY,
    status text NOT NULL,
    fence integer NOT NULL DEFAULT 0,
    worker text,
    wake_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz,
    finished_at timestamptz,
    result jsonb
);
CREATE INDEX IF NOT EXISTS eta_run_status_idx ON eta_run (status);
"""

CLAIM = """
UPDATE eta_run SET status = 'running', worker = %s, fence = fence + 1, updated_at = now()
WHERE id = %s AND status = 'sleeping'
RETURNING fence
"""

FINISH = """
UPDATE eta_run
SET status = 'completed', finished_at = now(), updated_at = now(), worker = NULL,
    result = %s::jsonb
WHERE id = %s AND fence = %s
"""

_connection: Any = None


def connection() -> Any:
    """This process's connection, opened on first use (after the fork) and kept."""
    import psycopg

    global _connection
    if _connection is None or _connection.closed or _connection.broken:
        _connection = psycopg.connect(DSN, autocommit=True)
    return _connection


@app.task(name="eta_anchor.wake")
def wake(run_id: str) -> None:
    """The run's wake-up: claim it, run its step, complete it."""
    conn = connection()
    claimed = conn.execute(CLAIM, (f"{os.getpid()}", run_id)).fetchone()
    if claimed is None:  # taken by another delivery
        return
    conn.execute(FINISH, (json.dumps("noted"), run_id, claimed[0]))


def submit(conn: Any, at: dt.datetime, queue: str = QUEUE) -> uuid.UUID:
    """The caller's side of one run sleeping until ``at``: its row (one commit), then the task
    published with ``eta``."""
    run_id = uuid.uuid4()
    conn.execute(
        "INSERT INTO eta_run (id, status, wake_at) VALUES (%s, 'sleeping', %s)", (run_id, at)
    )
    wake.apply_async(args=[str(run_id)], eta=at, queue=queue)
    return run_id


def counts(conn: Any) -> tuple[int, int]:
    """(runs resumed: no longer sleeping, runs completed)."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE status <> 'sleeping'), "
        "count(*) FILTER (WHERE status = 'completed') FROM eta_run"
    ).fetchone()
    return int(row[0]), int(row[1])


def create_schema(conn: Any) -> None:
    """Create the anchor's table if missing, and empty it."""
    conn.execute(SCHEMA)
    conn.execute("TRUNCATE eta_run")


@signals.after_setup_logger.connect
def _quiet_task_logs(**kwargs: Any) -> None:
    # The worker runs with -l INFO for its "ready." line; per-task lines are not measured.
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)
