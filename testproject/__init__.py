"""The example project. Importing it loads its Celery app, so shared tasks bind to it."""

from __future__ import annotations

from .celery import app as celery_app

__all__ = ["celery_app"]
