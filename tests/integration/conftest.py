"""Fixtures of the database tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_reactor.coordination import get_backend
from tests.coordination.conftest import REDIS_URL, drop_redis_keys


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("database"),
    ]
)
def backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Each backend in turn, with keys of the test's own."""
    prefix = f"reactor-coord-run-{uuid.uuid4().hex}"
    path = {
        "redis": "django_reactor.coordination.backends.redis.RedisBackend",
        "database": "django_reactor.coordination.backends.database.DatabaseBackend",
    }[request.param]
    reactor = {
        **settings.REACTOR,
        "COORDINATION_BACKEND": path,
        "COORDINATION_REDIS": REDIS_URL,
        "COORDINATION_KEY_PREFIX": prefix,
        "RATE_LIMITS": {"partner": {"minute": 2}},
    }
    with override_settings(REACTOR=reactor):
        yield get_backend()
    if request.param == "redis":
        drop_redis_keys(prefix)
