"""The Celery bridge: the tasks workers run, publishing queued dispatches, the beat schedule.

Add ``django_reactor`` to ``INSTALLED_APPS`` and run Celery workers for your project as usual;
the tasks are ``@shared_task``s named ``django_reactor.resume`` and ``django_reactor.sweep``.
See :func:`beat_schedule` and :data:`RECOMMENDED_CELERY_SETTINGS`.
"""

from __future__ import annotations

from typing import Any

#: Celery settings django_reactor is designed for (as ``CELERY_*`` Django settings).
RECOMMENDED_CELERY_SETTINGS: dict[str, Any] = {
    # Acknowledge after the task ran, so a lost worker's message is delivered again.
    "task_acks_late": True,
    # A worker whose child process dies gives the message back; the run's recovery counter
    # (REACTOR["MAX_RECOVERY_ATTEMPTS"]) stops a step that kills its worker every time.
    "task_reject_on_worker_lost": True,
    # One message at a time per process: long steps do not hold prefetched runs hostage.
    "worker_prefetch_multiplier": 1,
    # Results live in the database, not in a result backend.
    "task_ignore_result": True,
    # Keep the Redis visibility timeout above your longest step; duplicates are harmless (the
    # lease suppresses them) but cost a delivery. Ten priority steps on Redis (four by
    # default), one for each of a run's priorities (Meta.priority, run(priority=...)).
    "broker_transport_options": {"visibility_timeout": 3600, "priority_steps": list(range(10))},
}


#: Django settings (not Celery app keys) for worker processes: keep the database connection
#: across tasks (Celery's Django fixup closes it around every task otherwise, which costs more
#: than a whole run). Pair it with ``"CONN_HEALTH_CHECKS": True`` in ``DATABASES``.
RECOMMENDED_DJANGO_SETTINGS: dict[str, Any] = {"CELERY_DB_REUSE_MAX": 1000}


def beat_schedule(interval: float = 15.0, queue: str | None = None) -> dict[str, dict[str, Any]]:
    """A ``CELERY_BEAT_SCHEDULE`` entry running the sweeper every ``interval`` seconds.

    Meant for ``settings.py``, so it reads no settings: pass the same ``queue`` as
    ``REACTOR["CELERY_QUEUE"]`` when you set one.

    >>> CELERY_BEAT_SCHEDULE = {**beat_schedule(15.0)}  # doctest: +SKIP
    """
    entry: dict[str, Any] = {"task": "django_reactor.sweep", "schedule": float(interval)}
    if queue:
        entry["options"] = {"queue": queue}
    return {"django-reactor-sweep": entry}
