"""Settings of a project that only installs django_reactor: no example app, no Redis, no broker.

``tests/commands/test_reactor_demo.py`` runs ``migrate`` and ``reactor_demo`` under them, on the
SQLite file named by ``REACTOR_DEMO_DATABASE``.
"""

from __future__ import annotations

import os

SECRET_KEY = "django-reactor-bare-project-not-secret"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "rest_framework",
    "django_reactor",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["REACTOR_DEMO_DATABASE"],
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
