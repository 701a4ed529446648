"""reactor_send: a message to a run's mailbox from the command line; reactor_show lists them."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_reactor import Reactor, arg, receive, step
from django_reactor.models import Execution, Message
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)


class SendShipping(Reactor):
    pack = step(Tracked)
    shipped = receive("shipment", after="pack")
    notify = step(Tracked, shipment=arg.result("shipped"))


def send(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("reactor_send", *args, stdout=out, **options)
    return out.getvalue()


def test_a_message_resumes_a_run_paused_at_its_receive() -> None:
    run_id = str(SendShipping.run({}).execution_id)
    printed = send(run_id, "shipment", "carrier=dhl", "parcels=2")
    assert printed.splitlines()[0] == f"execution {run_id}: completed"
    assert "value:" in printed
    notify = Execution.objects.get(pk=run_id).steps.get(step="notify").result
    assert notify["shipment"] == {"carrier": "dhl", "parcels": 2}


def test_a_message_for_a_run_not_waiting_yet_is_kept_and_shown() -> None:
    row = Execution.objects.create(reactor=SendShipping.definition.name, definition_hash="x")
    printed = send(str(row.pk), "shipment", payload='["any", "json"]', json=True)
    assert json.loads(printed)["status"] == row.status
    out = StringIO()
    call_command("reactor_show", str(row.pk), "--no-trace", stdout=out)
    shown = out.getvalue()
    assert "messages:" in shown
    assert "shipment" in shown
    assert "unread" in shown
    data = StringIO()
    call_command("reactor_show", str(row.pk), "--json", stdout=data)
    (message,) = json.loads(data.getvalue())["messages"]
    assert (message["topic"], message["status"], message["kind"]) == (
        "shipment",
        "unread",
        "message",
    )


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        (["refunds", "a=1"], {}, r"receives no messages on 'refunds' \(its topics: shipment\)"),
        (["bad topic", "a=1"], {}, "a topic is a name"),
        (["shipment"], {}, "no payload given"),
        (["shipment"], {"payload": "{nope"}, "not valid JSON"),
    ],
)
def test_bad_sends_say_what_to_do_and_keep_nothing(
    args: list[str], options: dict[str, Any], message: str
) -> None:
    run_id = str(SendShipping.run({}).execution_id)
    with pytest.raises(CommandError, match=message):
        send(run_id, *args, **options)
    assert not Message.objects.exists()


def test_an_ended_run_takes_no_message() -> None:
    run_id = str(SendShipping.run({}).execution_id)
    send(run_id, "shipment", "carrier=dhl")
    with pytest.raises(CommandError, match="takes no messages any more"):
        send(run_id, "shipment", "carrier=ups")
