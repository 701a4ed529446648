"""A run's page says what it waits for in time, its deadline and its last heartbeat, and
"Wake now" ends a sleep or starts a scheduled run."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_reactor import Reactor, sleep, step
from django_reactor.models import Dispatch, Execution, Interrupt, StepRecord

pytestmark = pytest.mark.django_db(transaction=True)


class Naps(Reactor):
    first = step(lambda: "first")
    nap = sleep(dt.timedelta(days=2), after=["first"])
    after = step(lambda: "after", wait_for=["nap"])

    class Meta:
        deadline = dt.timedelta(days=5)


def page(client: Client, execution_id: Any) -> str:
    response = client.get(
        reverse("admin:django_reactor_execution_change", args=[str(execution_id)])
    )
    assert response.status_code == 200
    return response.content.decode()


def wake_url(execution_id: Any) -> str:
    return reverse("admin:django_reactor_execution_wake", args=[str(execution_id)])


def test_a_sleeping_run_says_until_when_and_wakes_now(client_operator: Client) -> None:
    outcome = Naps.run({})
    html = page(client_operator, outcome.execution_id)
    assert "Sleeping until" in html
    assert "step nap" in html
    assert "Deadline" in html
    assert wake_url(outcome.execution_id) in html
    response = client_operator.post(wake_url(outcome.execution_id))
    assert response.status_code == 302
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.wake_at <= timezone.now()
    record = StepRecord.objects.get(execution_id=row.id, step="nap")
    assert dt.datetime.fromisoformat(record.result) <= timezone.now()  # the sleep ends now
    assert Dispatch.objects.filter(execution_id=row.id, reason="wake").exists()


def test_a_scheduled_run_says_when_it_starts(client_operator: Client) -> None:
    outcome = Naps.run({}, delay=dt.timedelta(hours=3))
    html = page(client_operator, outcome.execution_id)
    assert "Starts at" in html
    assert "Start the run now instead of at its time." in html


def test_a_run_that_waits_for_no_time_has_no_wake_button(client_operator: Client) -> None:
    class Quick(Reactor):
        a = step(lambda: "a")

    outcome = Quick.run({})
    html = page(client_operator, outcome.execution_id)
    assert wake_url(outcome.execution_id) not in html
    response = client_operator.post(wake_url(outcome.execution_id), follow=True)
    assert "waits for no time" in response.content.decode()


def test_the_last_heartbeat_is_shown(client_operator: Client) -> None:
    outcome = Naps.run({})
    Execution.objects.filter(pk=outcome.execution_id).update(
        heartbeat={"step": "first", "at": timezone.now().isoformat(), "details": {"rows": 500}}
    )
    html = page(client_operator, outcome.execution_id)
    assert "Last heartbeat" in html
    assert "rows" in html


def test_a_viewer_cannot_wake_a_run(client_viewer: Client) -> None:
    outcome = Naps.run({})
    assert client_viewer.post(wake_url(outcome.execution_id)).status_code == 403


#: How Django writes a time in the English locale (``Dec. 3, 2026, 10:04 a.m.``), which the
#: admin's pages never show: they write every time as ``2026-12-03 10:04:05``.
DJANGO_FORMAT = re.compile(r"\d{1,2}, \d{4}, (?:\d{1,2}(?::\d\d)? [ap]\.m\.|midnight|noon)")
ONE_FORMAT = re.compile(r"\d{4}-\d\d-\d\d</span> <span>\d\d:\d\d:\d\d")


def test_every_time_is_written_one_way(client_operator: Client) -> None:
    from tests.admin.reactors import Refund

    paused = Refund.run({"order": "T1"})
    Execution.objects.filter(pk=paused.execution_id).update(
        deadline_at=timezone.now() + dt.timedelta(days=3)
    )
    interrupt = Interrupt.objects.get(execution_id=paused.execution_id)
    Interrupt.objects.filter(pk=interrupt.pk).update(
        expires_at=timezone.now() + dt.timedelta(days=14)
    )
    pages = {
        "run": page(client_operator, paused.execution_id),
        "runs": client_operator.get(reverse("admin:django_reactor_execution_changelist")),
        "interrupts": client_operator.get(reverse("admin:django_reactor_interrupt_changelist")),
        "interrupt": client_operator.get(
            reverse("admin:django_reactor_interrupt_change", args=[interrupt.pk])
        ),
        "resume": client_operator.get(
            reverse("admin:django_reactor_execution_resume", args=[paused.execution_id, "approval"])
        ),
        "parked": client_operator.get(reverse("admin:django_reactor_execution_parked")),
    }
    for name, shown in pages.items():
        html = shown if isinstance(shown, str) else shown.content.decode()
        assert not DJANGO_FORMAT.search(html), (name, DJANGO_FORMAT.search(html))
        assert re.search(r"\d{4}-\d\d-\d\d(?:</span> <span>| )\d\d:\d\d:\d\d", html), name
    run = pages["run"]
    for field in ("created_at", "started_at", "updated_at"):
        cell = re.search(rf'field-{field}.*?<div class="readonly">(.*?)</div>', run, re.S)
        assert cell, field
        assert ONE_FORMAT.search(cell.group(1)), (field, cell.group(1))
    time_section = re.search(r'id="reactor-time">(.*?)</table>', run, re.S)
    assert time_section
    assert ONE_FORMAT.search(time_section.group(1))
    assert " UTC (" not in time_section.group(1)  # no zone after the admin's own times
