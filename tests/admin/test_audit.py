"""The admin's steering is recorded as the signed-in user's, with the reason typed on its pages;
the Steering history list and a run's own section."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_reactor import services
from django_reactor.models import AuditEntry, Execution
from django_reactor.states import ExecutionStatus
from tests.admin.reactors import TRIGGERS, Booking, Refund

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:django_reactor_execution_changelist")
HISTORY = reverse("admin:django_reactor_auditentry_changelist")


def url(name: str, *args: Any) -> str:
    return reverse(f"admin:django_reactor_execution_{name}", args=[str(a) for a in args])


def recorded() -> list[tuple[str, uuid.UUID | None, str, str, str]]:
    return [
        (e.action, e.execution_id, e.who, e.via, e.reason)
        for e in AuditEntry.objects.order_by("at", "id")
    ]


def failed_run() -> Any:
    TRIGGERS.add("charge")
    outcome = Booking.run({"guest": "ann", "card": "4111"})
    TRIGGERS.discard("charge")
    return outcome.execution_id


def test_each_operation_of_a_run_page_is_the_users_with_its_reason(
    client_operator: Client, operator: User
) -> None:
    me = f"operator (user {operator.pk})"
    paused = Refund.run({"order": "A1"}).execution_id
    client_operator.post(url("cancel", paused), {"post": "yes", "reason": "customer called"})
    completed = Booking.run({"guest": "bo", "card": "4111"}).execution_id
    client_operator.post(url("undo", completed), {"post": "yes", "reason": "refund"})
    failed = failed_run()
    client_operator.post(url("retry", failed), {"reason": "card fixed"})
    waiting = Refund.run({"order": "A2"}).execution_id
    client_operator.post(
        url("resume", waiting, "approval"), {"payload": '{"approved": true}', "reason": "ok'd"}
    )
    assert recorded() == [
        ("cancel", paused, me, "admin", "customer called"),
        ("undo", completed, me, "admin", "refund"),
        ("retry", failed, me, "admin", "card fixed"),
        ("resume", waiting, me, "admin", "ok'd"),
    ]
    cancel = services.find(paused).trace[-1]
    assert (cancel.data["by"], cancel.data["via"]) == (me, "admin")
    # The resumed run's page: its steer entry in the trace and on the timeline.
    page = client_operator.get(url("change", waiting)).content.decode()
    assert f"by {me} via admin" in page  # the timeline's mark
    trace = page[page.index('id="reactor-trace"') : page.index('id="reactor-steering"')]
    assert "Steered" in trace


def test_a_bulk_action_records_each_run_with_the_reason_of_its_confirmation(
    client_operator: Client, operator: User
) -> None:
    paused = [Refund.run({"order": f"B{i}"}).execution_id for i in range(2)]
    completed = Booking.run({"guest": "ann", "card": "4111"}).execution_id
    client_operator.post(
        CHANGELIST,
        {
            "action": "undo_selected",
            "_selected_action": [str(i) for i in [*paused, completed]],
            "post": "yes",
            "reason": "batch refund",
        },
    )
    assert {(e[1], e[4]) for e in recorded()} == {
        (paused[0], "batch refund"),
        (paused[1], "batch refund"),
        (completed, "batch refund"),
    }
    assert {e[2] for e in recorded()} == {f"operator (user {operator.pk})"}


def test_a_refused_operation_records_nothing(client_operator: Client) -> None:
    completed = Booking.run({"guest": "cy", "card": "4111"}).execution_id
    client_operator.post(url("cancel", completed), {"post": "yes", "reason": "too late"})
    client_operator.post(url("wake", completed))
    assert Execution.objects.get(pk=completed).status == ExecutionStatus.COMPLETED
    assert recorded() == []


def test_a_runs_page_lists_its_steering_history(client_operator: Client) -> None:
    paused = Refund.run({"order": "C1"}).execution_id
    page = client_operator.get(url("change", paused)).content.decode()
    assert 'id="reactor-steering"' in page
    assert "Nobody has steered this run." in page
    client_operator.post(url("cancel", paused), {"post": "yes", "reason": "wrong <b>order</b>"})
    page = client_operator.get(url("change", paused)).content.decode()
    section = page[page.index('id="reactor-steering"') : page.index('id="reactor-relations"')]
    assert "wrong &lt;b&gt;order&lt;/b&gt;" in section  # escaped
    assert "operator (user" in section
    assert f'href="{HISTORY}?q={paused}"' in section


def test_the_steering_history_lists_newest_first_filters_and_searches(
    client_operator: Client,
) -> None:
    first = AuditEntry.objects.create(
        action="cancel",
        execution_id=uuid.uuid4(),
        who="alice (user 1)",
        via="admin",
        reason="duplicate",
        at=timezone.now() - dt.timedelta(minutes=2),
    )
    second = AuditEntry.objects.create(
        action="schedule_pause",
        target="schedule nightly",
        who="reactor_schedule by deploy",
        via="command",
        at=timezone.now() - dt.timedelta(minutes=1),
    )
    page = client_operator.get(HISTORY).content.decode()
    assert page.index("reactor_schedule by deploy") < page.index("alice (user 1)")
    assert "Schedule paused" in page

    by_action = client_operator.get(f"{HISTORY}?action=cancel").content.decode()
    assert "alice (user 1)" in by_action
    assert "reactor_schedule by deploy" not in by_action
    by_via = client_operator.get(f"{HISTORY}?via__exact=command").content.decode()
    assert "reactor_schedule by deploy" in by_via
    assert "alice" not in by_via
    by_run = client_operator.get(f"{HISTORY}?q={first.execution_id}").content.decode()
    assert "alice (user 1)" in by_run
    assert "reactor_schedule by deploy" not in by_run
    by_who = client_operator.get(f"{HISTORY}?q=DEPLOY").content.decode()
    assert "deploy" in by_who
    assert "alice" not in by_who
    detail = client_operator.get(
        reverse("admin:django_reactor_auditentry_change", args=[second.pk])
    )
    assert detail.status_code == 200
    assert "schedule nightly" in detail.content.decode()


def test_the_steering_history_pages_by_keyset(
    client_operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_admin = admin.site._registry[AuditEntry]
    monkeypatch.setattr(model_admin, "list_per_page", 5)
    monkeypatch.setattr(model_admin, "count_limit", 10)
    base = timezone.now() - dt.timedelta(days=1)
    AuditEntry.objects.bulk_create(
        AuditEntry(action="wake", who=f"user-{n:02d}", via="api", at=base + dt.timedelta(minutes=n))
        for n in range(13)
    )
    html = client_operator.get(f"{HISTORY}?p=2").content.decode()
    assert "more than 10" in html
    older = re.search(r'<a class="reactor-next" href="([^"]*)"', html)
    assert older is not None
    assert "after=" in older.group(1)
    with CaptureQueriesContext(connection) as queries:
        last = client_operator.get(f"{HISTORY}{older.group(1).replace('&amp;', '&')}")
    assert last.status_code == 200
    assert not [q["sql"] for q in queries if "OFFSET" in q["sql"].upper()]
    assert re.findall(r"user-\d\d", last.content.decode()) == ["user-02", "user-01", "user-00"]


def test_the_history_is_read_only_and_needs_its_view_permission(
    client_viewer: Client, client: Client
) -> None:
    entry = AuditEntry.objects.create(action="undo", who="x", via="python", at=timezone.now())
    assert client_viewer.get(HISTORY).status_code == 403
    superuser = User.objects.create_superuser("boss", "boss@example.com", "pw")
    client.force_login(superuser)
    assert client.get(reverse("admin:django_reactor_auditentry_add")).status_code == 403
    delete = reverse("admin:django_reactor_auditentry_delete", args=[entry.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert AuditEntry.objects.filter(pk=entry.pk).exists()
