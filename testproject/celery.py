"""The example project's Celery app (Celery's Django layout).

Run a worker with ``celery -A testproject worker -l info`` and the sweeper with
``celery -A testproject beat`` (or ``python manage.py reactor_sweep --loop``).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

app = Celery("testproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
