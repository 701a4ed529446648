"""Django settings of ``resume_latency.py`` and of the Celery worker it starts.

The example project's settings (its ``CELERY_*`` settings included), with the database, the
broker and django_reactor's Celery queue taken from the environment, ``DEBUG`` off, and a
webhook secret the benchmark signs its resume requests with::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/reactor_bench_resume
    CELERY_BROKER_URL=redis://127.0.0.1:6379/11
    REACTOR_BENCH_QUEUE=django_reactor_bench_resume
"""

from __future__ import annotations

import os

from testproject.settings import *  # noqa: F403
from testproject.settings import database_from_url

#: Signs the benchmark's webhooks (a fixed test value, not a secret).
BENCH_WEBHOOK_SECRET = "whsec_" + "cmVzdW1lLWxhdGVuY3ktYmVuY2htYXJrLXNlY3JldA=="

DEBUG = False
DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"]
REACTOR = {
    "CELERY_QUEUE": os.environ["REACTOR_BENCH_QUEUE"],
    "WEBHOOK_SECRETS": [BENCH_WEBHOOK_SECRET],
    # The default (120/m per client) would refuse most of a 100-request burst from one sender.
    # A limit stays on, so that the throttle's cache round trip is part of every request.
    "API_RESUME_RATE": "100000/m",
}

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
