"""Workers' heartbeats: a thread of each worker's main process records one every
``REACTOR["HEARTBEAT_INTERVAL"]`` seconds (host, pid, node name, queues, concurrency, tasks
taken), from Celery's ``worker_ready`` until ``worker_shutdown``, which removes the row.

Never on the tasks' path: the tasks run in the pool's processes and write nothing for it; the
count of tasks taken is Celery's own (``celery.worker.state``), kept by the main process.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from celery.worker import state
from django.db import connections
from django.utils import timezone

from ..conf import reactor_settings
from ..services.health import beat_worker, forget_worker

logger = logging.getLogger("django_reactor.celery")


class WorkerHeartbeat:
    """The thread that records a worker's heartbeats until :meth:`stop`."""

    def __init__(self, *, name: str, queues: list[str], concurrency: int | None) -> None:
        self.name = name
        self.queues = queues
        self.concurrency = concurrency
        self.started_at = timezone.now()
        self.stopping = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name="django-reactor-heartbeat", daemon=True
        )

    def start(self) -> WorkerHeartbeat:
        self.thread.start()
        return self

    def beat(self) -> None:
        """Record one heartbeat (logged, not raised, when the database is unreachable)."""
        try:
            beat_worker(
                name=self.name,
                queues=self.queues,
                concurrency=self.concurrency,
                tasks_done=tasks_taken(),
                started_at=self.started_at,
            )
        except Exception:
            logger.warning("could not record the worker's heartbeat", exc_info=True)
        finally:
            # The pool forks its processes from this process: no connection stays open
            # between beats for a child to inherit.
            connections.close_all()

    def _run(self) -> None:
        while True:
            self.beat()
            if self.stopping.wait(reactor_settings.HEARTBEAT_INTERVAL):
                return

    def stop(self) -> None:
        """Stop beating and remove this worker's row."""
        self.stopping.set()
        self.thread.join(timeout=10)
        try:
            forget_worker()
        except Exception:
            logger.warning("could not remove the worker's heartbeat", exc_info=True)
        finally:
            connections.close_all()


def tasks_taken() -> int:
    """Tasks this worker took since it started (Celery's count, kept by the main process)."""
    counted = getattr(state, "all_total_count", None)
    if isinstance(counted, list) and counted:
        return int(counted[0])
    return sum(getattr(state, "total_count", {}).values())


_running: list[WorkerHeartbeat] = []


def _queues(consumer: Any) -> list[str]:
    try:
        return sorted(str(name) for name in consumer.app.amqp.queues.consume_from)
    except Exception:  # an unusual consumer: the heartbeat goes without its queues
        return []


@worker_ready.connect
def start_heartbeat(sender: Any = None, **kwargs: Any) -> None:
    """Start the heartbeat thread of the worker that became ready (``sender``: its consumer)."""
    controller = getattr(sender, "controller", None)
    concurrency = getattr(controller, "concurrency", None)
    heartbeat = WorkerHeartbeat(
        name=str(getattr(sender, "hostname", "") or getattr(controller, "hostname", "") or ""),
        queues=_queues(sender),
        concurrency=concurrency if isinstance(concurrency, int) else None,
    )
    _running.append(heartbeat.start())


@worker_shutdown.connect
def stop_heartbeat(sender: Any = None, **kwargs: Any) -> None:
    """Stop the heartbeat threads and remove their rows: the worker stops cleanly."""
    while _running:
        _running.pop().stop()
