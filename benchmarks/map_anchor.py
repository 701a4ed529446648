"""The anchors of ``map_fanout.py``: a Celery ``group`` and a Celery ``chord`` of no-op tasks.

Adapted from ``/work/shared/anchors/celery_group_anchor.py`` and ``celery_chord_anchor.py``
(same app configuration: Redis broker and Redis result backend, ``task_acks_late=True``,
``worker_prefetch_multiplier=4``; a trivial task, and a summing callback for the chord). Only the
Redis database numbers differ (6 and 7 by default, overridable with ``BROKER`` / ``BACKEND``), and
the app does not make itself Celery's current app, so that it can live in the same process as the
project's app. The benchmark starts its worker with the same flags as django_reactor's worker::

    celery -A benchmarks.map_anchor worker -P prefork -c 2 --without-mingle --without-gossip \
        --without-heartbeat -l INFO
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery, chord, group, signals

BROKER = os.environ.get("BROKER", "redis://127.0.0.1:6379/6")
BACKEND = os.environ.get("BACKEND", "redis://127.0.0.1:6379/7")

app = Celery("map_anchor", broker=BROKER, backend=BACKEND, set_as_current=False)
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=4, result_expires=600)


@app.task(name="map_anchor.noop")
def noop(x: int) -> int:
    return x


@app.task(name="map_anchor.total")
def total(xs: list[int]) -> int:
    return sum(xs)


def group_of(count: int) -> Any:
    """``group(noop(0), ..., noop(count - 1))``: its results are ``0 .. count - 1``."""
    return group(noop.s(i) for i in range(count))


def chord_of(count: int) -> Any:
    """``chord(noop(i) for i < count)(total)``: its result is ``count * (count - 1) / 2``."""
    return chord((noop.s(i) for i in range(count)), total.s())


@signals.after_setup_logger.connect
def _quiet_task_logs(**kwargs: Any) -> None:
    # The worker runs with -l INFO for its "ready." line; per-task lines are not measured.
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)
