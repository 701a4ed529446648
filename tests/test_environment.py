"""When the run requires real services, it is really using them."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_suite_runs_on_postgresql() -> None:
    assert connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        assert int(cursor.fetchone()[0].split(".")[0]) >= 13


@pytest.mark.redis
def test_redis_answers() -> None:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    assert client.ping()
