"""Settings for the test suite: the example project, on real services when they are reachable.

PostgreSQL comes from ``DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/postgres``)
and Redis from ``REDIS_URL`` (default ``redis://127.0.0.1:6379/9``). When one is not reachable the
suite falls back (SQLite; Redis tests skipped) and says so in its summary, unless
``REACTOR_REQUIRE_SERVICES=1``, which turns a missing service into a failed run.

``DATABASE_URL=mysql://root@127.0.0.1:3306/test`` runs the suite on MariaDB (or MySQL) instead:
the MariaDB pass of ``.ci/run``. Tests marked ``postgres`` are then skipped, saying so, unless
they are also marked ``mariadb`` (they need a database server, not PostgreSQL's SQL).
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from testproject.settings import *  # noqa: F403
from testproject.settings import database_from_url

REQUIRE_SERVICES = os.environ.get("REACTOR_REQUIRE_SERVICES") == "1"
DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
#: The database server the suite runs on: "PostgreSQL" (the default) or "MariaDB".
DATABASE_SERVER = (
    "MariaDB" if urlparse(DATABASE_URL).scheme in ("mysql", "mariadb") else "PostgreSQL"
)
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/9")


def _postgres_problem(url: str) -> str | None:
    if urlparse(url).scheme not in ("postgres", "postgresql", "pgsql"):
        return None
    try:
        import psycopg

        with psycopg.connect(url.replace("pgsql://", "postgresql://"), connect_timeout=3):
            return None
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"


def _mariadb_problem(url: str) -> str | None:
    try:
        import MySQLdb

        entry = database_from_url(url)
        MySQLdb.connect(
            host=entry["HOST"],
            port=int(str(entry["PORT"] or 3306)),
            user=entry["USER"],
            password=entry["PASSWORD"],
            connect_timeout=3,
        ).close()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _redis_problem(url: str) -> str | None:
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


SERVICE_PROBLEMS: dict[str, str] = {}
if problem := (_mariadb_problem if DATABASE_SERVER == "MariaDB" else _postgres_problem)(
    DATABASE_URL
):
    SERVICE_PROBLEMS[DATABASE_SERVER] = f"{DATABASE_URL}: {problem}"
if problem := _redis_problem(REDIS_URL):
    SERVICE_PROBLEMS["Redis"] = f"{REDIS_URL}: {problem}"

if DATABASE_SERVER in SERVICE_PROBLEMS:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
else:
    default = database_from_url(DATABASE_URL)
    # A database name of its own per run, so parallel runs on one server never collide.
    default["TEST"] = {**default.get("TEST", {}), "NAME": f"test_django_reactor_{os.getpid()}"}
    DATABASES = {"default": default}

# A second database on the same server runs can be routed to (REACTOR["DATABASE"]), for the
# tests of a fleet sharded by reactor; created only for the tests that ask for it.
if DATABASE_SERVER not in SERVICE_PROBLEMS:
    shard = database_from_url(DATABASE_URL)
    shard["TEST"] = {**shard.get("TEST", {}), "NAME": f"test_django_reactor_shard_{os.getpid()}"}
    DATABASES["shard"] = shard

# A second database, so that tests can show what an atomic step refuses: a query on another
# alias, which could not commit with the step's checkpoint.
DATABASES["elsewhere"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}

if "Redis" not in SERVICE_PROBLEMS:
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"reactor-tests-{os.getpid()}",
        }
    }

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
REACTOR = {
    "IDEMPOTENCY_WAIT_SECONDS": 10,
    # A queue of this run's own, so parallel test runs never take each other's tasks.
    "CELERY_QUEUE": f"reactor-tests-{os.getpid()}",
    "SWEEP_INTERVAL": 1.0,
    "REDISPATCH_AFTER": 3.0,
    # Coordination on a Redis database of its own (other tests flush theirs), keys prefixed by
    # this run; on the database when Redis is not reachable.
    "COORDINATION_BACKEND": "django_reactor.coordination.backends.database.DatabaseBackend"
    if "Redis" in SERVICE_PROBLEMS
    else "django_reactor.coordination.backends.redis.RedisBackend",
    "COORDINATION_REDIS": REDIS_URL.rsplit("/", 1)[0] + "/8",
    "COORDINATION_KEY_PREFIX": f"reactor-tests-{os.getpid()}",
}
# Broker on a Redis database of the tests' own; in memory when Redis is not reachable.
CELERY_BROKER_URL = (
    "memory://"
    if "Redis" in SERVICE_PROBLEMS
    else os.environ.get("CELERY_BROKER_URL", REDIS_URL.rsplit("/", 1)[0] + "/10")
)
# As recommended for workers (django_reactor.W005 otherwise).
CELERY_DB_REUSE_MAX = 1000
