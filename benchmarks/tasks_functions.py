"""The task both backends run in ``tasks_backend.py``: a no-op returning its argument."""

from __future__ import annotations

from django_reactor.tasks.compat import task


@task()
def echo(value: int) -> int:
    return value


@task(backend="db")
def echo_db(value: int) -> int:
    return value
