"""Business attributes on the command line: ``reactor_list --attr KEY=VALUE`` (repeatable) and
``reactor_show``, which prints a run's attributes."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.integration.attribute_reactors import Order

pytestmark = pytest.mark.django_db(transaction=True)


def command(name: str, *args: Any, **options: Any) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out, no_color=True, **options)
    return out.getvalue()


def listed(*attributes: str, **options: Any) -> list[str]:
    args = [arg for text in attributes for arg in ("--attr", text)]
    return [run["id"] for run in json.loads(command("reactor_list", *args, json=True, **options))]


def test_reactor_list_keeps_the_runs_with_every_attribute_given_newest_first() -> None:
    acme = [str(Order.run({"customer_id": 42, "tenant": "acme"}).execution_id) for _ in range(3)]
    other = str(Order.run({"customer_id": 42, "tenant": "other"}).execution_id)

    assert listed("tenant=acme") == acme[::-1]
    assert listed("customer_id=42") == [other, *acme[::-1]]
    assert listed("customer_id=42", "tenant=other") == [other]
    assert listed("customer_id=42", "tenant=nobody") == []
    assert listed("tenant=acme", limit=2) == acme[:0:-1]
    assert listed("tenant=acme", status="failed") == []
    table = command("reactor_list", "--attr", "tenant=other")
    assert other in table
    assert acme[0] not in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--attr", "tenant"], r"--attr tenant: an attribute filter is KEY=VALUE"),
        (["--attr", "1st=x"], r"an attribute key is a letter"),
        (["--attr", "tenant=" + "t" * 256], r"at most 255 characters"),
        (["--attr", "tenant=a", "--attr", "tenant=b"], r"--attr tenant= is given twice"),
    ],
)
def test_reactor_list_refuses_a_wrong_attribute_saying_why(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        command("reactor_list", *args)


def test_reactor_show_prints_a_runs_attributes() -> None:
    outcome = Order.run({"customer_id": 42, "tenant": "acme"})

    text = command("reactor_show", str(outcome.execution_id), no_trace=True)
    assert (
        "attributes: channel=web, customer_id=42, payment_id=pay-1, priority=false, "
        "stage=shipped, tenant=acme"
    ) in text
    data = json.loads(command("reactor_show", str(outcome.execution_id), json=True))
    assert data["attributes"]["customer_id"] == "42"
