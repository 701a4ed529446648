"""Django settings of ``tasks_backend.py`` and of the workers it starts: ``bg_settings`` (the
example project's, database and broker from the environment), with django-tasks-db installed
and two task backends on the same database: ``default`` (ours) and ``db`` (django-tasks-db's)."""

from __future__ import annotations

from benchmarks.bg_settings import *  # noqa: F403
from benchmarks.bg_settings import INSTALLED_APPS, LOGGING

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
TASKS = {
    "default": {"BACKEND": "django_reactor.tasks.ReactorBackend"},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}
# db_worker's "Starting worker" line says it serves; per-task lines are silenced for both.
LOGGING = {
    **LOGGING,
    "loggers": {
        **LOGGING["loggers"],
        "django_tasks_db": {"handlers": ["console"], "level": "INFO"},
        "django_tasks": {"level": "WARNING"},
    },
}
