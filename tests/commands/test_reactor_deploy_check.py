"""reactor_deploy_check: runs parked before, at and past an added, a removed and a renamed step
(and runs of a reactor the code lost); the check's table matches what happens to each run when
the new code takes it."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_reactor import Reactor, services, sleep, step
from django_reactor.checks import check_runs_in_flight
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = dt.timedelta(minutes=1)


def one() -> str:
    return "one"


def two() -> str:
    return "two"


def three() -> str:
    return "three"


def extra() -> str:
    return "extra"


def done() -> str:
    return "done"


def reactor(name: str, **steps: Any) -> type[Reactor]:
    """A reactor registered as ``deploytest.<name>``: defining it again is deploying new code."""
    meta = type("Meta", (), {"name": f"deploytest.{name}", "background": "all"})
    return type(name, (Reactor,), {"__module__": __name__, "Meta": meta, **steps})


def add_v1() -> type[Reactor]:
    return reactor(
        "Add", one=step()(one), nap=sleep(MINUTE, after="one"), two=step(wait_for=["nap"])(two)
    )


def add_v2() -> type[Reactor]:
    return reactor(
        "Add",
        one=step()(one),
        nap=sleep(MINUTE, after="one"),
        two=step(wait_for=["nap"])(two),
        extra=step(wait_for=["one"])(extra),
    )


def remove_v1() -> type[Reactor]:
    return reactor(
        "Remove",
        one=step()(one),
        nap1=sleep(MINUTE, after="one"),
        two=step(wait_for=["nap1"])(two),
        nap2=sleep(MINUTE, after="two"),
        three=step(wait_for=["nap2"])(three),
    )


def remove_v2() -> type[Reactor]:
    return reactor(
        "Remove",
        one=step()(one),
        nap1=sleep(MINUTE, after="one"),
        nap2=sleep(MINUTE, after="nap1"),
        three=step(wait_for=["nap2"])(three),
    )


def rename_v1() -> type[Reactor]:
    return reactor(
        "Rename", one=step()(one), nap=sleep(MINUTE, after="one"), done=step(wait_for=["nap"])(done)
    )


def rename_v2() -> type[Reactor]:
    return reactor(
        "Rename",
        one=step()(one),
        rest=sleep(MINUTE, after="one"),
        done=step(wait_for=["rest"])(done),
    )


def start(reactor_class: type[Reactor], **timing: Any) -> uuid.UUID:
    outcome = services.run(reactor_class, {}, **timing) if timing else None
    if outcome is None:
        outcome = services.run_in_background(reactor_class, {})
    assert outcome.execution_id is not None
    return outcome.execution_id


def changes_of(
    report: dict[str, Any], name: str
) -> dict[tuple[str, str], tuple[int, int, int, bool]]:
    (found,) = [r for r in report["reactors"] if r["reactor"] == f"deploytest.{name}"]
    (definition,) = found["definitions"]
    return {
        (c["kind"], c["step"]): (c["runs_before"], c["runs_at"], c["runs_after"], c["blocks"])
        for c in definition["changes"]
    }


def parked_ids(report: dict[str, Any], name: str) -> set[str]:
    (found,) = [r for r in report["reactors"] if r["reactor"] == f"deploytest.{name}"]
    return {i for d in found["definitions"] for i in d["would_park_ids"]}


def test_the_check_says_which_runs_park_and_the_deploy_proves_it(reactor_clock: Any) -> None:
    # The code before the deploy, and runs parked along it.
    add, remove, rename = add_v1(), remove_v1(), rename_v1()
    remove_past = start(remove)
    reactor_clock.tick()  # one, then asleep at nap1
    reactor_clock.advance(MINUTE)  # past nap1 and two: asleep at nap2
    remove_before = start(remove)
    add_past = start(add)
    rename_at = start(rename)
    reactor_clock.tick()  # each runs its first step and falls asleep
    add_before = start(add, delay=30)  # not started yet
    rename_before = start(rename, delay=30)
    assert Execution.objects.get(pk=remove_past).current_step == "nap2"
    assert Execution.objects.get(pk=remove_before).current_step == "nap1"
    gone = Execution.objects.create(
        reactor="deploytest.Gone",
        definition_hash="0" * 64,
        status=ExecutionStatus.SCHEDULED,
        wake_at=timezone.now(),
    ).pk

    # The new code.
    add_v2(), remove_v2(), rename_v2()
    out = StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("reactor_deploy_check", "--json", stdout=out)
    assert refused.value.returncode == 1
    report = json.loads(out.getvalue())
    assert report["ok"] is False

    # The added step: the run past its dependencies runs it next, the unstarted one later.
    assert changes_of(report, "Add") == {("added", "extra"): (1, 0, 1, False)}
    # The removed step: one run before it, one past it; its successor re-wired, one run at it.
    assert changes_of(report, "Remove") == {
        ("rewired", "nap2"): (1, 1, 0, True),
        ("removed", "two"): (1, 0, 1, True),
    }
    # The renamed step: one run at it, one before; its successor re-wired.
    assert changes_of(report, "Rename") == {
        ("renamed", "nap"): (1, 1, 0, True),
        ("rewired", "done"): (2, 0, 0, True),
    }
    assert parked_ids(report, "Add") == set()
    assert parked_ids(report, "Remove") == {str(remove_past)}
    assert parked_ids(report, "Rename") == {str(rename_at)}
    (missing,) = [r for r in report["reactors"] if r["reactor"] == "deploytest.Gone"]
    assert (missing["missing"], missing["would_park"]) == (True, 1)
    assert report["would_park"] == 3

    # The text says the same.
    text = StringIO()
    with pytest.raises(CommandError, match="3 run\\(s\\) in flight would park"):
        call_command("reactor_deploy_check", stdout=text, no_color=True)
    assert "deploytest.Gone: not in this code; its 1 run(s) in flight would park" in text.getvalue()
    assert f"would park definition_changed: 1 run(s): {remove_past}" in text.getvalue()

    # check --deploy --database default warns the same.
    (warning,) = check_runs_in_flight(databases=["default"])
    assert warning.id == "django_reactor.W009"
    assert warning.msg.startswith("3 run(s) in flight would park when a worker on this code")
    assert "deploytest.Gone: 1" in warning.msg
    assert check_runs_in_flight(databases=None) == []

    # Deploy: every run goes on under the new code; the check named exactly those that park.
    for _ in range(4):  # each sleep left starts when the run reaches it
        reactor_clock.advance(minutes=2)
    fates = {
        run: Execution.objects.get(pk=run)
        for run in (
            add_past,
            add_before,
            remove_past,
            remove_before,
            rename_at,
            rename_before,
            gone,
        )
    }
    parked = {run for run, row in fates.items() if row.status == ExecutionStatus.NEEDS_ATTENTION}
    assert parked == {remove_past, rename_at, gone}
    assert {fates[run].failure["kind"] for run in parked} == {
        "definition_changed",
        "reactor_missing",
    }
    assert {run: row.status for run, row in fates.items() if run not in parked} == {
        run: ExecutionStatus.COMPLETED for run in fates if run not in parked
    }
    # The run past the added step's dependencies ran it; the runs that went on are checked
    # against the deployed definition from then on (their later wake-ups did not park them).
    assert "extra" in {r.name for r in services.find(add_past).steps}
    current = {"Add": add_v2, "Remove": remove_v2, "Rename": rename_v2}
    for run in (add_past, add_before, remove_before, rename_before):
        row = fates[run]
        assert (
            row.definition_hash == current[row.reactor.split(".")[1]]().definition.definition_hash
        )


def test_with_no_run_in_flight_the_check_passes() -> None:
    out = StringIO()
    call_command("reactor_deploy_check", stdout=out)
    assert "no runs in flight: nothing a deploy could break" in out.getvalue()
    assert check_runs_in_flight(databases=["default"]) == []


def test_runs_on_the_codes_definition_pass(reactor_clock: Any) -> None:
    current = add_v2()
    start(current)
    reactor_clock.tick()
    out = StringIO()
    call_command("reactor_deploy_check", stdout=out, no_color=True)
    assert "deploytest.Add: 1 run(s) in flight, 1 on this code's definition" in out.getvalue()
    assert "ok: every run in flight can go on under this code" in out.getvalue()


def test_a_negative_sample_is_refused() -> None:
    with pytest.raises(CommandError, match="--sample must be 0 or more, got -1"):
        call_command("reactor_deploy_check", "--sample", "-1")


def versioned(version: str, *, kept_of: Any = None) -> type[Reactor]:
    """``deploytest.Versioned`` at ``version`` (version 2 adds a step), or that version kept in
    code beside ``kept_of``."""
    meta: dict[str, Any] = {"background": "all", "version": version}
    if kept_of is None:
        meta["name"] = "deploytest.Versioned"
    else:
        meta["version_of"] = kept_of
    steps: dict[str, Any] = {"one": step()(one), "nap": sleep(MINUTE, after="one")}
    steps["two"] = step(wait_for=["nap"])(two)
    if version == "2":
        steps["extra"] = step(wait_for=["two"])(extra)
    return type(
        "Versioned" if kept_of is None else f"VersionedV{version}",
        (Reactor,),
        {"__module__": __name__, "Meta": type("Meta", (), meta), **steps},
    )


def test_runs_of_a_version_the_code_lacks_would_wait(reactor_clock: Any) -> None:
    first = versioned("1")
    waiting = {start(first), start(first)}
    reactor_clock.tick()
    current = versioned("2")  # deployed without keeping version 1
    out = StringIO()
    with pytest.raises(CommandError, match="2 run\\(s\\) in flight started on code this code"):
        call_command("reactor_deploy_check", "--json", stdout=out)
    (found,) = [
        r for r in json.loads(out.getvalue())["reactors"] if r["reactor"] == "deploytest.Versioned"
    ]
    assert (found["version"], found["would_wait"], found["waiting"]) == ("2", 2, {"version 1": 2})
    text = StringIO()
    with pytest.raises(CommandError):
        call_command("reactor_deploy_check", stdout=text, no_color=True)
    assert (
        "started on version 1, which this code lacks: 2 run(s) would wait for a worker with it"
        in text.getvalue()
    )
    (warning,) = check_runs_in_flight(databases=["default"])
    assert "deploytest.Versioned: 2" in warning.msg

    # Kept in code: the check passes, and the deploy proves it (they finish on version 1).
    versioned("1", kept_of=current)
    out = StringIO()
    call_command("reactor_deploy_check", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["ok"] is True
    (found,) = report["reactors"]
    assert (found["runs_on_this_definition"], found["would_wait"]) == (2, 0)
    reactor_clock.advance(minutes=2)
    for run in waiting:
        row = Execution.objects.get(pk=run)
        assert (row.status, row.version) == (ExecutionStatus.COMPLETED, "1")
        assert "extra" not in {s.name for s in services.find(run).steps}


def test_runs_of_newer_code_would_wait_after_a_rollback(reactor_clock: Any) -> None:
    older = start(add_v1())
    reactor_clock.advance(seconds=5)
    newer = start(add_v2())  # deployed: a run starts on it
    reactor_clock.tick()
    add_v1()  # rolled back
    out = StringIO()
    with pytest.raises(CommandError, match="would wait for a worker that has it"):
        call_command("reactor_deploy_check", "--json", stdout=out)
    (found,) = json.loads(out.getvalue())["reactors"]
    (label,) = found["waiting"]
    assert label.endswith("(newer code)")
    assert found["would_wait"] == 1
    reactor_clock.advance(minutes=2)
    assert Execution.objects.get(pk=older).status == ExecutionStatus.COMPLETED
    assert Execution.objects.get(pk=newer).status == ExecutionStatus.PENDING
