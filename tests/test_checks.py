"""System checks report each misconfiguration with its stable id."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_reactor.checks import check_database, check_settings
from django_reactor.conf import ReactorSettings, Setting, reactor_settings
from django_reactor.exceptions import ReactorImproperlyConfigured


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def test_default_settings_pass() -> None:
    assert check_settings() == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("not a dict", ["django_reactor.E001"]),
        ({"LEASE_SECONDS": 0}, ["django_reactor.E002"]),
        ({"IDEMPOTENCY_WAIT_SECONDS": "10"}, ["django_reactor.E002"]),
        ({"AUTODISCOVER_MODULES": "reactors"}, ["django_reactor.E003"]),
        ({"LEASE_SECOND": 30}, ["django_reactor.W001"]),
        ({"REFUSE_INLINE_IN_TRANSACTION": "no"}, ["django_reactor.E004"]),
        ({"CHECKPOINT_PREPARED_STATEMENTS": 1}, ["django_reactor.E004"]),
        ([], ["django_reactor.E001"]),
        ({"SWEEP_BATCH": 0}, ["django_reactor.E002"]),
        ({"ASYNC_WAIT_TIMEOUT": -1}, ["django_reactor.E002"]),
        ({"CELERY_QUEUE": ""}, ["django_reactor.E005"]),
        ({"REDIS_URL": 6379}, ["django_reactor.E005"]),
        ({"MAX_RECOVERY_ATTEMPTS": 2.5}, ["django_reactor.E002"]),
        ({"SWEEP_BATCH": 100.0}, []),
        ({"LEASE_SECONDS": "60"}, ["django_reactor.E002"]),
        ({"WEBHOOK_TOLERANCE": True}, ["django_reactor.E002"]),
        ({"CONTENTION_DELAY": 0, "MAX_CONTENTION_SNOOZES": 0}, []),
        ({"CONTENTION_DELAY": -1}, ["django_reactor.E002"]),
        ({"MAX_CONTENTION_SNOOZES": "many"}, ["django_reactor.E002"]),
        ({"RESUME_TOKENS": 1}, ["django_reactor.E004"]),
        ({"API_RESUME_RATE": 120}, ["django_reactor.E005"]),
        ({"LEASE_SECONDS": float("inf")}, ["django_reactor.E002"]),
        ({"STEP_TIMEOUT": float("inf")}, ["django_reactor.E002"]),
        ({"STEP_TIMEOUT": 1e15}, ["django_reactor.E002"]),
        ({"STEP_TIMEOUT": 3600}, []),
        ({"ENCRYPTION_KEYS": "one-key"}, ["django_reactor.E012"]),
        ({"ENCRYPTION_KEYS": ["not-a-fernet-key"]}, ["django_reactor.E012"]),
        ({"ENCRYPTION_KEYS": ["A" * 43 + "="]}, []),
        ({"METRICS_AUTH": "open"}, ["django_reactor.E016"]),
        ({"METRICS_AUTH": ["bearer"]}, ["django_reactor.E016"]),
        ({"METRICS_AUTH": ["open", "user"]}, ["django_reactor.E016"]),
        ({"METRICS_AUTH": ["token"]}, ["django_reactor.E016"]),
        ({"METRICS_AUTH": ["token"], "METRICS_TOKENS": ["short"]}, ["django_reactor.E016"]),
        ({"METRICS_TOKENS": "a-single-token-not-a-list"}, ["django_reactor.E016"]),
        ({"METRICS_AUTH": ["token", "user"], "METRICS_TOKENS": ["t" * 16]}, []),
        ({"METRICS_AUTH": ["open"]}, []),
    ],
)
def test_bad_settings_are_reported(value: Any, expected: list[str]) -> None:
    with override_settings(REACTOR=value):
        assert ids(check_settings()) == expected


def test_a_duration_setting_no_date_can_hold_is_reported_plainly() -> None:
    """A lease that far away could not be written: every run would fail on it."""
    with override_settings(REACTOR={"LEASE_SECONDS": 1e15, "SWEEP_INTERVAL": float("inf")}):
        messages = [str(m.msg) for m in check_settings()]
    assert len(messages) == 2
    assert messages[0].startswith(
        "REACTOR['LEASE_SECONDS'] is 1e+15 s (about 31,688,088 years), longer than a date can "
        "hold: the latest time django_reactor accepts, 9999-01-01 (UTC), is "
    )
    assert messages[1] == (
        "REACTOR['SWEEP_INTERVAL'] cannot be infinite; give a finite timedelta or number of "
        "seconds."
    )


# The keys whose values are coerced to a type (the others are checked where they are used).
TYPED = sorted(
    n for n, s in ReactorSettings.declared().items() if type(s).coerce is not Setting.coerce
)


@pytest.mark.parametrize("name", TYPED)
def test_what_the_settings_object_refuses_the_check_reports(name: str) -> None:
    with override_settings(REACTOR={name: object()}):  # of no declared type
        with pytest.raises(ReactorImproperlyConfigured, match=name):
            getattr(reactor_settings, name)
        reported = [m.id for m in check_settings() if name in m.msg]
    assert reported in (
        ["django_reactor.E002"],
        ["django_reactor.E004"],
        ["django_reactor.E005"],
        ["django_reactor.E012"],
        ["django_reactor.E013"],
    )


def test_sqlite_is_flagged_for_deployment(settings: Any) -> None:
    from django.db import connection

    expected = ["django_reactor.W002"] if connection.vendor == "sqlite" else []
    assert ids(check_database()) == expected


class _Dialect:
    """Stands in for the store's dialect of a database the suite does not run on."""

    prepares_statements = False

    def __init__(self, name: str) -> None:
        self.name = name


def test_a_database_django_reactor_is_not_tested_on_is_flagged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_reactor import store

    for tested in ("postgresql", "mysql", "sqlite"):
        monkeypatch.setattr(store, "dialect_for", lambda alias, name=tested: _Dialect(name))
        assert "django_reactor.W007" not in ids(check_database())
    monkeypatch.setattr(store, "dialect_for", lambda alias: _Dialect("oracle"))
    [message] = [m for m in check_database() if m.id == "django_reactor.W007"]
    assert "'oracle'" in message.msg
    assert "PostgreSQL and MariaDB/MySQL" in (message.hint or "")


def test_mariadb_at_another_isolation_level_than_read_committed_is_flagged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import connection

    from django_reactor import store

    monkeypatch.setattr(store, "dialect_for", lambda alias: _Dialect("mysql"))
    options = dict(connection.settings_dict.get("OPTIONS") or {})
    for level in (None, "read committed", "READ COMMITTED"):
        monkeypatch.setitem(
            connection.settings_dict, "OPTIONS", {**options, "isolation_level": level}
        )
        assert "django_reactor.W008" not in ids(check_database())
    monkeypatch.setitem(
        connection.settings_dict, "OPTIONS", {**options, "isolation_level": "repeatable read"}
    )
    [message] = [m for m in check_database() if m.id == "django_reactor.W008"]
    assert "'repeatable read'" in message.msg
    assert "read committed" in (message.hint or "")


@pytest.mark.postgres
@pytest.mark.mariadb
@pytest.mark.django_db
def test_a_database_server_that_can_skip_locked_rows_is_not_flagged() -> None:
    assert ids(check_database(databases=["default"])) == []


def test_workers_that_close_their_connection_after_every_task_are_flagged(settings: Any) -> None:
    del settings.CELERY_DB_REUSE_MAX
    messages = [m for m in check_database() if m.id == "django_reactor.W005"]
    assert len(messages) == 1
    assert "CELERY_DB_REUSE_MAX is not set" in messages[0].msg
    assert "CELERY_DB_REUSE_MAX = 1000" in (messages[0].hint or "")
    settings.CELERY_DB_REUSE_MAX = 1000
    assert "django_reactor.W005" not in ids(check_database())


@pytest.mark.postgres
@pytest.mark.django_db
def test_prepared_checkpoints_behind_a_pooler_are_flagged() -> None:
    from django.db import connection

    original = connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS", False)
    connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
    try:
        assert ids(check_database()) == ["django_reactor.W003"]
        with override_settings(REACTOR={"CHECKPOINT_PREPARED_STATEMENTS": False}):
            assert ids(check_database()) == []
    finally:
        connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = original


@pytest.mark.postgres
@pytest.mark.django_db
def test_prepared_checkpoints_through_a_pooler_are_found_when_the_database_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pooler answers the client's startup with a backend id of its own (PgBouncer: random),
    # not the pid of the server process: ``check --deploy --database default`` sees it even
    # without DISABLE_SERVER_SIDE_CURSORS. tests/workers/test_pgbouncer.py does it for real.
    import psycopg

    monkeypatch.setattr(psycopg.ConnectionInfo, "backend_pid", property(lambda info: 1))
    messages = check_database(databases=["default"])
    assert ids(messages) == ["django_reactor.W003"]
    assert "reached through a connection pooler" in messages[0].msg
    assert ids(check_database()) == []  # without database access, settings only
    with override_settings(REACTOR={"CHECKPOINT_PREPARED_STATEMENTS": False}):
        assert ids(check_database(databases=["default"])) == []


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_direct_connection_is_not_taken_for_a_pooler() -> None:
    assert ids(check_database(databases=["default"])) == []


@pytest.mark.postgres
@pytest.mark.django_db
def test_prepared_checkpoints_are_not_flagged_with_psycopg2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import connection
    from django.db.backends.postgresql import psycopg_any

    monkeypatch.setattr(psycopg_any, "is_psycopg3", False)  # psycopg2 never prepares them
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    assert ids(check_database(databases=["default"])) == []


def test_a_broken_setting_does_not_stop_the_app_from_loading() -> None:
    from django.apps import apps

    with override_settings(REACTOR="oops"):
        apps.get_app_config("django_reactor").ready()
        assert ids(check_settings()) == ["django_reactor.E001"]


def test_the_database_check_survives_a_broken_setting() -> None:
    with override_settings(REACTOR="oops"):
        assert "django_reactor.E001" in ids(check_settings())
        check_database()  # reports nothing about REACTOR; E001 covers it


def test_api_settings_are_checked(settings: Any) -> None:
    from django_reactor.checks import check_settings

    settings.REACTOR = {
        "RESUME_AUTH": {"default": ["user", "carrier-pigeon"]},
        "WEBHOOK_SECRETS": ["whsec_not base64!"],
        "API_MAX_BODY_BYTES": 0,
    }
    ids = sorted(m.id for m in check_settings())
    assert ids == ["django_reactor.E002", "django_reactor.E006", "django_reactor.E007"]
    settings.REACTOR = {"WEBHOOK_SECRETS": []}
    assert [m.id for m in check_settings()] == ["django_reactor.W004"]
    settings.REACTOR = {"START_AUTH": {"default": ["user", "token"]}}
    (start,) = check_settings()
    assert start.id == "django_reactor.E014"
    assert start.msg == (
        "REACTOR['START_AUTH'] has ['user', 'token']; each entry must be a list of user, webhook."
    )
    settings.REACTOR = {"START_AUTH": ["webhook"], "WEBHOOK_SECRETS": []}
    assert [m.id for m in check_settings()] == ["django_reactor.W004"]


def test_middleware_entries_are_checked(settings: Any) -> None:
    from django_reactor.checks import check_settings

    settings.REACTOR = {"MIDDLEWARE": ["no.such.Module", "django_reactor.conf.DEFAULTS"]}
    messages = check_settings()
    assert [m.id for m in messages] == ["django_reactor.E008", "django_reactor.E008"]
    assert "cannot be imported" in messages[0].msg
    assert "not a RunObserver subclass" in messages[1].msg
    settings.REACTOR = {"MIDDLEWARE": ["django_reactor.observability.LogObserver"]}
    assert check_settings() == []


def test_a_per_reactor_key_that_names_no_registered_reactor_is_an_error(settings: Any) -> None:
    settings.REACTOR = {
        "RESUME_AUTH": {
            "default": ["user"],
            "PlaceOrder": ["token"],  # a class name
            "testproject.example.reactors.ApproveRefnd": ["webhook"],  # a typo
            "testproject.example.reactors.ApproveRefund": ["user", "token"],  # right
        },
        "WEBHOOK_SECRETS": {"default": ["one"], "shop.Restock": ["two"]},
    }
    found = [m for m in check_settings() if m.id == "django_reactor.E011"]
    assert [m.level for m in found] == [checks.ERROR] * 3
    by_key = {m.msg.split("entry for ", 1)[1].split(",", 1)[0]: m for m in found}
    assert set(by_key) == {
        "'PlaceOrder'",
        "'testproject.example.reactors.ApproveRefnd'",
        "'shop.Restock'",
    }
    assert by_key["'PlaceOrder'"].msg.startswith("REACTOR['RESUME_AUTH'] has an entry")
    assert "the resume endpoints accept no credential" in by_key["'PlaceOrder'"].msg
    assert by_key["'PlaceOrder'"].hint.startswith(
        "Did you mean 'testproject.example.reactors.PlaceOrder'?"
    )
    assert by_key["'testproject.example.reactors.ApproveRefnd'"].hint.startswith(
        "Did you mean 'testproject.example.reactors.ApproveRefund'?"
    )
    restock = by_key["'shop.Restock'"]
    assert restock.msg.startswith("REACTOR['WEBHOOK_SECRETS'] has an entry")
    assert "Did you mean 'testproject.example.reactors.RestockProduct'?" in restock.hint
    for message in found:  # every message names the reactors this process knows
        assert "Known reactors: " in message.hint
        assert "testproject.example.reactors.PlaceOrder" in message.hint


def test_per_reactor_settings_keyed_by_registered_names_pass(settings: Any) -> None:
    settings.REACTOR = {
        "RESUME_AUTH": {"default": ["user"], "testproject.example.reactors.PlaceOrder": ["token"]},
        "WEBHOOK_SECRETS": {"testproject.example.reactors.RestockProduct": ["two"]},
    }
    assert check_settings() == []


def test_manage_py_check_fails_on_a_misspelt_per_reactor_key(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "RESUME_AUTH": {"Checkout": ["user"]}}
    with pytest.raises(SystemCheckError, match=r"django_reactor\.E011"):
        call_command("check", stdout=StringIO(), stderr=StringIO())
