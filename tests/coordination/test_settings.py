"""Choosing the backend through settings, and what happens when they are wrong."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_reactor.coordination import get_backend
from django_reactor.coordination.backends.database import DatabaseBackend
from django_reactor.coordination.backends.redis import RedisBackend
from django_reactor.coordination.validation import settings_problems
from django_reactor.exceptions import ReactorImproperlyConfigured
from tests.coordination.conftest import REDIS_URL

DATABASE = "django_reactor.coordination.backends.database.DatabaseBackend"


@pytest.mark.redis
@override_settings(REACTOR={})  # the library's defaults, not the test suite's
def test_the_default_is_redis_through_the_default_cache() -> None:
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    assert backend.prefix == "django_reactor"
    assert get_backend() is backend


@pytest.mark.redis
@override_settings(REACTOR={"COORDINATION_REDIS": REDIS_URL, "COORDINATION_KEY_PREFIX": "app"})
def test_a_redis_url_and_a_prefix() -> None:
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    assert backend.prefix == "app"
    assert backend.server_time() > 0


@override_settings(REACTOR={"COORDINATION_BACKEND": DATABASE})
def test_the_database_backend_is_chosen_by_its_path() -> None:
    assert isinstance(get_backend(), DatabaseBackend)
    assert settings_problems() == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"COORDINATION_BACKEND": "no.such.Backend"}, "cannot be imported"),
        ({"COORDINATION_BACKEND": "django_reactor.conf.ReactorSettings"}, "not a Coordination"),
        ({"COORDINATION_REDIS": "no-such-cache"}, "neither a redis:// URL nor the alias"),
    ],
)
def test_bad_settings_are_explained(value: dict[str, str], message: str) -> None:
    with (
        override_settings(REACTOR=value),
        pytest.raises(ReactorImproperlyConfigured, match=message),
    ):
        get_backend()


@override_settings(
    REACTOR={
        "COORDINATION_BACKEND": "redis",
        "COORDINATION_REDIS": "",
        "COORDINATION_KEY_PREFIX": 3,
        "RATE_LIMITS": [],
    }
)
def test_settings_problems_lists_every_bad_value() -> None:
    problems = settings_problems()
    assert len(problems) == 4
    for name in ["RATE_LIMITS", "COORDINATION_BACKEND", "COORDINATION_REDIS", "KEY_PREFIX"]:
        assert any(name in p for p in problems), name
