"""Settings of the example project used by the demo, the docs and the test suite.

SQLite by default; set ``DATABASE_URL=postgres://user@host:5432/name`` to use PostgreSQL, or
``DATABASE_URL=mysql://user@host:3306/name`` to use MariaDB or MySQL (the ``mysql`` extra).
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-reactor-example-project-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_reactor",
    "testproject.example",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]


def database_from_url(url: str) -> dict[str, object]:
    """A DATABASES entry from ``postgres://user:password@host:port/name``,
    ``mysql://user:password@host:port/name`` (MariaDB or MySQL) or ``sqlite:///path``."""
    parsed = urlparse(url)
    if parsed.scheme in ("postgres", "postgresql", "pgsql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")) or "postgres",
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            "CONN_MAX_AGE": 0,
            "CONN_HEALTH_CHECKS": True,
            "TEST": {"NAME": os.environ.get("REACTOR_TEST_DB_NAME") or None},
        }
    if parsed.scheme in ("mysql", "mariadb"):
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": unquote(parsed.path.lstrip("/")) or "test",
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            "CONN_MAX_AGE": 0,
            "CONN_HEALTH_CHECKS": True,
            # Django's default isolation level on MySQL (READ COMMITTED), said out loud: the
            # store's conditional updates and claims are written for it.
            "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
            "TEST": {
                "NAME": os.environ.get("REACTOR_TEST_DB_NAME") or None,
                "CHARSET": "utf8mb4",
                "COLLATION": "utf8mb4_bin",
            },
        }
    if parsed.scheme == "sqlite":
        path = unquote(parsed.path)
        name = path[1:] if path.startswith("//") else path.lstrip("/") or ":memory:"
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name
            if name == ":memory:"
            else str(BASE_DIR / name)
            if not os.path.isabs(name)
            else name,
        }
    raise ValueError(
        f"DATABASE_URL scheme {parsed.scheme!r} is not supported (postgres, mysql, sqlite)"
    )


DATABASES = {
    "default": database_from_url(os.environ["DATABASE_URL"])
    if os.environ.get("DATABASE_URL")
    else {"ENGINE": "django.db.backends.sqlite3", "NAME": str(BASE_DIR / "db.sqlite3")}
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"

REACTOR: dict[str, object] = {
    # The demo runs without Redis: locks and rate limits live in the database. With Redis, drop
    # this line (the Redis backend is the default).
    "COORDINATION_BACKEND": "django_reactor.coordination.backends.database.DatabaseBackend",
}

# The secret a partner signs its webhooks with (Standard Webhooks, "whsec_..."), read from the
# environment: the supplier signs its deliveries for RestockProduct with it.
if os.environ.get("REACTOR_WEBHOOK_SECRET"):
    REACTOR["WEBHOOK_SECRETS"] = {
        "testproject.example.reactors.RestockProduct": [os.environ["REACTOR_WEBHOOK_SECRET"]],
    }

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        # DRF's, refusing (400) a user name with a NUL before the backend looks it up.
        "django_reactor.api.authentication.BasicAuthentication",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "django_reactor example API",
    "DESCRIPTION": "Read and steer saga executions; resume paused runs.",
    "VERSION": "0.1.0",
    "ENUM_NAME_OVERRIDES": {
        "ExecutionStatusEnum": "django_reactor.states.ExecutionStatus",
        "InterruptStatusEnum": "django_reactor.states.InterruptStatus",
    },
}

# Celery, configured as django_reactor recommends (django_reactor.celery.RECOMMENDED_...).
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
# Ten priority steps on Redis (four by default), so each of a run's priorities (0-9) is its own.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600, "priority_steps": list(range(10))}
# RabbitMQ honours priorities only on queues declared with x-max-priority: Celery declares the
# queues it creates so (an existing queue keeps its arguments: see docs/how-to/celery.md).
CELERY_TASK_QUEUE_MAX_PRIORITY = 10
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes the database connection around every task unless this is set:
# a new connection per run costs more than the whole run.
CELERY_DB_REUSE_MAX = 1000
CELERY_BEAT_SCHEDULE = {
    "django-reactor-sweep": {"task": "django_reactor.sweep", "schedule": 15.0},
}

# Django's tasks framework (django.tasks, or the django-tasks backport on Django 5.2): each task
# runs as a durable background run (docs/how-to/django-tasks.md).
TASKS = {
    "default": {
        "BACKEND": "django_reactor.tasks.ReactorBackend",
        "QUEUES": ["default", "emails"],
    }
}
if find_spec("django_tasks") is not None:
    INSTALLED_APPS.append("django_tasks")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_reactor": {"handlers": ["console"], "level": "WARNING"}},
}
