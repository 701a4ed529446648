"""Celery signal handlers of the chaos soak's workers (loaded through ``CELERY_IMPORTS``).

Celery's own failure line (``Task ... raised unexpected: ...``) does not say which run the task
was for; these lines do, so that the soak's report can name the execution (or map) behind every
task failure and show what each worker process did with a run.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery.signals import task_failure, task_prerun

logger = logging.getLogger("tests.chaos.hooks")


@task_prerun.connect
def task_started(
    sender: Any = None, task_id: str | None = None, args: Any = None, **kwargs: Any
) -> None:
    """Log ``chaos-task start <task>[<id>] args=[...] pid=<pid>``."""
    logger.info(
        "chaos-task start %s[%s] args=%s pid=%d",
        getattr(sender, "name", sender),
        task_id,
        list(args or ()),
        os.getpid(),
    )


@task_failure.connect
def task_failed(
    sender: Any = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    args: Any = None,
    **kwargs: Any,
) -> None:
    """Log ``chaos-task failure <task>[<id>] args=[...] pid=<pid>: <exception>``."""
    logger.error(
        "chaos-task failure %s[%s] args=%s pid=%d: %r",
        getattr(sender, "name", sender),
        task_id,
        list(args or ()),
        os.getpid(),
        exception,
    )
