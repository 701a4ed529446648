"""Versions under live runs: a run records the version it started on, and only code of that
version runs it; a version kept in code finishes its runs; a run of code this process lacks is
handed back, nothing run, and waits for a worker that has it."""

from __future__ import annotations

import datetime as dt
import re
import sys
import uuid
from typing import Any

import pytest
from django.utils import timezone

from django_reactor import ContinueAsNew, Reactor, registry, services, sleep, step
from django_reactor.exceptions import KeptVersion, VersionMissing
from django_reactor.models import Execution, ExecutionEvent, ProcessHeartbeat
from django_reactor.states import EventKind, ExecutionStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.mariadb]

MINUTE = dt.timedelta(minutes=1)
NAME = "versiontest.Order"


@pytest.fixture(autouse=True)
def _own_name(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's reactor has a name of its own: the versions one test keeps in code are
    not another's."""
    monkeypatch.setattr(sys.modules[__name__], "NAME", f"versiontest.{request.node.name[:60]}")


def one() -> str:
    return "one"


def two_v1() -> str:
    return "two on version 1"


def two_v2() -> str:
    return "two on version 2"


def three() -> str:
    return "three"


def order(version: str | None = None, *, kept_of: Any = None, name: str = "") -> type[Reactor]:
    """Version 1's steps (one, a nap, two), or version 2's (another two, then three)."""
    meta: dict[str, Any] = {"background": "all"}
    if kept_of is not None:
        meta.update(version_of=kept_of, version=version)
    else:
        meta["name"] = name or NAME
        if version is not None:
            meta["version"] = version
    steps: dict[str, Any] = {"one": step()(one), "nap": sleep(MINUTE, after="one")}
    if version == "2":
        steps.update(two=step(wait_for=["nap"])(two_v2), three=step(wait_for=["two"])(three))
    else:
        steps["two"] = step(wait_for=["nap"])(two_v1)
    class_name = "OrderV1" if kept_of is not None else "Order"
    return type(
        class_name, (Reactor,), {"__module__": __name__, "Meta": type("Meta", (), meta), **steps}
    )


def plain_with_version_2s_steps() -> type[Reactor]:
    """``versiontest.Plain`` with version 2's steps but no Meta.version: only the fingerprint
    tells it from version 1's."""
    steps = {
        "one": step()(one),
        "nap": sleep(MINUTE, after="one"),
        "two": step(wait_for=["nap"])(two_v2),
        "three": step(wait_for=["two"])(three),
    }
    meta = type("Meta", (), {"name": "versiontest.Plain", "background": "all"})
    return type("Order", (Reactor,), {"__module__": __name__, "Meta": meta, **steps})


def start(reactor: type[Reactor], inputs: dict[str, Any] | None = None) -> uuid.UUID:
    outcome = services.run_in_background(reactor, inputs or {})
    assert outcome.execution_id is not None
    return outcome.execution_id


def trace(run: uuid.UUID) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(run).trace]


def hand_backs(run: uuid.UUID) -> list[ExecutionEvent]:
    return list(ExecutionEvent.objects.filter(execution_id=run, kind=EventKind.HAND_BACK))


def results(run: uuid.UUID) -> dict[str, Any]:
    """What each step (but the nap) returned."""
    return {s.name: s.result for s in services.find(run).steps if s.name != "nap"}


def test_a_run_records_the_version_it_started_on(reactor_clock: Any) -> None:
    unversioned = start(order(name="versiontest.Plain"))
    versioned = start(order("2"))
    assert Execution.objects.get(pk=unversioned).version == ""
    assert Execution.objects.get(pk=versioned).version == "2"
    reactor_clock.tick()
    reactor_clock.advance(minutes=2)
    assert results(versioned)["three"] == "three"


def test_a_kept_version_finishes_its_runs_on_its_own_code(reactor_clock: Any) -> None:
    first = start(order("1"))
    reactor_clock.tick()  # one, then asleep
    # The deploy: version 2 starts new runs, version 1 is kept to finish its own.
    current = order("2")
    order("1", kept_of=current)
    second = start(current)
    reactor_clock.tick()
    reactor_clock.advance(minutes=2)
    assert services.find(first).status == ExecutionStatus.COMPLETED
    assert results(first) == {"one": "one", "two": "two on version 1"}
    assert Execution.objects.get(pk=first).version == "1"
    assert services.find(second).status == ExecutionStatus.COMPLETED
    assert results(second)["two"] == "two on version 2"
    assert hand_backs(first) == []


def test_a_kept_version_starts_no_run() -> None:
    current = order("2")
    kept = order("1", kept_of=current)
    with pytest.raises(KeptVersion, match=f"OrderV1 is version '1' of {re.escape(NAME)}, kept"):
        services.run_in_background(kept, {})
    assert registry.get(NAME) is current
    assert registry.of_run(NAME, "1") is kept
    assert registry.of_run(NAME, "") is current
    assert registry.versions_of(NAME) == ["2", "1"]
    assert registry.inventory()[NAME]["versions"] == ["2", "1"]


def test_a_run_of_a_version_this_code_lacks_waits_and_runs_nothing(reactor_clock: Any) -> None:
    run = start(order("1"))
    reactor_clock.tick()
    before = trace(run)
    order("2")  # version 2 deployed without keeping version 1
    with pytest.raises(VersionMissing, match="Keep that version in code"):
        registry.of_run(NAME, "1")
    reactor_clock.advance(minutes=2)
    row = Execution.objects.get(pk=run)
    assert (row.status, row.lease_owner) == (ExecutionStatus.PENDING, None)
    assert row.wake_at is not None
    assert row.wake_at > timezone.now()
    # Nothing ran: the trace only gained the hand-back, which says why and what to do.
    (back,) = hand_backs(run)
    assert trace(run) == [*before, (EventKind.HAND_BACK, "")]
    assert back.data["version"] == "1"
    assert f"this worker lacks version '1' of {NAME}" in back.data["error"]
    assert "no live worker has it yet" in back.data["error"]
    assert results(run) == {"one": "one"}

    # Handed back again and again: one trace entry, and longer waits.
    first_wait = (row.wake_at - timezone.now()).total_seconds()
    for _ in range(4):
        reactor_clock.advance(seconds=40)
    row = Execution.objects.get(pk=run)
    assert len(hand_backs(run)) == 1
    assert (row.wake_at - timezone.now()).total_seconds() > first_wait

    # The version comes back (kept in code): the run finishes on it.
    order("1", kept_of=registry.get(NAME))
    reactor_clock.advance(minutes=2)
    assert services.find(run).status == ExecutionStatus.COMPLETED
    assert results(run)["two"] == "two on version 1"


def test_the_hand_back_names_a_live_worker_with_the_version(reactor_clock: Any) -> None:
    run = start(order("1"))
    reactor_clock.tick()
    order("2")
    now = timezone.now()
    ProcessHeartbeat.objects.create(
        role="worker",
        host="old-host",
        pid=4242,
        name="old@old-host",
        interval=10,
        started_at=now,
        last_seen_at=now,
        code={NAME: {"versions": ["1"], "definitions": []}},
    )
    reactor_clock.advance(minutes=2)
    (back,) = hand_backs(run)
    assert "worker old@old-host has it and takes the run" in back.data["error"]


def test_a_run_of_newer_code_waits_for_it_instead_of_going_on_under_older(
    reactor_clock: Any,
) -> None:
    # Unversioned: the fingerprint is the version. Old code starts a run, new code another.
    old = order(name="versiontest.Plain")
    older_run = start(old)
    reactor_clock.tick()
    reactor_clock.advance(seconds=5)
    newer = plain_with_version_2s_steps()
    newer_run = start(newer)
    reactor_clock.tick()
    # A worker still on the old code takes both: the older run goes on, the newer one waits.
    order(name="versiontest.Plain")
    reactor_clock.advance(minutes=2)
    assert services.find(older_run).status == ExecutionStatus.COMPLETED
    assert services.find(newer_run).status == ExecutionStatus.PENDING
    (back,) = hand_backs(newer_run)
    assert back.data["definition"] == newer.definition.definition_hash
    assert "three" not in results(newer_run)
    # The new code arrives: it finishes the run.
    plain_with_version_2s_steps()
    reactor_clock.advance(minutes=2)
    assert services.find(newer_run).status == ExecutionStatus.COMPLETED
    assert results(newer_run)["three"] == "three"


def test_the_admin_shows_the_version_and_the_hand_back(
    reactor_clock: Any, admin_client: Any
) -> None:
    run = start(order("1"))
    reactor_clock.tick()
    order("2")
    reactor_clock.advance(minutes=2)
    page = admin_client.get(f"/admin/django_reactor/execution/{run}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "version" in text
    assert ">1<" in text.replace(" ", "").replace("\n", "")
    assert f"this worker lacks version &#x27;1&#x27; of {NAME}" in text


def renew(month: int) -> Any:
    return ContinueAsNew({"month": month + 1}) if month < 1 else month


def test_a_successor_runs_on_its_predecessors_version(reactor_clock: Any) -> None:
    from rest_framework import serializers

    class Inputs(serializers.Serializer[dict[str, Any]]):
        month = serializers.IntegerField()

    meta = type("Meta", (), {"name": NAME, "version": "2", "background": "all"})
    loop = type(
        "Loop",
        (Reactor,),
        {"__module__": __name__, "Meta": meta, "Inputs": Inputs, "renew": step()(renew)},
    )
    first = start(loop, {"month": 0})
    reactor_clock.tick()
    reactor_clock.tick()
    rows = list(Execution.objects.filter(reactor=NAME).order_by("generation"))
    assert [(r.generation, r.version, r.status) for r in rows] == [
        (0, "2", ExecutionStatus.COMPLETED),
        (1, "2", ExecutionStatus.COMPLETED),
    ]
    assert rows[0].id == first
