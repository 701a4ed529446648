"""Meta.throttle: at most ``limit`` runs of a key start within any period; a start over it is
delayed (scheduled for the key's next room), never refused nor lost."""

from __future__ import annotations

import datetime as dt
import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from rest_framework import serializers

from django_reactor import Dispatched, Reactor, Scheduled, Throttle, services, step
from django_reactor.exceptions import DefinitionError
from django_reactor.models import Execution

pytestmark = pytest.mark.django_db

PERIOD = dt.timedelta(minutes=1)


class TenantInputs(serializers.Serializer):
    tenant_id = serializers.CharField()


class Export(Reactor):
    Inputs = TenantInputs

    @step()
    def only() -> str:
        return "exported"

    class Meta:
        background = "all"
        throttle = Throttle(key="{tenant_id}", limit=2, period=PERIOD)


class InlineExport(Reactor):
    Inputs = TenantInputs

    @step()
    def only() -> str:
        return "exported"

    class Meta:
        throttle = Throttle(key="{tenant_id}", limit=1, period=PERIOD)


def row(execution_id: uuid.UUID | None) -> Execution:
    return Execution.objects.get(pk=execution_id)


@pytest.mark.parametrize(
    ("throttle", "says"),
    [
        (Throttle(key="{tenant_id}", limit=0), "Bad.Meta.throttle.limit must be a positive"),
        (Throttle(key="{nope}", limit=1), "names {nope}, which is not an input of Bad"),
        (Throttle(key="{tenant_id}", period=-1), "Bad.Meta.throttle.period"),
        (Throttle(key="{tenant_id}", period="soon"), "Bad.Meta.throttle.period"),
        (5, "Bad.Meta.throttle must be Throttle("),
    ],
)
def test_a_bad_declaration_is_refused_at_class_definition(throttle: Any, says: str) -> None:
    with pytest.raises(DefinitionError, match=re.escape(says)):
        type(
            "Bad",
            (Reactor,),
            {
                "Inputs": TenantInputs,
                "only": step()(lambda: 1),
                "Meta": type("Meta", (), {"throttle": throttle}),
            },
        )


def test_starts_over_the_limit_are_delayed_a_period_after_the_starts_they_follow() -> None:
    outcomes = [services.run_in_background(Export, {"tenant_id": "a"}) for _ in range(5)]
    other = services.run_in_background(Export, {"tenant_id": "b"})
    assert [type(o) for o in outcomes] == [
        Dispatched,
        Dispatched,
        Scheduled,
        Scheduled,
        Scheduled,
    ]
    assert isinstance(other, Dispatched)  # another key has its own room
    rows = [row(o.execution_id) for o in outcomes]
    slots = [r.throttle_slot for r in rows]
    assert all(s is not None for s in slots)
    # Each start is a period after the start two before it: no period holds three.
    assert slots[2] == slots[0] + PERIOD
    assert slots[3] == slots[1] + PERIOD
    assert slots[4] == slots[2] + PERIOD
    assert [r.status for r in rows] == ["pending"] * 2 + ["scheduled"] * 3
    assert [r.wake_at for r in rows[2:]] == slots[2:]
    delayed = services.find(rows[2].id)
    [event] = [e for e in delayed.trace if e.kind == "throttle"]
    assert event.data == {
        "key": "a",
        "start_at": slots[2].isoformat(),
        "reason": "throttle of tests.integration.test_throttles.Export: 2 start(s) per "
        "1 min 00 s with key 'a'",
    }
    out = StringIO()
    call_command("reactor_show", str(rows[2].id), stdout=out, no_color=True)
    assert "throttle key: a" in out.getvalue()


def test_an_inline_run_over_the_limit_is_scheduled_for_a_worker() -> None:
    assert InlineExport.run({"tenant_id": "i"}).value == {"only": "exported"}
    later = InlineExport.run({"tenant_id": "i"})
    assert isinstance(later, Scheduled)
    assert row(later.execution_id).status == "scheduled"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_never_put_more_than_the_limit_in_one_period() -> None:
    assert connection.vendor == "postgresql"
    callers = 7
    barrier = threading.Barrier(callers, timeout=20)

    def start() -> uuid.UUID | None:
        from django.db import connections

        try:
            barrier.wait()
            return services.run_in_background(Export, {"tenant_id": "race"}).execution_id
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=callers) as pool:
        ids = [f.result(timeout=60) for f in [pool.submit(start) for _ in range(callers)]]
    slots = sorted(row(i).throttle_slot for i in ids)  # type: ignore[type-var]
    assert len(slots) == callers
    for earlier, later in zip(slots, slots[2:], strict=False):
        assert later - earlier >= PERIOD
