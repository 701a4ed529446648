"""Tasks the tests of ``django_reactor.tasks`` enqueue (imported by the workers by path)."""

from __future__ import annotations

import os
import time
from pathlib import Path
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


@task()
def stays_until_killed(directory: str) -> dict[str, int]:
    """The first attempt writes its pid and waits (bounded) to be killed; the next returns."""
    marker = Path(directory) / "pids"
    first = not marker.exists()
    with marker.open("a") as pids:
        pids.write(f"{os.getpid()}\n")
    if first:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the test kills this process meanwhile
            time.sleep(0.05)
        raise AssertionError("the test did not kill the worker in time")
    return {"runs": len(marker.read_text().split())}
