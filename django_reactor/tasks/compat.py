"""Where the tasks framework comes from: ``django.tasks`` (Django 6.0 and later), else the
``django-tasks`` backport (``pip install 'django-reactor[tasks]'`` on Django 5.2).

Every other module of ``django_reactor.tasks`` imports the framework from here, and only here.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

# Type-checked against the backport (the one installed here); Django 6 is read the same way.
if TYPE_CHECKING or find_spec("django.tasks") is None:
    try:
        from django_tasks import task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import (
            DEFAULT_TASK_PRIORITY,
            DEFAULT_TASK_QUEUE_NAME,
            TASK_MAX_PRIORITY,
            TASK_MIN_PRIORITY,
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
            task,
        )
        from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
    except ImportError as exc:
        raise ImportError(
            "django_reactor.tasks needs Django's tasks framework: Django 6.0 or later, or the "
            "django-tasks backport on Django 5.2 (pip install 'django-reactor[tasks]')"
        ) from exc

    FRAMEWORK = "django_tasks"
else:  # pragma: no cover - Django 6 needs Python 3.12
    from django.tasks import task_backends
    from django.tasks.backends.base import (
        BaseTaskBackend,
    )
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        DEFAULT_TASK_QUEUE_NAME,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
        task,
    )
    from django.tasks.exceptions import (
        InvalidTask as InvalidTaskError,
    )
    from django.tasks.exceptions import (
        TaskResultDoesNotExist,
    )
    from django.tasks.signals import (
        task_enqueued,
        task_finished,
        task_started,
    )

    FRAMEWORK = "django.tasks"

__all__ = [
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
