"""reactor_list: listing stored runs."""

from __future__ import annotations

import datetime as dt
import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_reactor import Paused, Reactor, interrupt, step
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.commands.tables import read_table
from tests.integration.reactors import FAIL_AT, Tracked

pytestmark = pytest.mark.django_db(transaction=True)

TRANSFER = "tests.integration.reactors.Transfer"


class CommandListWait(Reactor):
    first = step(Tracked)
    approval = interrupt(after="first", correlation_id=lambda run: "list-corr-1")


def listing(*args: Any, **options: Any) -> str:
    out = StringIO()
    call_command("reactor_list", *args, stdout=out, no_color=True, **options)
    return out.getvalue()


def rows(count: int, **fields: Any) -> list[Execution]:
    now = timezone.now()
    made = Execution.objects.bulk_create(
        Execution(
            reactor=fields.get("reactor", TRANSFER),
            status=fields.get("status", ExecutionStatus.COMPLETED),
            definition_hash="x",
            current_step=fields.get("current_step", "credit"),
            started_at=now - dt.timedelta(seconds=3),
            finished_at=now if fields.get("finished", True) else None,
        )
        for _ in range(count)
    )
    if "created_at" in fields:
        Execution.objects.filter(pk__in=[r.pk for r in made]).update(
            created_at=fields["created_at"]
        )
    return made


def test_table_of_runs_newest_first() -> None:
    from tests.integration.reactors import Transfer

    first = Transfer.run({"account": "a", "amount": 1, "pin": "1"})
    FAIL_AT.add("credit")
    second = Transfer.run({"account": "a", "amount": 2, "pin": "1"})
    text = listing()
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "REACTOR", "STATUS", "STEP", "CREATED", "DURATION"]
    listed = read_table(lines)
    assert [(row["ID"], row["REACTOR"], row["STATUS"]) for row in listed] == [
        (str(second.execution_id), "Transfer", "failed"),
        (str(first.execution_id), "Transfer", "completed"),
    ]
    assert all(row["DURATION"].endswith(" ms") for row in listed)


def test_json_output_and_filters() -> None:
    rows(2, status=ExecutionStatus.FAILED)
    rows(3, status=ExecutionStatus.COMPLETED)
    rows(1, status=ExecutionStatus.RUNNING, finished=False)
    data = json.loads(listing(json=True))
    assert len(data) == 6
    assert {"id", "reactor", "status", "current_step", "created_at", "duration_seconds"} <= set(
        data[0]
    )
    failed = json.loads(listing(status="failed", json=True))
    assert [d["status"] for d in failed] == ["failed", "failed"]
    several = json.loads(listing(status="failed,running", json=True))
    assert sorted(d["status"] for d in several) == ["failed", "failed", "running"]
    running = next(d for d in several if d["status"] == "running")
    assert running["duration_seconds"] is None
    assert len(json.loads(listing(limit=4, json=True))) == 4
    assert "pass --limit to see more" in listing(limit=2)


def test_reactor_filter_by_class_name_and_by_unknown_stored_name() -> None:
    rows(2)
    rows(1, reactor="gone.app.OldReactor")
    assert len(json.loads(listing(reactor="Transfer", json=True))) == 2
    assert len(json.loads(listing(reactor="gone.app.OldReactor", json=True))) == 1


def test_since_and_days() -> None:
    rows(2, created_at=timezone.now() - dt.timedelta(days=10))
    rows(1)
    assert len(json.loads(listing(days=5, json=True))) == 1
    assert len(json.loads(listing(days=11, json=True))) == 3
    since = (timezone.now() - dt.timedelta(days=3)).date().isoformat()
    assert len(json.loads(listing(since=since, json=True))) == 1
    assert len(json.loads(listing(since="2000-01-01T00:00:00+00:00", json=True))) == 3


def test_correlation_id_filter() -> None:
    outcome = CommandListWait.run({})
    assert isinstance(outcome, Paused)
    rows(2)
    data = json.loads(listing(correlation_id="list-corr-1", json=True))
    assert [d["id"] for d in data] == [str(outcome.execution_id)]
    assert listing(correlation_id="nothing-like-it") == "no runs match\n"


def test_query_count_does_not_grow_with_the_runs() -> None:
    rows(5)
    with CaptureQueriesContext(connection) as five:
        listing()
    rows(45)
    with CaptureQueriesContext(connection) as fifty:
        text = listing()
    assert len(text.splitlines()) == 51
    assert len(fifty) == len(five) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"status": "done"}, "'done' is not a status"),
        ({"status": ","}, "needs at least one status"),
        ({"since": "last tuesday"}, "is not an ISO 8601 date"),
        ({"reactor": "NoSuchReactor"}, "no reactor of that name"),
    ],
)
def test_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        listing(**options)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--days", "-1"], "0 or more"),
        (["--days", "x"], "not a whole number"),
        (["--limit", "0"], "1 or more"),
        (["--days", "1", "--since", "2024-01-01"], "not allowed with argument"),
    ],
)
def test_argument_errors(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        listing(*args)


def test_stuck_says_when_no_sweeper_or_worker_is_alive_to_move_runs() -> None:
    from django_reactor import services
    from django_reactor.services.health import beat_worker

    text = listing("--stuck")
    lines = text.splitlines()
    assert lines[0].startswith("warning: no sweeper has run in the last day: start ")
    assert lines[1].startswith("warning: no worker has reported in the last day: start ")
    assert lines[2] == (
        "no run holds an expired lease or a step past its timeout, but runs that wait for a "
        "worker or a wake-up do not move until the problems above are fixed"
    )
    assert "no stuck runs" not in text
    # Beside JSON, the warnings go to standard error.
    out, err = StringIO(), StringIO()
    call_command("reactor_list", "--stuck", "--json", stdout=out, stderr=err, no_color=True)
    assert json.loads(out.getvalue()) == []
    assert err.getvalue().count("warning: ") == 2

    beat_worker(name="w", queues=["q"], concurrency=1, tasks_done=0, started_at=timezone.now())
    services.sweep()
    assert listing("--stuck") == "no stuck runs\n"
