"""A fresh project (default settings, Django's local-memory cache) with a reactor that takes a
lock: the system check says so, ``run()`` refuses before writing anything, a worker fails the
run cleanly, and the ordered-lock command answers with a plain error."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_reactor import Lock, Reactor, services, step
from django_reactor.checks import check_coordination
from django_reactor.exceptions import ReactorImproperlyConfigured
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import Tracked, ledger

pytestmark = pytest.mark.django_db

FRESH_PROJECT = {
    "CACHES": {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
    "REACTOR": {},
}


class Checkout(Reactor):
    charge = step(Tracked)

    class Meta:
        coordination = [Lock("checkout")]
        background = "all"


@pytest.fixture
def fresh_project() -> Iterator[None]:
    with override_settings(**FRESH_PROJECT):
        yield


def test_the_system_check_reports_coordination_without_a_backend(fresh_project: Any) -> None:
    errors = [m for m in check_coordination() if m.id == "django_reactor.E010"]
    assert len(errors) == 1
    assert "cannot be set up" in errors[0].msg
    assert "COORDINATION_REDIS" in errors[0].hint


def test_a_configured_backend_passes_the_check() -> None:
    assert [m.id for m in check_coordination()] == []


def test_run_refuses_before_writing_anything(fresh_project: Any) -> None:
    with pytest.raises(ReactorImproperlyConfigured, match="COORDINATION_REDIS"):
        Checkout.run({})
    assert not Execution.objects.exists()


def test_a_worker_without_a_backend_fails_the_run_and_runs_nothing() -> None:
    outcome = Checkout.run({})  # started where coordination is configured
    with override_settings(**FRESH_PROJECT):
        result = services.resume(outcome.execution_id)
    assert result is not None
    assert result.error.kind == "coordination_unavailable"
    assert "coordination is not configured" in result.error.message
    row = Execution.objects.get(pk=outcome.execution_id)
    assert (row.status, row.lease_owner) == (ExecutionStatus.FAILED, None)
    assert ledger.calls == []


def test_the_ordered_lock_command_answers_with_a_plain_error(fresh_project: Any) -> None:
    with pytest.raises(CommandError, match="coordination is not configured"):
        call_command("reactor_ordered_lock", "account-7", stdout=StringIO())
