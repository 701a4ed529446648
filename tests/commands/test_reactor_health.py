"""reactor_health: the fleet's verdict (exit 0 healthy, 1 not), and reactor_show's warning on a
waiting run when no sweeper or no worker is alive."""

from __future__ import annotations

import datetime as dt
import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_reactor import Reactor, Rescheduled, services, sleep, step
from django_reactor.conf import reactor_settings
from django_reactor.models import ProcessHeartbeat
from django_reactor.services.health import beat_worker
from tests.commands.tables import read_table

pytestmark = pytest.mark.django_db(transaction=True)


class Doze(Reactor):
    """One step, then a long sleep."""

    @step()
    def first() -> str:
        return "done"

    doze = sleep(dt.timedelta(hours=1), after=["first"])


def health(*args: str, code: int = 0) -> str:
    """The command's output; ``code``: the exit code it must end with."""
    out = StringIO()
    if code:
        with pytest.raises(CommandError, match=r"^unhealthy: ") as raised:
            call_command("reactor_health", *args, stdout=out, no_color=True)
        assert raised.value.returncode == code
    else:
        call_command("reactor_health", *args, stdout=out, no_color=True)
    return out.getvalue()


def show(*args: Any) -> str:
    out = StringIO()
    call_command("reactor_show", *args, stdout=out, no_color=True)
    return out.getvalue()


def healthy_fleet() -> None:
    beat_worker(
        name="w1@box", queues=["reactor"], concurrency=4, tasks_done=9, started_at=timezone.now()
    )
    services.sweep()


def stop_sweeper() -> None:
    """As if the sweeper had stopped three intervals and a bit ago."""
    late = timezone.now() - dt.timedelta(seconds=3 * reactor_settings.SWEEP_INTERVAL + 5)
    assert ProcessHeartbeat.objects.filter(role="sweeper").update(last_seen_at=late) == 1


def test_a_healthy_fleet_exits_zero_and_lists_its_processes() -> None:
    healthy_fleet()
    output = health()
    lines = output.splitlines()
    assert lines[0].startswith("healthy at ")
    assert "workers alive: 1 (of 1 seen in a day)" in lines
    assert lines[2].startswith("sweeper last seen: ")
    assert "gone" not in lines[2]
    assert "overdue wake-ups (more than 2.0 s late): 0" in lines
    assert "dispatches not taken within 2.0 s: 0" in lines
    assert not [line for line in lines if line.startswith("problem:")]
    rows = read_table(output[output.index("ROLE") :].split("\n\n")[0].splitlines())
    assert [(r["ROLE"], r["NAME"], r["ALIVE"]) for r in rows] == [
        ("worker", "w1@box", "yes"),
        ("sweeper", rows[1]["NAME"], "yes"),
    ]
    assert rows[0]["TASKS"] == "9"
    assert rows[0]["QUEUES"] == "reactor"


def test_a_stopped_sweeper_exits_non_zero_saying_what_to_do() -> None:
    healthy_fleet()
    stop_sweeper()
    output = health(code=1)
    assert output.startswith("UNHEALTHY at ")
    [problem] = [line for line in output.splitlines() if line.startswith("problem:")]
    assert problem.startswith("problem: no sweeper has run for ")
    assert problem.endswith("start `python manage.py reactor_sweep --loop` or Celery beat")


def test_no_worker_and_no_sweeper_ever() -> None:
    output = health("--no-reactors", code=1)
    problems = [line for line in output.splitlines() if line.startswith("problem:")]
    assert problems == [
        "problem: no sweeper has run in the last day: start `python manage.py reactor_sweep "
        "--loop` or Celery beat",
        "problem: no worker has reported in the last day: start a Celery worker "
        "(`celery -A yourproject worker`)",
    ]
    assert "sweeper last seen: never (in the last day)" in output


def test_json_carries_the_same_verdict_and_figures() -> None:
    healthy_fleet()
    Doze.run({})
    data = json.loads(health("--json"))
    assert data["healthy"] is True
    assert data["workers_alive"] == 1
    assert data["sweeper_ok"] is True
    assert data["overdue_wake_ups"] == 0
    [reactor] = data["reactors"]
    assert reactor["reactor"] == Doze.definition.name
    assert (reactor["started"], reactor["in_flight"]) == (1, 1)

    stop_sweeper()
    data = json.loads(health("--json", code=1))
    assert data["healthy"] is False
    assert data["sweeper_ok"] is False
    assert data["problems"][0].startswith("no sweeper has run for ")


def test_reactor_show_warns_that_a_sleeping_run_will_not_wake_without_a_sweeper() -> None:
    healthy_fleet()
    outcome = Doze.run({})
    assert isinstance(outcome, Rescheduled)
    lines = show(str(outcome.execution_id)).splitlines()
    assert lines[1] == "status: pending"
    assert not [line for line in lines if line.startswith("warning:")]

    stop_sweeper()
    lines = show(str(outcome.execution_id)).splitlines()
    assert lines[1] == "status: pending"
    assert lines[2].startswith("warning: no sweeper has run for ")
    assert lines[2].endswith(
        "start `python manage.py reactor_sweep --loop` or Celery beat; until then this run "
        "is not woken"
    )


def test_reactor_show_warns_when_no_worker_is_alive() -> None:
    services.sweep()
    outcome = Doze.run({})
    warnings = [line for line in show(str(outcome.execution_id)).splitlines() if "warning" in line]
    assert warnings == [
        "warning: no worker has reported in the last day: start a Celery worker "
        "(`celery -A yourproject worker`); until then this run does not move"
    ]


class Queued(Reactor):
    @step()
    def only() -> str:
        return "done"

    class Meta:
        background = "all"


def test_depth_per_queue_and_a_queue_nobody_consumes() -> None:
    healthy_fleet()  # a live worker consuming "reactor"
    for _ in range(3):
        services.run_in_background(Queued, {}, queue="payments")
    services.run_in_background(Queued, {}, queue="reactor", priority=9)
    fresh = services.run_in_background(Queued, {}, queue="payments").execution_id
    # All but the last have waited a minute: a queue is a problem once its runs are late.
    from django_reactor.models import Execution

    Execution.objects.exclude(pk=fresh).update(created_at=timezone.now() - dt.timedelta(minutes=1))
    output = health("--no-reactors", code=1)
    problems = [line for line in output.splitlines() if line.startswith("problem:")]
    assert [p for p in problems if "consumes" in p] == [
        "problem: 3 runs have waited more than 2.0 s in the queue 'payments' and no live worker "
        "consumes it: start one with `celery -A <project> worker -Q payments` (or add the queue "
        "to a worker's -Q)"
    ]
    table = output[output.index("QUEUE ") :].split("\n\n")[0].splitlines()
    assert [(r["QUEUE"], r["WAITING"], r["CONSUMERS"]) for r in read_table(table)] == [
        ("payments", "4", "no live worker"),
        ("reactor", "1", "w1@box"),
    ]
    report = json.loads(health("--json", "--no-reactors", code=1))
    assert report["queues"] == [
        {"queue": "payments", "waiting": 4, "late": 3, "consumers": []},
        {"queue": "reactor", "waiting": 1, "late": 1, "consumers": ["w1@box"]},
    ]
    assert report["queues_complete"] is True
    # This process's worker now consumes payments only (the same process: the same heartbeat):
    # the queue left behind is the one nobody consumes (the dispatches may be late by now,
    # which is a problem of its own).
    beat_worker(name="w2@box", queues=["payments"], concurrency=1, tasks_done=0,
                started_at=timezone.now())  # fmt: skip
    report = services.fleet_health(reactors=False)
    assert [(q.queue, q.consumers) for q in report.queues] == [
        ("payments", ["w2@box"]),
        ("reactor", []),
    ]
    assert [p for p in report.problems if "consumes" in p] == [
        "1 run has waited more than 2.0 s in the queue 'reactor' and no live worker consumes "
        "it: start one with `celery -A <project> worker -Q reactor` (or add the queue to a "
        "worker's -Q)"
    ]
