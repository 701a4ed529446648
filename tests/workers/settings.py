"""Settings of the Celery worker processes the worker tests start.

The test process passes its test database (``DATABASE_URL``, with extra ``DATABASES`` keys in
``REACTOR_DATABASE_JSON``, e.g. behind PgBouncer), its broker and queue, and django_reactor
settings (``REACTOR_SETTINGS_JSON``) through the environment.
"""

from __future__ import annotations

import json
import os

from testproject.settings import *  # noqa: F403
from testproject.settings import database_from_url

DATABASES = {
    "default": {
        **database_from_url(os.environ["DATABASE_URL"]),
        **json.loads(os.environ.get("REACTOR_DATABASE_JSON") or "{}"),
    }
}
# The second database runs may be routed to, when the test process has one.
if os.environ.get("SHARD_DATABASE_URL"):
    DATABASES["shard"] = database_from_url(os.environ["SHARD_DATABASE_URL"])
REACTOR = json.loads(os.environ.get("REACTOR_SETTINGS_JSON", "{}"))
CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"]
# The URLs of an ASGI server a test starts (tests/workers/asgi.py).
ROOT_URLCONF = os.environ.get("REACTOR_ROOT_URLCONF", ROOT_URLCONF)  # noqa: F405
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_reactor": {"handlers": ["console"], "level": "INFO"}},
}
# A Celery beat process started by a test sweeps this often, on the tests' queue.
if os.environ.get("REACTOR_BEAT_INTERVAL"):
    from django_reactor.celery import beat_schedule

    CELERY_BEAT_SCHEDULE = beat_schedule(
        float(os.environ["REACTOR_BEAT_INTERVAL"]), queue=REACTOR.get("CELERY_QUEUE")
    )
