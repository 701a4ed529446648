"""The overview page: runs that ended by status (the chart), throughput, failure rate, runs in
flight, stuck runs, runs needing attention, waiting interrupts and the outbox."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_reactor.models import Dispatch, Execution, Interrupt
from django_reactor.states import ExecutionStatus
from django_reactor.store import overview as store_overview
from tests.admin.reactors import Booking, Refund
from tests.shapes import keep_shape

pytestmark = pytest.mark.django_db(transaction=True)

OVERVIEW = reverse("admin:django_reactor_execution_overview")


def page(client: Client, url: str = OVERVIEW) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


def run_row(status: str, *, ago: dt.timedelta | None = None, took: float = 0.2, **fields: Any):
    """A run as the engine stores it, ended ``ago`` (None: not ended) after ``took`` seconds."""
    keep_shape(Booking.definition)
    now = timezone.now()
    if ago is not None:
        fields.setdefault("finished_at", now - ago)
        fields.setdefault("started_at", now - ago - dt.timedelta(seconds=took))
    return Execution.objects.create(
        reactor=Booking.definition.name,
        definition_hash=Booking.definition.definition_hash,
        status=status,
        inputs={"guest": "ann"},
        **fields,
    )


def figure(html: str, name: str) -> str:
    match = re.search(rf'data-figure="{name}">([^<]*)<', html)
    assert match, name
    return match.group(1).strip()


def bars(html: str) -> dict[str, dict[str, int]]:
    """The chart's bars by label: ``{status: count}``."""
    found: dict[str, dict[str, int]] = {}
    for label, body in re.findall(
        r'<g class="reactor-chart-bar" data-label="([^"]*)"[^>]*>(.*?)</g>', html, re.S
    ):
        counts = re.findall(r'data-status="([a-z_]+)" data-count="(\d+)"', body)
        found[label] = {status: int(count) for status, count in counts}
    return found


def test_the_chart_counts_the_runs_that_ended_by_status_and_window(
    client_operator: Client,
) -> None:
    for minutes in (1, 2, 3):
        run_row(ExecutionStatus.COMPLETED, ago=dt.timedelta(minutes=minutes))
    run_row(ExecutionStatus.FAILED, ago=dt.timedelta(minutes=2))
    run_row(ExecutionStatus.NEEDS_ATTENTION, ago=dt.timedelta(minutes=30))
    run_row(ExecutionStatus.CANCELLED, ago=dt.timedelta(hours=5))  # the day, not the hour
    run_row(ExecutionStatus.COMPLETED, ago=dt.timedelta(days=3))  # neither
    run_row(ExecutionStatus.RUNNING)  # not ended

    html = page(client_operator)

    hour = bars(html)
    assert len(hour) == 12  # one bar per 5 minutes
    totals: dict[str, int] = {}
    for counts in hour.values():
        for status, count in counts.items():
            totals[status] = totals.get(status, 0) + count
    assert totals == {"completed": 3, "failed": 1, "needs_attention": 1}
    assert figure(html, "ended-hour") == "5"
    assert figure(html, "ended-day") == "6"
    # Failed or needing attention, of the runs that ended.
    assert figure(html, "failure-rate-hour") == "40.0 %"
    assert figure(html, "failure-rate-day") == "33.3 %"
    assert figure(html, "throughput-hour") == "0.083"  # 5 runs in 60 minutes
    assert 'data-status="cancelled"' not in html

    day = bars(page(client_operator, f"{OVERVIEW}?window=day"))
    assert len(day) == 24  # one bar per hour
    assert sum(sum(c.values()) for c in day.values()) == 6
    assert any(c.get("cancelled") == 1 for c in day.values())
    # An unknown window is the hour's.
    assert len(bars(page(client_operator, f"{OVERVIEW}?window=year"))) == 12


def test_a_window_busier_than_the_cap_is_counted_back_from_now_and_says_so(
    client_operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_overview, "ENDED_CAP", 3)
    for minutes in (1, 2, 3, 4, 40, 50):
        run_row(ExecutionStatus.COMPLETED, ago=dt.timedelta(minutes=minutes))

    html = page(client_operator)

    assert figure(html, "ended-hour") == "more than 3"
    assert 'id="reactor-chart-capped"' in html
    assert "More than 3 runs ended in this window" in html
    assert 'data-uncounted="true"' in html  # the bars before the cut are hatched


def test_runs_in_flight_are_counted_by_status_with_links(client_operator: Client) -> None:
    for status in ("pending", "pending", "running", "paused", "suspended", "rolling_back"):
        run_row(status)

    html = page(client_operator)

    flight = dict(re.findall(r'<tr data-status="([a-z_]+)">.*?reactor-figure">([^<]*)<', html))
    assert flight == {
        "pending": "2",
        "running": "1",
        "paused": "1",
        "suspended": "1",
        "rolling_back": "1",
    }
    assert f"{reverse('admin:django_reactor_execution_changelist')}?status__exact=pending" in html


def test_counts_stop_at_their_cap(client_operator: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_overview, "COUNT_CAP", 2)
    for _ in range(3):
        run_row(ExecutionStatus.PENDING)
    html = page(client_operator)
    flight = dict(re.findall(r'<tr data-status="([a-z_]+)">.*?reactor-figure">([^<]*)<', html))
    assert flight["pending"] == "more than 2"


def test_stuck_runs_lease_expired_and_longer_than_usual(client_operator: Client) -> None:
    now = timezone.now()
    expired = run_row(
        ExecutionStatus.RUNNING,
        current_step="charge",
        lease_owner="worker-7@host:4242",
        lease_expires_at=now - dt.timedelta(minutes=3),
        started_at=now - dt.timedelta(minutes=4),
        recovery_attempts=2,
    )
    for _ in range(5):  # Booking usually takes 2 s
        run_row(ExecutionStatus.COMPLETED, ago=dt.timedelta(minutes=10), took=2.0)
    slow = run_row(
        ExecutionStatus.RUNNING,
        current_step="confirm",
        lease_owner="worker-8@host:1",
        lease_expires_at=now + dt.timedelta(seconds=30),
        started_at=now - dt.timedelta(minutes=5),
    )
    in_time = run_row(
        ExecutionStatus.RUNNING,
        lease_owner="worker-9@host:1",
        lease_expires_at=now + dt.timedelta(seconds=30),
        started_at=now - dt.timedelta(seconds=1),
    )

    html = page(client_operator)

    expired_table = html.split('id="reactor-expired"')[1].split("</table>")[0]
    assert str(expired.pk)[:8] in expired_table
    assert "worker-7@host:4242" in expired_table
    assert re.search(r"3 min \d\d s ago", expired_table)
    assert figure(html, "expired") == "1"
    slow_table = html.split('id="reactor-slow"')[1].split("</table>")[0]
    assert str(slow.pk)[:8] in slow_table
    assert re.search(r"5 min \d\d s", slow_table)  # running for
    assert "2.0 s" in slow_table  # usually
    assert str(expired.pk)[:8] not in slow_table
    assert str(in_time.pk)[:8] not in html


def test_attention_interrupts_and_the_outbox(client_operator: Client) -> None:
    attention = run_row(
        ExecutionStatus.NEEDS_ATTENTION,
        current_step="reserve",
        failure={
            "kind": "rollback",
            "message": "could not undo reserve: the refund service is down",
        },
    )
    paused = Refund.run({"order": "A-7"})
    Interrupt.objects.filter(execution_id=paused.execution_id).update(
        created_at=timezone.now() - dt.timedelta(hours=2, minutes=5)
    )
    queued = run_row(ExecutionStatus.PENDING)
    now = timezone.now()
    Dispatch.objects.create(execution=queued, reason=Dispatch.Reason.START)
    Dispatch.objects.create(
        execution=queued, reason=Dispatch.Reason.RETRY, not_before=now + dt.timedelta(minutes=5)
    )
    Dispatch.objects.create(execution=queued, reason=Dispatch.Reason.WAKE, sent_at=now)

    html = page(client_operator)

    section = html.split('id="reactor-attention"')[1].split("</div>")[0]
    assert str(attention.pk)[:8] in section
    assert "the refund service is down" in section
    waiting = html.split('id="reactor-waiting"')[1].split("</div>")[0]
    assert str(paused.execution_id)[:8] in waiting
    assert "refund-A-7" in waiting
    assert "2 h 05 min" in waiting
    assert figure(html, "outbox") == "2"
    assert figure(html, "outbox-due") == "1"
    assert figure(html, "outbox-scheduled") == "1"
    outbox = html.split('id="reactor-outbox"')[1].split("</div>")[0]
    assert "Start in the background" in outbox
    assert "Retry after backoff" in outbox
    assert "Wake-up time reached" not in outbox  # sent


def test_the_page_reads_itself_again_and_costs_a_fixed_number_of_queries(
    client_operator: Client,
) -> None:
    page(client_operator)  # warm caches (sessions, content types)
    with CaptureQueriesContext(connection) as few:
        html = page(client_operator)
    assert 'id="reactor-refresh" class="reactor-muted" data-seconds="5"' in html
    for minutes in range(20):
        run_row(ExecutionStatus.COMPLETED, ago=dt.timedelta(minutes=minutes))
        run_row(ExecutionStatus.NEEDS_ATTENTION)
        run_row(ExecutionStatus.PENDING)
    with CaptureQueriesContext(connection) as many:
        page(client_operator)
    assert len(many.captured_queries) == len(few.captured_queries)


def test_viewers_may_open_it_other_staff_may_not(client_viewer: Client, db: None) -> None:
    assert client_viewer.get(OVERVIEW).status_code == 200
    staff = User.objects.create_user("staff", "s@example.com", "pw", is_staff=True)
    other = Client()
    other.force_login(staff)
    assert other.get(OVERVIEW).status_code == 403


def test_the_app_index_and_the_list_link_to_the_console(client_operator: Client) -> None:
    index = page(client_operator, reverse("admin:app_list", args=["django_reactor"]))
    listing = page(client_operator, reverse("admin:django_reactor_execution_changelist"))
    for html in (index, listing):
        assert f'href="{OVERVIEW}"' in html
        assert f'href="{reverse("admin:django_reactor_execution_coordination")}"' in html
