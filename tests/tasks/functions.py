"""Tasks the tests of ``django_reactor.tasks`` enqueue (imported by the workers by path)."""

from __future__ import annotations

from typing import Any

from django_reactor import Retry
from django_reactor.tasks.compat import TaskContext, task


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def explode(message: str) -> None:
    raise ValueError(message)


@task(retry=Retry(attempts=3, backoff="fixed", delay=0))
def flaky(context_marker: str) -> str:
    return context_marker


@task(takes_context=True, retry=Retry(attempts=3, backoff="fixed", delay=0))
def fails_twice(context: TaskContext, value: Any) -> Any:
    if context.attempt < 3:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return {"value": value, "attempt": context.attempt}


@task()
async def add_async(a: int, b: int) -> int:
    return a + b
