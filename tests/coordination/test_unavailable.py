"""An unreachable backend fails closed: every operation raises CoordinationUnavailable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError, ProgrammingError

from django_reactor.coordination import CoordinationUnavailable, Window
from django_reactor.coordination.backends.base import CoordinationBackend
from django_reactor.coordination.backends.database import DatabaseBackend
from django_reactor.coordination.backends.redis import RedisBackend

OPERATIONS: list[tuple[str, Callable[[CoordinationBackend], Any]]] = [
    ("server_time", lambda b: b.server_time()),
    ("acquire_lock", lambda b: b.acquire_lock("k", "a", 1)),
    ("extend_lock", lambda b: b.extend_lock("k", "a", 1)),
    ("release_lock", lambda b: b.release_lock("k", "a")),
    ("lock_holder", lambda b: b.lock_holder("k")),
    ("acquire_semaphore", lambda b: b.acquire_semaphore("k", "a", 1, 1)),
    ("release_semaphore", lambda b: b.release_semaphore("k", "a")),
    ("semaphore_holders", lambda b: b.semaphore_holders("k")),
    ("check_rate", lambda b: b.check_rate("k", [Window(1, 1)])),
    ("reserve_period", lambda b: b.reserve_period("k", "b", "a", 1)),
    ("confirm_period", lambda b: b.confirm_period("k", "b", "a", 1)),
    ("enqueue_ordered", lambda b: b.enqueue_ordered("k", "a")),
    ("ordered_head", lambda b: b.ordered_head("k", 1)),
    ("peek_ordered", lambda b: b.peek_ordered("k")),
    ("ordered_status", lambda b: b.ordered_status("k")),
]


@pytest.mark.parametrize(("name", "operation"), OPERATIONS, ids=[n for n, _ in OPERATIONS])
def test_redis_unreachable_fails_closed(name: str, operation: Callable[..., Any]) -> None:
    backend = RedisBackend("redis://127.0.0.1:1/0", prefix="unreachable")
    with pytest.raises(CoordinationUnavailable, match="Redis is unreachable"):
        operation(backend)


class _RefusingScript:
    def __init__(self, message: str) -> None:
        self.message = message

    def __call__(self, **kwargs: Any) -> Any:
        import redis.exceptions

        raise redis.exceptions.ResponseError(self.message)


class _RefusingClient:
    def __init__(self, message: str) -> None:
        self.message = message

    def register_script(self, source: str) -> _RefusingScript:
        return _RefusingScript(self.message)


def test_a_full_or_read_only_redis_fails_closed() -> None:
    for message in ["OOM command not allowed when used memory > 'maxmemory'", "READONLY replica"]:
        backend = RedisBackend(client=_RefusingClient(message), prefix="p")
        with pytest.raises(CoordinationUnavailable, match="refused"):
            backend.acquire_lock("k", "a", 1)
    backend = RedisBackend(client=_RefusingClient("ERR bug in a script"), prefix="p")
    import redis.exceptions

    with pytest.raises(redis.exceptions.ResponseError):
        backend.acquire_lock("k", "a", 1)


@pytest.mark.django_db
def test_a_failing_database_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = DatabaseBackend()

    def lost(self: DatabaseBackend) -> float:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(DatabaseBackend, "_now", lost)
    monkeypatch.setattr(DatabaseBackend, "_run_sql", lambda self, *args: lost(self))
    for name, operation in OPERATIONS:
        if name in ("peek_ordered", "lock_holder", "ordered_status"):
            continue  # these do not read the clock when nothing is held
        with pytest.raises(CoordinationUnavailable, match="closed the connection"):
            operation(backend)


@pytest.mark.django_db
def test_a_missing_table_is_not_mistaken_for_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(self: DatabaseBackend) -> float:
        raise ProgrammingError('relation "django_reactor_coordinationlock" does not exist')

    monkeypatch.setattr(DatabaseBackend, "_now", missing)
    monkeypatch.setattr(DatabaseBackend, "_run_sql", lambda self, *args: missing(self))
    with pytest.raises(ProgrammingError):
        DatabaseBackend().acquire_lock("k", "a", 1)
