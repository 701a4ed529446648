"""The lazy REACTOR settings object."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_reactor.conf import DEFAULTS, Count, Flag, ReactorSettings, Seconds, reactor_settings
from django_reactor.exceptions import ReactorImproperlyConfigured


def test_defaults_apply() -> None:
    with override_settings(REACTOR={}):
        assert reactor_settings.LEASE_SECONDS == DEFAULTS["LEASE_SECONDS"]


def test_override_settings_is_seen_and_undone() -> None:
    before = reactor_settings.LEASE_SECONDS
    with override_settings(REACTOR={"LEASE_SECONDS": 5}):
        assert reactor_settings.LEASE_SECONDS == 5
    assert reactor_settings.LEASE_SECONDS == before


def test_unknown_names_are_errors() -> None:
    with pytest.raises(AttributeError, match="REACTOR has no setting 'NOPE'"):
        reactor_settings.NOPE  # noqa: B018


def test_beat_schedule_reads_no_settings_and_routes_to_the_queue() -> None:
    from django_reactor.celery import beat_schedule

    assert beat_schedule(5) == {
        "django-reactor-sweep": {"task": "django_reactor.sweep", "schedule": 5.0}
    }
    assert beat_schedule(5, queue="sagas")["django-reactor-sweep"]["options"] == {"queue": "sagas"}


@pytest.mark.parametrize("name", sorted(ReactorSettings.declared()))
def test_every_default_reads_back_with_its_declared_type(name: str) -> None:
    setting = ReactorSettings.declared()[name]
    with override_settings(REACTOR={}):
        value = getattr(reactor_settings, name)
    expected = {Seconds: float, Count: int, Flag: bool}.get(type(setting))
    if expected is not None:
        assert type(value) is expected
    assert value == DEFAULTS[name]


def test_numbers_are_given_their_declared_type() -> None:
    with override_settings(REACTOR={"LEASE_SECONDS": 5, "SWEEP_BATCH": 20.0}):
        assert reactor_settings.LEASE_SECONDS == 5.0
        assert type(reactor_settings.LEASE_SECONDS) is float
        assert reactor_settings.SWEEP_BATCH == 20
        assert type(reactor_settings.SWEEP_BATCH) is int


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("LEASE_SECONDS", "30", "must be a number of seconds, got '30' (str)"),
        ("LEASE_SECONDS", True, "must be a number of seconds, got True (bool)"),
        ("SWEEP_BATCH", 2.5, "must be a whole number, got 2.5 (float)"),
        ("API_MAX_BODY_BYTES", "65536", "must be a whole number, got '65536' (str)"),
        ("REFUSE_INLINE_IN_TRANSACTION", 0, "must be True or False, got 0 (int)"),
        ("RESUME_TOKENS", "yes", "must be True or False, got 'yes' (str)"),
        ("CELERY_QUEUE", 5, "must be None or a string, got 5 (int)"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_key(
    name: str, value: object, expected: str
) -> None:
    with (
        override_settings(REACTOR={name: value}),
        pytest.raises(ReactorImproperlyConfigured) as refused,
    ):
        getattr(reactor_settings, name)
    assert str(refused.value) == f"REACTOR[{name!r}] {expected}"


def test_a_refused_value_is_not_remembered() -> None:
    with override_settings(REACTOR={"LEASE_SECONDS": "30"}):
        with pytest.raises(ReactorImproperlyConfigured):
            reactor_settings.LEASE_SECONDS  # noqa: B018
        with pytest.raises(ReactorImproperlyConfigured):
            reactor_settings.LEASE_SECONDS  # noqa: B018
    with override_settings(REACTOR={"LEASE_SECONDS": 30}):
        assert reactor_settings.LEASE_SECONDS == 30.0


def test_defaults_list_every_declared_key() -> None:
    assert list(DEFAULTS) == list(ReactorSettings.declared())
    assert ReactorSettings.LEASE_SECONDS.name == "LEASE_SECONDS"
