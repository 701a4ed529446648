"""What the reactor_* commands steer is recorded as the command and the OS user, via
"command", with --reason; reactor_show shows who steered a run."""

from __future__ import annotations

import datetime as dt
import getpass
import json
import uuid
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_reactor import Paused, Reactor, interrupt, services, sleep, step, store
from django_reactor.coordination import get_backend
from django_reactor.models import AuditEntry
from tests.integration.reactors import FAIL_AT, Tracked, Transfer
from tests.schedules.reactors import NightlyReport

pytestmark = pytest.mark.django_db(transaction=True)

INPUTS = {"account": "a", "amount": 5, "pin": "1"}
USER = getpass.getuser()


class AuditWait(Reactor):
    first = step(Tracked)
    approval = interrupt(after="first")


class AuditNap(Reactor):
    first = step(Tracked)
    nap = sleep(dt.timedelta(hours=1), after=["first"])


def command(name: str, *args: Any, **options: Any) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out, stderr=StringIO(), no_color=True, **options)
    return out.getvalue()


def recorded() -> list[tuple[str, str, str, str]]:
    return [(e.action, e.who, e.via, e.reason) for e in AuditEntry.objects.order_by("at", "id")]


def paused() -> str:
    outcome = AuditWait.run({})
    assert isinstance(outcome, Paused)
    return str(outcome.execution_id)


def test_each_steering_command_is_recorded_as_itself_and_its_os_user() -> None:
    command("reactor_cancel", paused(), reason="wrong customer")
    command("reactor_undo", str(Transfer.run(INPUTS).execution_id), reason="refund")
    FAIL_AT.add("credit")
    failed = Transfer.run(INPUTS)
    FAIL_AT.clear()
    command("reactor_retry", str(failed.execution_id), reason="bank back")
    command("reactor_wake", str(AuditNap.run({}).execution_id), reason="now please")
    command("reactor_resume", paused(), "--reason", "approved by phone", "ok=1")
    assert recorded() == [
        ("cancel", f"reactor_cancel by {USER}", "command", "wrong customer"),
        ("undo", f"reactor_undo by {USER}", "command", "refund"),
        ("retry", f"reactor_retry by {USER}", "command", "bank back"),
        ("wake", f"reactor_wake by {USER}", "command", "now please"),
        ("resume", f"reactor_resume by {USER}", "command", "approved by phone"),
    ]


def test_schedule_subject_and_lock_commands_take_a_reason_too() -> None:
    schedule = services.schedules.create(NightlyReport, every=3600, inputs={"region": "eu"})
    command("reactor_schedule", "pause", schedule.name, reason="quiet hours")
    command("reactor_schedule", "resume", schedule.name)
    command("reactor_schedule", "run-now", schedule.name, reason="asked")
    store.subject_keys.live_key("cust-1")
    command("reactor_forget_subject", "cust-1", reason="ticket 9")
    reactor = {
        **settings.REACTOR,
        "COORDINATION_BACKEND": "django_reactor.coordination.backends.database.DatabaseBackend",
    }
    with override_settings(REACTOR=reactor):
        run = str(uuid.uuid4())
        get_backend().enqueue_ordered("ordered:k-1", run)
        command("reactor_ordered_lock", "k-1", skip=run, reason="stuck head")
        command("reactor_ordered_lock", "k-1", reset=True)
    assert recorded() == [
        ("schedule_pause", f"reactor_schedule by {USER}", "command", "quiet hours"),
        ("schedule_resume", f"reactor_schedule by {USER}", "command", ""),
        ("schedule_run_now", f"reactor_schedule by {USER}", "command", "asked"),
        ("forget_subject", f"reactor_forget_subject by {USER}", "command", "ticket 9"),
        ("lock_skip", f"reactor_ordered_lock by {USER}", "command", "stuck head"),
        ("lock_reset", f"reactor_ordered_lock by {USER}", "command", ""),
    ]


def test_a_refused_command_records_nothing() -> None:
    done = str(Transfer.run(INPUTS).execution_id)
    with pytest.raises(CommandError):
        command("reactor_cancel", done, reason="too late")
    with pytest.raises(CommandError):
        command("reactor_retry", done)
    assert recorded() == []


def test_reactor_show_says_who_steered_the_run() -> None:
    run = paused()
    command("reactor_cancel", run, reason="duplicate")
    text = command("reactor_show", run)
    assert "steered:" in text
    assert f"cancel by reactor_cancel by {USER} via command: duplicate" in text
    assert f"run cancelled (duplicate) by reactor_cancel by {USER} via command" in text
    data = json.loads(command("reactor_show", run, json=True))
    assert [(s["action"], s["who"], s["reason"]) for s in data["steering"]] == [
        ("cancel", f"reactor_cancel by {USER}", "duplicate")
    ]
