"""Settings of every process the chaos soak starts: workers, sweeper, web process and callers.

The driver (``benchmarks/chaos_soak.py``) passes, through the environment, its database
(``DATABASE_URL``), its own Redis as the broker (``CELERY_BROKER_URL``), django_reactor's
settings (``REACTOR_SETTINGS_JSON``: queue, Redis coordination backend on that Redis, short
leases) and the role of the process (``CHAOS_ROLE``: ``worker``, ``sweeper``, ``web``,
``caller``, ``submitter``, ``setup``). The role becomes the PostgreSQL ``application_name``
(``chaos_<role>``), so that the driver can terminate the backends of one role and no other.

The workers find ``tests.chaos.reactors`` the way the worker tests find
``tests.workers.reactors``: a stored run names its reactor by dotted path, and the registry
imports it on first use. ``tests.chaos`` is also an installed app (no models), so that every
process imports ``tests.chaos.reactors`` at start: the web process must know the event
``chaos.decision`` a reactor waits for before any run of it exists (``POST /events/{name}/``
answers 404 for an event no registered reactor declares), and ``EVENT_AUTH`` opens that event to
signed webhooks (check E015 wants its reactor registered in every process). ``CELERY_IMPORTS``
loads the soak's Celery hooks (task start and failure lines naming the execution id) when a
worker starts.
"""

from __future__ import annotations

import json
import os

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS, database_from_url
from tests.chaos import WEBHOOK_SECRET

#: The role of this process, as the driver started it.
CHAOS_ROLE = os.environ.get("CHAOS_ROLE", "unknown")

DEBUG = False
INSTALLED_APPS = [*INSTALLED_APPS, "tests.chaos"]
_database = database_from_url(os.environ["DATABASE_URL"])
_database["OPTIONS"] = {"application_name": f"chaos_{CHAOS_ROLE}", "connect_timeout": 5}
DATABASES = {"default": _database}
CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"]
CELERY_IMPORTS = ["tests.chaos.hooks"]
REACTOR = {
    "WEBHOOK_SECRETS": [WEBHOOK_SECRET],
    "API_RESUME_RATE": "100000/m",
    "EVENT_AUTH": {"chaos.decision": ["webhook"]},
    **json.loads(os.environ.get("REACTOR_SETTINGS_JSON", "{}")),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "chaos": {"format": "[%(asctime)s: %(levelname)s/%(process)d %(name)s] %(message)s"}
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "chaos"}},
    "loggers": {
        "django_reactor": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "tests.chaos": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # Celery's per-task "received" / "succeeded" lines: the hooks log what the soak needs.
        "celery.app.trace": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"},
    },
}
