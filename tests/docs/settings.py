"""Settings of the processes a tutorial starts (its commands, worker, web server and shell):
the example project's, on a Celery queue of the test run's own.

Everything else comes from the environment as the tutorial sets it (``DATABASE_URL``,
``REACTOR_WEBHOOK_SECRET``) or as the test sets it (``CELERY_BROKER_URL``: the tests' broker).
"""

from __future__ import annotations

import os

from testproject.settings import *  # noqa: F403

# The tutorial's worker listens on Celery's default queue, as the reader's does; here that
# queue is this test run's, so that parallel runs never take each other's tasks.
CELERY_TASK_DEFAULT_QUEUE = os.environ["REACTOR_DOCS_QUEUE"]
