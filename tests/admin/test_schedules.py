"""The schedule admin: the list, the form's field errors, the actions (pause, resume, run
now) and a schedule's latest fires with links to their runs; every change through
``services.schedules``."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_reactor import services
from django_reactor.models import Execution, Schedule, ScheduleFire
from django_reactor.testing import make_schedules_due
from tests.schedules.reactors import NightlyReport

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_reactor_schedule_changelist")
ADD = reverse("admin:django_reactor_schedule_add")
FIRES = reverse("admin:django_reactor_schedulefire_changelist")
REACTOR = NightlyReport.definition.name
T = dt.datetime(2030, 1, 7, 9, 0, tzinfo=dt.UTC)


def change_url(schedule: Any) -> str:
    return reverse("admin:django_reactor_schedule_change", args=[schedule.id])


def run_url(execution_id: Any) -> str:
    return reverse("admin:django_reactor_execution_change", args=[str(execution_id)])


def form_data(**changes: Any) -> dict[str, Any]:
    data = {
        "name": "nightly",
        "reactor": REACTOR,
        "inputs": '{"region": "eu"}',
        "cron": "30 2 * * *",
        "every": "",
        "timezone": "Europe/Berlin",
        "catch_up": "once",
        "overlap": "skip",
        "enabled": "on",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def nightly(**options: Any) -> Any:
    options.setdefault("inputs", {"region": "eu"})
    return services.schedules.create(NightlyReport, every="1h", name="hourly", **options)


def test_the_list_shows_each_schedule_with_its_fires_and_policies(
    client_operator: Client,
) -> None:
    schedule = services.schedules.create(
        NightlyReport,
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        inputs={"region": "eu"},
        name="nightly",
        overlap="queue",
    )
    services.schedules.run_now(schedule)
    html = client_operator.get(CHANGELIST).content.decode()
    assert "nightly" in html
    assert "30 2 * * * (Europe/Berlin)" in html
    next_fire = schedule.next_fire_at.astimezone(dt.UTC)
    assert str(next_fire.year) in html
    assert "CET" in html or "CEST" in html
    last = Execution.objects.get()
    assert run_url(last.id) in html  # the last run, linked
    assert "queue" in html


def test_adding_a_schedule_goes_through_the_services(client_operator: Client) -> None:
    response = client_operator.post(ADD, form_data())
    assert response.status_code == 302, response.content.decode()[:3000]
    schedule = Schedule.objects.get()
    assert (schedule.name, schedule.reactor, schedule.cron, schedule.timezone) == (
        "nightly",
        REACTOR,
        "30 2 * * *",
        "Europe/Berlin",
    )
    assert schedule.next_fire_at is not None  # computed by services.schedules.create
    assert schedule.inputs == {"region": "eu"}
    assert LogEntry.objects.get().object_repr == "nightly"


def test_an_interval_schedule_is_added_from_text(client_operator: Client) -> None:
    response = client_operator.post(ADD, form_data(cron="", every="1h30m"))
    assert response.status_code == 302
    assert Schedule.objects.get().every == dt.timedelta(hours=1, minutes=30)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"cron": "0 25 * * *"}, "cron", "is not a cron expression croniter can read"),
        ({"cron": "every night"}, "cron", "has 2 fields"),
        ({"timezone": "Europe/Atlantis"}, "timezone", "is not a time zone this system knows"),
        ({"cron": ""}, "cron", "give a cron expression"),
        ({"every": "1h"}, "every", "not both"),
        ({"cron": "", "every": "soon"}, "every", "is not an interval"),
        (
            {"cron": "", "every": "3000000d"},
            "every",
            "an interval is 2.592e+11 s (about 8,214 years), longer than a date can hold: the "
            "latest time django_reactor accepts, 9999-01-01 (UTC), is ",
        ),
        ({"cron": "", "every": "99999999999999999999"}, "every", "longer than a date can hold"),
        ({"inputs": '{"region": "mars"}'}, "inputs", "region: "),
        ({"inputs": "{}"}, "inputs", "region: This field is required."),
        ({"inputs": "{nope"}, "inputs", "Enter a valid JSON."),
        ({"reactor": "tests.nowhere.Gone"}, "reactor", "No reactor named tests.nowhere.Gone"),
        ({"name": "12"}, "name", "a name is not a number"),
    ],
)
def test_each_bad_value_is_a_field_error_and_nothing_is_written(
    client_operator: Client, changes: dict[str, Any], field: str, message: str
) -> None:
    response = client_operator.post(ADD, form_data(**changes))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    assert message in " ".join(errors[field]), errors
    assert message.replace("'", "&#x27;") in response.content.decode()
    assert Schedule.objects.count() == 0


def test_a_taken_name_is_a_field_error(client_operator: Client) -> None:
    nightly()
    response = client_operator.post(ADD, form_data(name="hourly"))
    assert "another schedule is named" in " ".join(
        response.context["adminform"].form.errors["name"]
    )


def test_changing_a_schedule_keeps_its_secret_inputs(client_operator: Client) -> None:
    schedule = services.schedules.create(
        "testproject.example.reactors.RenewDueSubscriptions",
        cron="@daily",
        inputs={"due_by": "2030-01-01", "card_token": "tok_live_1"},
        name="renew",
    )
    page = client_operator.get(change_url(schedule)).content.decode()
    assert "tok_live_1" not in page
    assert "[REDACTED]" in page
    response = client_operator.post(
        change_url(schedule),
        form_data(
            name="renew",
            reactor="testproject.example.reactors.RenewDueSubscriptions",
            cron="0 3 * * *",
            timezone="UTC",
            inputs='{"due_by": "2030-02-01", "card_token": "[REDACTED]"}',
        ),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    stored = Schedule.objects.get()
    assert stored.inputs == {"due_by": "2030-02-01", "card_token": "tok_live_1"}
    assert stored.cron == "0 3 * * *"
    assert stored.next_fire_at.astimezone(dt.UTC).hour == 3


def act(client: Client, action: str, *schedules: Any) -> Any:
    return client.post(
        CHANGELIST,
        {"action": action, "_selected_action": [s.id for s in schedules]},
        follow=True,
    )


def test_pause_and_resume_actions(client_operator: Client) -> None:
    schedule = nightly()
    response = act(client_operator, "pause_selected", schedule)
    assert "Paused 1 schedule." in response.content.decode()
    stored = Schedule.objects.get()
    assert (stored.enabled, stored.next_fire_at) == (False, None)
    response = act(client_operator, "resume_selected", schedule)
    assert "Resumed 1 schedule." in response.content.decode()
    stored.refresh_from_db()
    assert stored.enabled
    assert stored.next_fire_at is not None
    assert [e.change_message for e in LogEntry.objects.order_by("id")] == ["Paused.", "Resumed."]


def test_run_now_action_starts_a_run_and_links_it(client_operator: Client) -> None:
    schedule = nightly()
    response = act(client_operator, "run_now_selected", schedule)
    fire = ScheduleFire.objects.get()
    assert fire.manual
    assert run_url(fire.execution_id) in response.content.decode()
    assert "started run" in response.content.decode()


def test_run_now_of_refused_inputs_says_why(client_operator: Client) -> None:
    schedule = nightly()
    Schedule.objects.filter(pk=schedule.id).update(inputs={"region": "mars"})
    response = act(client_operator, "run_now_selected", schedule)
    assert "no run started" in response.content.decode()
    assert Execution.objects.count() == 0


def test_the_schedule_page_lists_its_latest_fires_with_links_to_their_runs(
    client_operator: Client,
) -> None:
    schedule = nightly(overlap="skip")
    make_schedules_due(schedule, now=T)
    services.schedules.fire_due(now=T + dt.timedelta(seconds=5))
    services.schedules.fire_due(now=T + dt.timedelta(hours=1, seconds=5))  # overlap: skipped
    started = ScheduleFire.objects.get(outcome="started")
    html = client_operator.get(change_url(schedule)).content.decode()
    assert run_url(started.execution_id) in html
    assert "Run started" in html
    assert "Skipped" in html
    assert "has not finished (overlap: skip)" in html
    assert f"{FIRES}?schedule__id__exact={schedule.id}" in html
    fires = client_operator.get(f"{FIRES}?schedule__id__exact={schedule.id}").content.decode()
    assert run_url(started.execution_id) in fires
    # Its tick, written as every time of the admin, in the schedule's zone.
    assert "<span>2030-01-07</span> <span>09:00:00 UTC</span>" in fires


def test_fires_are_read_only(client_operator: Client) -> None:
    schedule = nightly()
    services.schedules.run_now(schedule)
    fire = ScheduleFire.objects.get()
    url = reverse("admin:django_reactor_schedulefire_change", args=[fire.id])
    assert "Save" not in client_operator.get(url).content.decode()
    assert client_operator.get(reverse("admin:django_reactor_schedulefire_add")).status_code == 403


def test_deleting_a_schedule_keeps_its_runs(client_operator: Client) -> None:
    schedule = nightly()
    services.schedules.run_now(schedule)
    url = reverse("admin:django_reactor_schedule_delete", args=[schedule.id])
    response = client_operator.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert Schedule.objects.count() == ScheduleFire.objects.count() == 0
    assert Execution.objects.count() == 1


def test_a_viewer_cannot_run_the_actions(client_viewer: Client, viewer: Any) -> None:
    from django.contrib.auth.models import Permission

    viewer.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_reactor", codename="view_schedule")
    )
    schedule = nightly()
    html = client_viewer.get(CHANGELIST).content.decode()
    assert "hourly" in html
    assert "run_now_selected" not in html
    act(client_viewer, "run_now_selected", schedule)
    assert ScheduleFire.objects.count() == 0


def test_the_delete_action_counts_the_fires_and_goes_through_the_services(
    client_operator: Client,
) -> None:
    schedule = nightly()
    services.schedules.run_now(schedule)
    services.schedules.run_now(schedule)
    confirm = act(client_operator, "delete_selected", schedule).content.decode()
    assert "2 fires of theirs" in confirm
    response = client_operator.post(
        CHANGELIST,
        {"action": "delete_selected", "_selected_action": [schedule.id], "post": "yes"},
    )
    assert response.status_code == 302
    assert Schedule.objects.count() == ScheduleFire.objects.count() == 0
    assert Execution.objects.count() == 2


def test_the_schedule_page_lists_its_next_fires(client_operator: Client) -> None:
    schedule = services.schedules.create(
        NightlyReport, cron="30 2 * * *", timezone="Europe/Berlin", inputs={"region": "eu"}
    )
    html = client_operator.get(change_url(schedule)).content.decode()
    upcoming = re.search(r'<ol class="reactor-upcoming" id="reactor-upcoming">(.*?)</ol>', html)
    assert upcoming, html
    shown = re.findall(r"<span>(\d{4}-\d\d-\d\d)</span> <span>([^<]*)</span>", upcoming.group(1))
    expected = services.schedules.upcoming(schedule, 10)
    assert len(shown) == len(expected) == 10
    for (day, clock), moment in zip(shown, expected, strict=True):
        local = moment.astimezone(ZoneInfo("Europe/Berlin"))
        assert (day, clock) == (local.strftime("%Y-%m-%d"), local.strftime("%H:%M:%S %Z"))
        assert clock.startswith("02:30:00") or clock.startswith("03:00:00")

    services.schedules.pause(schedule)
    paused = client_operator.get(change_url(schedule)).content.decode()
    assert 'id="reactor-upcoming"' not in paused
    assert "None while it is paused" in paused


def test_run_now_on_the_schedule_page_asks_first_then_starts_a_run(
    client_operator: Client,
) -> None:
    schedule = nightly()
    page = client_operator.get(change_url(schedule)).content.decode()
    run_now = reverse("admin:django_reactor_schedule_run_now", args=[schedule.id])
    assert f'href="{run_now}"' in page

    asked = client_operator.get(run_now)
    assert asked.status_code == 200
    question = asked.content.decode()
    assert "This starts a run of" in question
    assert "&quot;region&quot;: &quot;eu&quot;" in question
    assert Execution.objects.count() == 0  # asking runs nothing
    assert client_operator.post(run_now, {}).status_code == 200  # nor does a POST without yes
    assert Execution.objects.count() == 0

    done = client_operator.post(run_now, {"post": "yes"})

    assert done.status_code == 302
    assert done.url == change_url(schedule)
    run = Execution.objects.get()
    assert ScheduleFire.objects.get(schedule_id=schedule.id).manual
    followed = client_operator.get(done.url).content.decode()
    assert run_url(run.id) in followed  # in the message, and among the latest fires
    assert "started run" in followed


def test_a_viewer_has_no_run_now_button(client_viewer: Client, viewer: Any) -> None:
    viewer.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_reactor", codename="view_schedule")
    )
    schedule = nightly()
    run_now = reverse("admin:django_reactor_schedule_run_now", args=[schedule.id])
    assert run_now not in client_viewer.get(change_url(schedule)).content.decode()
    assert client_viewer.get(run_now).status_code == 403
    assert client_viewer.post(run_now, {"post": "yes"}).status_code == 403
    assert Execution.objects.count() == 0
