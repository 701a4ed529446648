"""Django settings of ``background_throughput.py`` and of the Celery worker it starts.

The example project's settings (its ``CELERY_*`` settings included), with the database, the
broker and django_reactor's Celery queue taken from the environment, and ``DEBUG`` off::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/reactor_bench_bg
    CELERY_BROKER_URL=redis://127.0.0.1:6379/12
    REACTOR_BENCH_QUEUE=django_reactor_bench_bg
"""

from __future__ import annotations

import os

from testproject.settings import *  # noqa: F403
from testproject.settings import database_from_url

DEBUG = False
DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"]
REACTOR = {"CELERY_QUEUE": os.environ["REACTOR_BENCH_QUEUE"]}
# sleeping_runs.py: the sweeper wakes every run due in one sweep.
if "REACTOR_SWEEP_BATCH" in os.environ:
    REACTOR["SWEEP_BATCH"] = int(os.environ["REACTOR_SWEEP_BATCH"])
if "REACTOR_SWEEP_INTERVAL" in os.environ:
    REACTOR["SWEEP_INTERVAL"] = float(os.environ["REACTOR_SWEEP_INTERVAL"])

# The example project keeps the worker's database connection (CELERY_DB_REUSE_MAX = 1000, as
# django_reactor.celery.RECOMMENDED_DJANGO_SETTINGS advises). ``--db-reuse-max N`` overrides it;
# ``--db-reuse-max 0`` unsets it, and Celery's Django fixup then closes the connection around
# every task.
if "BENCH_DB_REUSE_MAX" in os.environ:
    CELERY_DB_REUSE_MAX = int(os.environ["BENCH_DB_REUSE_MAX"]) or None

# The worker runs with ``-l INFO`` (its "ready." line is how the benchmark knows it started);
# Celery's per-task "received" / "succeeded" lines are silenced so that logging does not count.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_reactor": {"handlers": ["console"], "level": "WARNING"},
        "celery.app.trace": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"},
    },
}
