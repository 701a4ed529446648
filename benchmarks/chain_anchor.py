"""The anchor of ``background_throughput.py``: a plain Celery chain of trivial tasks.

Adapted from ``/work/shared/anchors/celery_chain_anchor.py`` (same app configuration: Redis
broker and Redis result backend, ``task_acks_late=True``, ``worker_prefetch_multiplier=1``; same
task and chain). Only the Redis database numbers differ (13 and 14 by default, overridable with
``BROKER`` / ``BACKEND``), and the app does not make itself Celery's current app, so that it can
live in the same process as the project's app. The benchmark starts its worker with the same
flags as django_reactor's worker (``-l INFO`` for the "ready." line, per-task lines silenced)::

    celery -A benchmarks.chain_anchor worker -P prefork -c 2 --without-mingle --without-gossip \
        --without-heartbeat -l INFO
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery, chain, signals

BROKER = os.environ.get("BROKER", "redis://127.0.0.1:6379/13")
BACKEND = os.environ.get("BACKEND", "redis://127.0.0.1:6379/14")

app = Celery("anchor", broker=BROKER, backend=BACKEND, set_as_current=False)
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, result_expires=600)


@app.task(name="anchor.add")
def add(x: int) -> int:
    return x + 1


def signature(i: int, steps: int) -> Any:
    """The chain ``add(i) | add() | ...`` of ``steps`` tasks (its result is ``i + steps``)."""
    return chain(add.s(i), *[add.s() for _ in range(steps - 1)])


@signals.after_setup_logger.connect
def _quiet_task_logs(**kwargs: Any) -> None:
    # The worker runs with -l INFO for its "ready." line; per-task lines are not measured.
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)
