"""The lazy REACTOR settings object."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_reactor.conf import DEFAULTS, reactor_settings


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
