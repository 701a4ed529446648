"""reactor_schedule: list, add, pause, resume, run-now, show and remove schedules; bad input
is refused with exit status 2 and writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_reactor import services
from django_reactor.models import Execution, Schedule, ScheduleFire
from tests.schedules import reactors  # noqa: F401  (registers NightlyReport)
from tests.workers.harness import ROOT

pytestmark = pytest.mark.django_db

REACTOR = "tests.schedules.reactors.NightlyReport"


def schedule(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("reactor_schedule", *args, stdout=out, no_color=True, **options)
    return out.getvalue()


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as error:
        schedule(*args)
    assert error.value.returncode == 2, error.value
    return str(error.value)


def test_add_then_list_show_pause_resume_run_now_and_remove() -> None:
    out = schedule(
        "add", "NightlyReport", "--cron", "30 2 * * *", "--tz", "Europe/Berlin",
        "--inputs", '{"region": "eu"}', "--name", "nightly", "--overlap", "allow",
    )  # fmt: skip
    row = Schedule.objects.get()
    assert out.startswith(f"schedule {row.id} nightly added: cron 30 2 * * * (Europe/Berlin);")
    assert "next fire 20" in out
    assert (row.reactor, row.timezone, row.inputs, row.catch_up, row.overlap) == (
        REACTOR,
        "Europe/Berlin",
        {"region": "eu"},
        "once",
        "allow",
    )

    listed = schedule("list").splitlines()
    assert listed[0].split() == [
        "ID", "NAME", "REACTOR", "WHEN", "TZ", "STATE", "NEXT", "FIRE", "LAST", "FIRE",
        "CATCH-UP", "OVERLAP",
    ]  # fmt: skip
    assert listed[1].split()[:8] == [
        str(row.id), "nightly", "NightlyReport", "cron", "30", "2", "*", "*",
    ]  # fmt: skip
    assert "enabled" in listed[1]
    assert "\x1b[" not in "".join(listed)  # plain text when not a terminal

    assert schedule("pause", "nightly") == f"schedule {row.id} nightly paused\n"
    assert "paused" in schedule("list").splitlines()[1]
    assert schedule("resume", str(row.id)).startswith(f"schedule {row.id} nightly resumed: next")

    ran = schedule("run-now", "nightly")
    fire = ScheduleFire.objects.get()
    assert ran == f"schedule {row.id} nightly: run {fire.execution_id} started\n"
    assert Execution.objects.filter(pk=fire.execution_id).exists()

    shown = schedule("show", "nightly")
    assert f"schedule {row.id} nightly: {REACTOR}, cron 30 2 * * * (Europe/Berlin)" in shown
    assert "started (run now)" in shown
    assert str(fire.execution_id) in shown

    assert schedule("remove", "nightly") == f"schedule {row.id} nightly removed\n"
    assert Schedule.objects.count() == 0
    assert schedule("list") == "no schedules\n"


def test_add_an_interval_schedule_as_json_and_list_as_json() -> None:
    data = json.loads(
        schedule("add", REACTOR, "--every", "15m", "--inputs", '{"region": "us"}', "--json")
    )
    assert data["every_seconds"] == 900.0
    assert data["cron"] is None
    assert data["name"].startswith("NightlyReport-")
    [listed] = json.loads(schedule("list", "--json"))
    assert listed["id"] == data["id"]
    assert listed["inputs"] == {"region": "us"}
    assert json.loads(schedule("list", "--reactor", "NightlyReport", "--json")) == [listed]
    assert schedule("add", REACTOR, "--every", "1h", "--paused", "--inputs", '{"region": "eu"}')
    assert Schedule.objects.filter(enabled=False).count() == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "NoSuchReactor", "--cron", "0 2 * * *"], "no reactor of that name is known"),
        (["add", REACTOR, "--cron", "0 25 * * *"], "--cron: '0 25 * * *' is not a cron"),
        (["add", REACTOR, "--cron", "every day"], "--cron: 'every day' has 2 fields"),
        (["add", REACTOR, "--cron", "0 2 * * *", "--tz", "Mars/Base"], "--tz: 'Mars/Base' is not"),
        (["add", REACTOR, "--every", "soon"], "--every: 'soon' is not an interval"),
        (
            ["add", REACTOR, "--every", "3000000d", "--inputs", '{"region": "eu"}'],
            "--every: an interval is 2.592e+11 s (about 8,214 years), longer than a date can hold",
        ),
        (["add", REACTOR, "--every", "1h", "--inputs", "{oops"], "--inputs is not valid JSON"),
        (["add", REACTOR, "--every", "1h", "--inputs", "[1]"], "--inputs must be a JSON object"),
        (["add", REACTOR, "--every", "1h", "--inputs", '{"region": "mars"}'], "--inputs: region:"),
        (["add", REACTOR, "--every", "1h"], "--inputs: region: This field is required."),
        (["add", REACTOR, "--every", "1h", "--name", "7"], "--name: a name is not a number"),
        (["pause", "nope"], "no schedule has the id or name 'nope'"),
        (["run-now", "404"], "no schedule has the id or name 404"),
    ],
)
def test_bad_input_is_refused_with_status_2_and_nothing_written(
    args: list[str], message: str
) -> None:
    assert message in refused(*args)
    assert Schedule.objects.count() == 0
    assert Execution.objects.count() == 0


def test_all_the_problems_of_an_add_are_reported_at_once() -> None:
    text = refused(
        "add", REACTOR, "--cron", "nope", "--tz", "Nowhere/Town", "--inputs", '{"region": "x"}'
    )
    assert text.splitlines()[0] == "the schedule was not added:"
    assert [line.split(":")[0].strip() for line in text.splitlines()[1:]] == [
        "--cron",
        "--tz",
        "--inputs",
    ]


def test_a_taken_name_is_refused() -> None:
    schedule("add", REACTOR, "--every", "1h", "--inputs", '{"region": "eu"}', "--name", "n")
    assert "--name: another schedule is named 'n'" in refused(
        "add", REACTOR, "--every", "2h", "--inputs", '{"region": "eu"}', "--name", "n"
    )
    assert Schedule.objects.count() == 1


def test_run_now_of_inputs_the_reactor_refuses_now_exits_1() -> None:
    row = services.schedules.create(REACTOR, every="1h", inputs={"region": "eu"}, name="n")
    Schedule.objects.filter(pk=row.id).update(inputs={"region": "mars"})
    with pytest.raises(CommandError) as error:
        schedule("run-now", "n")
    assert error.value.returncode == 1
    assert "started no run" in str(error.value)
    assert ScheduleFire.objects.get().outcome == "refused"


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py reactor_schedule ...`` in a process of its own, on the test database."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "manage.py", "reactor_schedule", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "TransferFunds", "--cron", "0 2 * * * *"], "--cron: '0 2 * * * *' has 6 fields"),
        (["add", "TransferFunds", "--cron", "@daily", "--catch-up", "2"], "invalid choice: '2'"),
        (["add", "TransferFunds"], "one of the arguments --cron --every is required"),
        (["add", "Refund", "--every", "1h"], "REACTOR 'Refund': no reactor of that name"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_on_the_command_line_bad_input_exits_2_without_a_traceback(
    args: list[str], message: str
) -> None:
    result = manage(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert message in result.stderr


def test_secret_inputs_are_masked_in_the_output() -> None:
    schedule(
        "add", "RenewDueSubscriptions", "--cron", "@daily", "--name", "renew",
        "--inputs", '{"due_by": "2030-01-01", "card_token": "tok_live_1"}',
    )  # fmt: skip
    assert Schedule.objects.get().inputs["card_token"] == "tok_live_1"  # stored as given
    shown = schedule("show", "renew") + schedule("list", "--json")
    assert "tok_live_1" not in shown
    assert '"card_token": "[REDACTED]"' in shown
