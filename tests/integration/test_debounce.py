"""Meta.debounce: starts of a key close together collapse into one run with the last inputs,
started once the key is quiet (or at max_wait); every collapsed call gets that run."""

from __future__ import annotations

import datetime as dt
import os
import random
import re
import time
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework import serializers

from django_reactor import Debounce, Reactor, Scheduled, Throttle, arg, services, step
from django_reactor.exceptions import DefinitionError
from django_reactor.models import Execution, ExecutionAttribute
from django_reactor.states import ExecutionStatus

# The database's clock moves on between statements (as it does for workers), not frozen at a
# test transaction's start: the runs come due when the test clock says.
pytestmark = pytest.mark.django_db(transaction=True)

PERIOD = dt.timedelta(seconds=30)
#: The issue asks for 1,000 bursts; the suite runs fewer (REACTOR_DEBOUNCE_BURSTS=1000 for all).
BURSTS = int(os.environ.get("REACTOR_DEBOUNCE_BURSTS", "100"))


class SyncInputs(serializers.Serializer):
    user_id = serializers.CharField()
    n = serializers.IntegerField()


class SyncUser(Reactor):
    Inputs = SyncInputs

    @step(n=arg.input("n"))
    def only(n: int) -> int:
        return n

    class Meta:
        debounce = Debounce(key="{user_id}", period=PERIOD)
        attributes = {"n": arg.input("n")}
        returns = "only"


class BoundedSync(Reactor):
    Inputs = SyncInputs

    @step()
    def only() -> str:
        return "synced"

    class Meta:
        debounce = Debounce(key="{user_id}", period=PERIOD, max_wait=dt.timedelta(seconds=50))


def row(execution_id: uuid.UUID | None) -> Execution:
    return Execution.objects.get(pk=execution_id)


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        ({"debounce": Debounce(key="{nope}")}, "names {nope}, which is not an input of Bad"),
        ({"debounce": Debounce(key="{user_id}", period=0)}, "Bad.Meta.debounce.period"),
        (
            {"debounce": Debounce(key="{user_id}", period=30, max_wait=10)},
            "Bad.Meta.debounce.max_wait (10.0 s) is shorter than its period (30.0 s)",
        ),
        ({"debounce": "{user_id}"}, "Bad.Meta.debounce must be Debounce("),
        (
            {"debounce": Debounce(key="{user_id}"), "throttle": Throttle(key="{user_id}")},
            "Bad.Meta declares both debounce and throttle",
        ),
    ],
)
def test_a_bad_declaration_is_refused_at_class_definition(meta: dict[str, Any], says: str) -> None:
    with pytest.raises(DefinitionError, match=re.escape(says)):
        type(
            "Bad",
            (Reactor,),
            {"Inputs": SyncInputs, "only": step()(lambda: 1), "Meta": type("Meta", (), meta)},
        )


def test_a_burst_collapses_into_one_run_with_the_last_inputs(reactor_clock: Any) -> None:
    outcomes = [services.run_in_background(SyncUser, {"user_id": "u1", "n": n}) for n in range(5)]
    assert all(isinstance(o, Scheduled) for o in outcomes)
    assert {o.execution_id for o in outcomes} == {outcomes[0].execution_id}
    assert Execution.objects.count() == 1
    run = row(outcomes[0].execution_id)
    assert (run.status, run.debounce_key, run.inputs) == (
        ExecutionStatus.SCHEDULED,
        "u1",
        {"user_id": "u1", "n": 4},
    )
    # The attributes follow the inputs.
    assert list(
        ExecutionAttribute.objects.filter(execution_id=run.id).values_list("key", "value")
    ) == [("n", "4")]
    assert run.wake_at == outcomes[-1].start_at
    kinds = [e.kind for e in services.find(run.id).trace]
    assert kinds == ["start", "debounce", "debounce", "debounce", "debounce"]
    out = StringIO()
    call_command("reactor_show", str(run.id), stdout=out, no_color=True)
    assert "debounce key: u1" in out.getvalue()
    # Quiet for a period: it runs once, with the last inputs.
    reactor_clock.advance(PERIOD)
    assert services.find(run.id).outcome.value == 4
    # The next start of the key is a new run.
    again = services.run_in_background(SyncUser, {"user_id": "u1", "n": 9})
    assert again.execution_id != run.id


def test_max_wait_bounds_how_long_a_busy_key_waits(reactor_clock: Any) -> None:
    first = services.run_in_background(BoundedSync, {"user_id": "b", "n": 0})
    for n in range(1, 3):
        reactor_clock.advance(seconds=20, run=False)  # the key never quiet for 30 s
        outcome = services.run_in_background(BoundedSync, {"user_id": "b", "n": n})
        assert outcome.execution_id == first.execution_id
        assert row(first.execution_id).wake_at == outcome.start_at
    # The last call, at 40 s, moved the start to 50 s (its max_wait), not to 70 s.
    assert reactor_clock.advance(seconds=9) == []
    done = reactor_clock.advance(seconds=1)
    assert [(o.execution_id, o.status) for o in done] == [(first.execution_id, "completed")]
    assert row(first.execution_id).inputs["n"] == 2


def test_bursts_of_many_keys_start_exactly_one_run_each_with_its_last_inputs(
    reactor_clock: Any,
) -> None:
    rng = random.Random(31)
    sizes = {f"user-{b}": rng.randint(5, 50) for b in range(BURSTS)}
    last: dict[str, int] = {}
    calls = [(user, n) for user, size in sizes.items() for n in range(size)]
    rng.shuffle(calls)  # the bursts interleave
    began = time.monotonic()
    for user, n in calls:
        services.run_in_background(SyncUser, {"user_id": user, "n": n})
        last[user] = n
    assert Execution.objects.count() == BURSTS
    # The last calls came later than the first: move past them too.
    reactor_clock.advance(PERIOD + dt.timedelta(seconds=time.monotonic() - began + 1))
    values = {
        services.find(r.id).inputs["user_id"]: services.find(r.id).outcome.value
        for r in Execution.objects.all()
    }
    assert values == last
