"""Small building blocks for tests: a call ledger and steps that record into it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django_reactor.engine.context import RunPolicy
from django_reactor.engine.executor import Executor, RunState
from django_reactor.engine.journal import MemoryJournal
from django_reactor.engine.outcomes import Outcome


class Ledger:
    """Records what step code did, in order: ``("run", "a")``, ``("undo", "a")``..."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, action: str, step: str) -> None:
        self.calls.append((action, step))

    def clear(self) -> None:
        self.calls.clear()


#: The suite's ledger, emptied before every test (``tests/conftest.py``).
ledger = Ledger()
#: Step names whose ``Tracked`` step raises; tests add to it, and it is emptied around every test.
FAIL_AT: set[str] = set()


def run_in_memory(
    reactor: type,
    inputs: Mapping[str, Any] | None = None,
    *,
    journal: MemoryJournal | None = None,
    sleeps: list[float] | None = None,
    policy: RunPolicy | None = None,
) -> tuple[Outcome, MemoryJournal]:
    """Run a reactor's definition with the pure executor and an in-memory journal."""
    journal = journal or MemoryJournal()
    recorded = sleeps if sleeps is not None else []
    executor = Executor(
        reactor.definition,  # type: ignore[attr-defined]
        journal,
        inputs=dict(inputs or {}),
        state=RunState(),
        policy=policy,
        sleep=recorded.append,
    )
    return executor.run(), journal


def trace(journal: MemoryJournal) -> list[tuple[str, str]]:
    """Step-level trace entries (run-level ones dropped) as ``(kind, step)``."""
    return [(e.kind, e.step) for e in journal.events if e.step]


def nested(depth: int) -> list[Any]:
    """A list nested ``depth`` levels deep (``[[[...]]]``), built without recursion."""
    top: list[Any] = []
    current = top
    for _ in range(depth - 1):
        child: list[Any] = []
        current.append(child)
        current = child
    return top
