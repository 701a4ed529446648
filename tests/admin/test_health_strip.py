"""The overview's health strip (workers alive, the sweeper's last heartbeat, overdue wake-ups,
dispatches not taken) and its per-reactor table and processes."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_reactor import Reactor, services, step
from django_reactor.conf import reactor_settings
from django_reactor.models import Execution, ProcessHeartbeat
from django_reactor.services.health import beat_worker
from django_reactor.states import ExecutionStatus
from tests.admin.reactors import Booking
from tests.shapes import keep_shape

pytestmark = pytest.mark.django_db(transaction=True)

OVERVIEW = reverse("admin:django_reactor_execution_overview")


def page(client: Client) -> str:
    response = client.get(OVERVIEW)
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


def strip_item(html: str, name: str) -> tuple[str, str]:
    """The item's class and its figure."""
    match = re.search(
        rf'<li class="([^"]*)" data-health="{name}"[^>]*>.*?'
        r'<span class="reactor-figure">([^<]*)</span>',
        html,
        re.S,
    )
    assert match, name
    return match.group(1), match.group(2).strip()


def healthy_fleet() -> None:
    beat_worker(
        name="w1@box", queues=["reactor"], concurrency=2, tasks_done=5, started_at=timezone.now()
    )
    services.sweep()


def test_the_strip_is_green_for_a_healthy_fleet(client_viewer: Client) -> None:
    healthy_fleet()
    html = page(client_viewer)
    assert 'id="reactor-health" data-healthy="yes"' in html
    assert strip_item(html, "workers") == ("reactor-health-ok", "1")
    kind, seen = strip_item(html, "sweeper")
    assert kind == "reactor-health-ok"
    assert seen.endswith(" ago")
    assert strip_item(html, "overdue") == ("reactor-health-ok", "0")
    assert strip_item(html, "not-taken") == ("reactor-health-ok", "0")
    assert 'id="reactor-health-problems"' not in html
    assert '<tr data-role="worker" data-alive="yes">' in html
    assert '<tr data-role="sweeper" data-alive="yes">' in html


def test_the_strip_turns_red_when_the_sweeper_stopped(client_viewer: Client) -> None:
    healthy_fleet()
    late = timezone.now() - dt.timedelta(seconds=3 * reactor_settings.SWEEP_INTERVAL + 5)
    ProcessHeartbeat.objects.filter(role="sweeper").update(last_seen_at=late)
    html = page(client_viewer)
    assert 'data-healthy="no"' in html
    assert strip_item(html, "sweeper")[0] == "reactor-health-bad"
    assert strip_item(html, "workers")[0] == "reactor-health-ok"
    problems = re.search(r'id="reactor-health-problems">(.*?)</ul>', html, re.S)
    assert problems
    assert "no sweeper has run for " in problems.group(1)
    assert "reactor_sweep --loop" in problems.group(1)
    assert '<tr data-role="sweeper" data-alive="no">' in html


def test_no_worker_and_late_work_are_red(client_viewer: Client) -> None:
    services.sweep()
    keep_shape(Booking.definition)
    Execution.objects.create(
        reactor=Booking.definition.name,
        definition_hash=Booking.definition.definition_hash,
        status=ExecutionStatus.PENDING,
        inputs={"guest": "ann"},
        wake_at=timezone.now() - dt.timedelta(minutes=10),
    )
    html = page(client_viewer)
    assert strip_item(html, "workers") == ("reactor-health-bad", "0")
    assert strip_item(html, "overdue") == ("reactor-health-bad", "1")
    assert "no worker has reported in the last day" in html


def test_the_per_reactor_table_shows_the_last_hour(client_viewer: Client) -> None:
    healthy_fleet()
    keep_shape(Booking.definition)
    now = timezone.now()
    for status, took in ((ExecutionStatus.COMPLETED, 2.0), (ExecutionStatus.FAILED, 1.0)):
        Execution.objects.create(
            reactor=Booking.definition.name,
            definition_hash=Booking.definition.definition_hash,
            status=status,
            inputs={"guest": "ann"},
            started_at=now - dt.timedelta(seconds=60 + took),
            finished_at=now - dt.timedelta(seconds=60),
        )
    html = page(client_viewer)
    row = re.search(rf'<tr data-reactor="{re.escape(Booking.definition.name)}">(.*?)</tr>', html)
    assert row
    cells = dict(re.findall(r'data-figure="([a-z0-9-]+)">([^<]*)<', row.group(1)))
    assert cells == {
        "started": "2",
        "completed": "1",
        "failed": "1",
        "p50": "2.0 s",
        "p95": "2.0 s",
        "in-flight": "0",
    }


def test_the_overview_shows_depth_per_queue_and_flags_a_queue_nobody_consumes(
    client_viewer: Client,
) -> None:
    healthy_fleet()  # a live worker consuming "reactor"
    for _ in range(2):
        services.run_in_background(QueuedForHealth, {}, queue="payments")
    services.run_in_background(QueuedForHealth, {}, queue="reactor")
    Execution.objects.update(created_at=timezone.now() - dt.timedelta(minutes=1))
    html = page(client_viewer)
    rows = re.findall(
        r'<tr data-queue="([^"]+)"><td>[^<]*</td><td class="reactor-figure" '
        r'data-figure="waiting">(\d+)</td><td( class="reactor-error")?>([^<]*)</td>',
        html,
    )
    assert rows == [
        ("payments", "2", ' class="reactor-error"', "no live worker"),
        ("reactor", "1", "", "w1@box"),
    ]
    problems = re.search(r'id="reactor-health-problems">(.*?)</ul>', html, re.S)
    assert problems
    assert (
        "2 runs have waited more than 2.0 s in the queue &#x27;payments&#x27; and no live "
        "worker consumes it"
    ) in problems.group(1)


class QueuedForHealth(Reactor):
    @step()
    def only() -> str:
        return "done"

    class Meta:
        background = "all"
