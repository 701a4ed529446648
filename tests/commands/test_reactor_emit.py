"""reactor_emit: an event from the command line, resuming, starting and refusing as emit() does."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework import serializers

from django_reactor import EmittedEvent, Reactor, arg, on_event, step, wait_for_event
from django_reactor.models import Event, Execution
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)

WAITED = "cli.parcel.delivered"
TRIGGER = "cli.order.placed"


class EmitAwaitParcel(Reactor):
    pack = step(Tracked)
    delivered = wait_for_event(WAITED, match=arg.input("parcel"), after="pack", resume="inline")
    notify = step(Tracked, delivery=arg.result("delivered"))


def order_inputs(event: EmittedEvent) -> dict[str, Any]:
    return {"order": event.payload["order"]}


class EmitPlaced(Reactor):
    class Inputs(serializers.Serializer):
        order = serializers.CharField(max_length=10)

    book = step(Tracked, order=arg.input("order"))

    class Meta:
        triggers = [on_event(TRIGGER, inputs=order_inputs)]


def emit(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("reactor_emit", *args, stdout=out, **options)
    return out.getvalue()


def test_an_event_resumes_the_run_waiting_for_its_key() -> None:
    run_id = str(EmitAwaitParcel.run({"parcel": "P1"}).execution_id)
    printed = emit(WAITED, "carrier=dhl", "parcels=2", key="P1", event_id="evt_p1")
    lines = printed.splitlines()
    assert lines[0] == f"event evt_p1 of {WAITED!r}: emitted"
    assert f"  resumed: {run_id}" in lines
    assert f"  given to: {run_id}" in lines
    row = Execution.objects.get(pk=run_id)
    assert row.status == ExecutionStatus.COMPLETED
    assert row.steps.get(step="notify").result["delivery"] == {"carrier": "dhl", "parcels": 2}
    event = Event.objects.get()
    assert (event.key, event.event_id, event.source) == ("P1", "evt_p1", "command")
    # Again with the same id: a replay, nothing new.
    again = emit(WAITED, "carrier=dhl", "parcels=2", key="P1", event_id="evt_p1")
    assert again.splitlines() == [
        f"event evt_p1 of {WAITED!r}: emitted before with this id; nothing new was done"
    ]
    assert Event.objects.count() == 1


def test_an_event_starts_the_run_its_trigger_names_and_prints_json() -> None:
    data = json.loads(emit(TRIGGER, payload='{"order": "O-1"}', json=True))
    (started,) = data["started"]
    assert Execution.objects.get(pk=started).inputs == {"order": "O-1"}
    assert data["replay"] is False
    assert data["name"] == TRIGGER
    assert Event.objects.get().event_id == data["event_id"]  # a new id was made


def test_the_payload_is_read_from_a_file_or_standard_input(tmp_path: Path) -> None:
    path = tmp_path / "order.json"
    path.write_text('{"order": "O-2"}')
    emit(TRIGGER, payload_file=str(path), event_id="evt_file")
    emit(TRIGGER, payload_file="-", stdin=StringIO('{"order": "O-3"}'), event_id="evt_stdin")
    inputs = sorted(row.inputs["order"] for row in Execution.objects.all())
    assert inputs == ["O-2", "O-3"]


def test_an_event_nothing_matches_is_kept_and_said_so() -> None:
    printed = emit(WAITED, key="nobody", event_id="evt_alone")
    assert "no run waited for it" in printed
    assert Event.objects.get().payload is None


def test_an_event_a_trigger_refuses_is_kept_and_exits_1() -> None:
    out = StringIO()
    with pytest.raises(CommandError, match="was kept, but not all it matches") as raised:
        call_command(
            "reactor_emit", TRIGGER, payload='{"order": "far-too-long-an-order"}', stdout=out
        )
    assert raised.value.returncode == 1
    assert "  not done: " in out.getvalue()
    assert "refused the inputs" in out.getvalue()
    assert Event.objects.count() == 1
    assert not Execution.objects.exists()


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        (["cli.parcel.deliverd"], {}, r"no registered reactor waits for.*'cli\.parcel\.deliverd'"),
        (["bad name"], {}, "an event name is at most"),
        ([WAITED], {"payload": "{nope"}, "--payload is not valid JSON"),
        ([WAITED, "a=1"], {"payload": "{}"}, "give the payload one way"),
        ([WAITED], {"payload_file": "/no/such/file.json"}, "cannot read the payload file"),
        ([WAITED], {"key": "k" * 256}, "the key of event"),
        ([WAITED], {"payload": '"\\u0000"'}, "cannot be stored"),
    ],
)
def test_bad_emits_say_what_to_do_and_keep_nothing(
    args: list[str], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        emit(*args, **options)
    assert not Event.objects.exists()


def test_an_event_id_reused_for_another_payload_is_refused() -> None:
    emit(WAITED, "carrier=dhl", key="P2", event_id="evt_same")
    with pytest.raises(CommandError, match="give a new one for another event"):
        emit(WAITED, "carrier=ups", key="P2", event_id="evt_same")
    assert Event.objects.get().payload == {"carrier": "dhl"}


def test_the_options_parse_as_on_the_command_line() -> None:
    run_id = str(EmitAwaitParcel.run({"parcel": "P3"}).execution_id)
    printed = emit(WAITED, "--key", "P3", "--event-id", "evt_p3", "--payload", '{"ok": true}')
    assert f"  resumed: {run_id}" in printed.splitlines()
    event = Event.objects.get()
    assert (event.key, event.event_id, event.payload) == ("P3", "evt_p3", {"ok": True})
