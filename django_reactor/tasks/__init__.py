"""A backend for Django's tasks framework (``django.tasks``, or the ``django-tasks`` backport):
``TASKS = {"default": {"BACKEND": "django_reactor.tasks.ReactorBackend"}}``.

Celery's ``autodiscover_tasks()`` imports this package in every worker, with or without the
framework installed, so it imports the backend only when asked for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import ReactorBackend, ReactorTask

__all__ = ["ReactorBackend", "ReactorTask"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
