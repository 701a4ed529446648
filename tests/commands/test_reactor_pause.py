"""reactor_pause and reactor_unpause: pausing runs and reactors from the command line."""

from __future__ import annotations

import json

import pytest

from django_reactor import services
from django_reactor.models import Pause
from django_reactor.states import ExecutionStatus
from tests.commands.test_reactor_steer import command, failing, status
from tests.integration.test_pausing import PausesItself, Queued

pytestmark = pytest.mark.django_db(transaction=True)


def test_pause_and_unpause_runs_by_id() -> None:
    run = str(Queued.run({}).execution_id)
    out, _ = command("reactor_pause", run, reason="partner outage")
    assert f"execution {run}: suspended" in out
    assert status(run) == ExecutionStatus.SUSPENDED
    shown, _ = command("reactor_show", run, no_trace=True)
    assert "paused: this run is paused by reactor_pause by " in shown
    assert (
        shown.split("paused: this run is paused by ")[1].split("\n")[0].endswith(": partner outage")
    )
    assert f"it waits, holding no worker; reactor_unpause {run} lets it go on" in shown

    out, _ = command("reactor_unpause", run, json=True)
    assert json.loads(out) == [{"execution_id": run, "ok": True, "status": "pending"}]


def test_a_refused_pause_says_why_and_exits_non_zero() -> None:
    done = str(PausesItself.run({}).execution_id)
    _, err, message = failing("reactor_pause", done)
    assert f"cannot pause execution {done}: it is completed" in err
    assert message == "1 of 1 execution(s) could not be paused; see the messages above"


def test_pause_and_unpause_a_reactor() -> None:
    out, _ = command("reactor_pause", reactor="PausesItself", reason="deploying")
    assert out.startswith("tests.pausing.PausesItself paused:")
    out, _ = command("reactor_pause", reactor="PausesItself")
    assert "was paused already" in out
    assert ": deploying" in out
    listed, _ = command("reactor_pause", list=True)
    assert "tests.pausing.PausesItself paused since" in listed
    assert listed.rstrip().endswith(": deploying")

    run = PausesItself.run({}).execution_id
    assert status(run) == ExecutionStatus.SUSPENDED
    shown, _ = command("reactor_show", str(run), no_trace=True)
    assert "paused: every run of tests.pausing.PausesItself is paused by reactor_pause by " in shown

    out, _ = command("reactor_unpause", reactor="PausesItself", json=True)
    assert json.loads(out) == {
        "reactor": "tests.pausing.PausesItself",
        "was_paused": True,
        "released": 1,
    }
    assert not Pause.objects.exists()
    _, _, message = failing("reactor_unpause", reactor="PausesItself")
    assert "is not paused" in message
    assert services.find(run).status == ExecutionStatus.PENDING


def test_bad_arguments_say_what_to_give() -> None:
    _, _, message = failing("reactor_pause")
    assert "give the ids of the runs to pause, or --reactor NAME" in message
    _, _, message = failing("reactor_pause", "0" * 8, reactor="PausesItself")
    assert message == "give execution ids or --reactor, not both"
    _, _, message = failing("reactor_pause", reactor="NoSuchReactor")
    assert "--reactor 'NoSuchReactor': no reactor of that name" in message
    _, _, message = failing("reactor_unpause")
    assert "give the ids of the runs to unpause" in message
