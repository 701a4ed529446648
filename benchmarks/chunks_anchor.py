"""The fair anchor of ``map_fanout.py``: a durable Celery chord of chunks.

What a competent Celery user writes to run many tiny items durably: one task per chunk of 50
items (django_reactor's default map chunk), each computing its no-op elements and committing
their results to PostgreSQL with one ``INSERT ... SELECT FROM unnest(...)`` (one commit per 50
elements, as the map settles a chunk), returning only how many it stored; a chord callback
counts the stored rows, so the results are as durable as the map's when the callback's result
is in.

Configuration as ``benchmarks/map_anchor.py``: Redis broker and Redis result backend
(``CHUNKS_BROKER`` / ``CHUNKS_BACKEND``, Redis dbs 8 and 9 by default), ``task_acks_late=True``,
``worker_prefetch_multiplier=4``. Each worker process keeps one psycopg 3 connection in
autocommit mode to ``CHUNKS_DSN`` (the benchmark's database). The app does not make itself
Celery's current app, so that it can live in the benchmark's process. The benchmark starts its
worker with the same flags as django_reactor's::

    celery -A benchmarks.chunks_anchor worker -P prefork -c 2 --without-mingle --without-gossip \
        --without-heartbeat -l INFO
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import psycopg
from celery import Celery, chord, group, signals

BROKER = os.environ.get("CHUNKS_BROKER", "redis://127.0.0.1:6379/8")
BACKEND = os.environ.get("CHUNKS_BACKEND", "redis://127.0.0.1:6379/9")
DSN = os.environ.get("CHUNKS_DSN", "postgresql://postgres@127.0.0.1:5432/reactor_bench_map")
CHUNK = 50
TABLE = "bench_chunk_result"

app = Celery("chunks_anchor", broker=BROKER, backend=BACKEND, set_as_current=False)
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=4, result_expires=600)

_connection: psycopg.Connection[Any] | None = None


def connection() -> psycopg.Connection[Any]:
    """This process's connection (autocommit: each statement is its own transaction)."""
    global _connection
    if _connection is None or _connection.closed:
        _connection = psycopg.connect(DSN, autocommit=True)
    return _connection


def create_table() -> None:
    """The results table: one row per element, keyed by the batch and the element's index."""
    connection().execute(
        f"CREATE TABLE IF NOT EXISTS {TABLE} (batch text NOT NULL, idx integer NOT NULL, "
        "value jsonb, at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (batch, idx))"
    )


def empty_table() -> None:
    connection().execute(f"TRUNCATE {TABLE}")


@app.task(name="chunks_anchor.store_chunk")
def store_chunk(batch: str, start: int, stop: int) -> int:
    """Run elements ``start .. stop - 1`` (each returns its item) and commit their results."""
    indexes = list(range(start, stop))
    values = [json.dumps(i) for i in indexes]
    connection().execute(
        f"INSERT INTO {TABLE} (batch, idx, value) SELECT %s, u.i, u.v::jsonb "
        "FROM unnest(%s::integer[], %s::text[]) AS u(i, v) "
        "ON CONFLICT (batch, idx) DO UPDATE SET value = EXCLUDED.value",
        (batch, indexes, values),
    )
    return len(indexes)


@app.task(name="chunks_anchor.count_stored")
def count_stored(counts: list[int], batch: str) -> int:
    """The chord's callback: how many results of ``batch`` PostgreSQL holds."""
    row = connection().execute(f"SELECT count(*) FROM {TABLE} WHERE batch = %s", (batch,))
    found = row.fetchone()
    return int(found[0]) if found else 0


def durable_chord(count: int, batch: str, size: int = CHUNK) -> Any:
    """``chord(store_chunk(batch, i, i + size) for every chunk)(count_stored(batch))``."""
    chunks = group(
        store_chunk.s(batch, start, min(start + size, count)) for start in range(0, count, size)
    )
    return chord(chunks, count_stored.s(batch))


@signals.after_setup_logger.connect
def _quiet_task_logs(**kwargs: Any) -> None:
    # The worker runs with -l INFO for its "ready." line; per-task lines are not measured.
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)
