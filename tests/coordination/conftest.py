"""Fixtures of the coordination tests: one suite, run on each backend.

Redis runs against the real server of ``settings.REDIS_URL``, on a database number of its own
(8: other tests flush theirs) and with a key prefix per test, deleted afterwards, so runs never
collide. The database backend runs on the test database.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings

from django_reactor.coordination.backends.base import CoordinationBackend

#: The tests' Redis: the suite's server, database 8.
REDIS_URL = settings.REDIS_URL.rsplit("/", 1)[0] + "/8"

BACKENDS = [
    pytest.param("redis", marks=pytest.mark.redis, id="redis"),
    pytest.param("database", marks=pytest.mark.django_db, id="database"),
]


def redis_backend(prefix: str) -> CoordinationBackend:
    """A Redis backend on the tests' Redis whose keys all start with ``prefix``."""
    from django_reactor.coordination.backends.redis import RedisBackend

    return RedisBackend(REDIS_URL, prefix=prefix)


def drop_redis_keys(prefix: str) -> None:
    """Delete every key a test's Redis backend made."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def prefix() -> str:
    """A Redis key prefix of the test's own."""
    return f"reactor-coord-test-{uuid.uuid4().hex}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, prefix: str) -> Iterator[CoordinationBackend]:
    """Each backend in turn (database: on the test database, in the test's transaction)."""
    if request.param == "redis":
        yield redis_backend(prefix)
        drop_redis_keys(prefix)
    else:
        from django_reactor.coordination.backends.database import DatabaseBackend

        yield DatabaseBackend()


@pytest.fixture
def key() -> str:
    """A coordination key no other test uses."""
    return f"key-{uuid.uuid4().hex[:12]}"


def wait_until_server_time(backend: CoordinationBackend, moment: float) -> None:
    """Let the backend server's clock pass ``moment`` (time passing, not synchronisation)."""
    import time

    while (left := moment - backend.server_time()) > 0:
        time.sleep(min(left + 0.005, 0.5))
