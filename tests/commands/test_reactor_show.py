"""reactor_show: one stored run, in full."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework import serializers

from django_reactor import Paused, Reactor, arg, compose, interrupt, step
from tests.commands.tables import read_table, section
from tests.integration.reactors import FAIL_AT, Fragile, Tracked, Transfer

pytestmark = pytest.mark.django_db(transaction=True)


class ShowSecret(Reactor):
    """Like Transfer, but no step returns the secret it takes (results are not redacted)."""

    class Inputs(serializers.Serializer):
        account = serializers.CharField()
        amount = serializers.IntegerField()
        pin = serializers.CharField(write_only=True)

    @step(account=arg.input("account"), amount=arg.input("amount"), pin=arg.input("pin"))
    def debit(account: str, amount: int, pin: str) -> dict[str, Any]:
        return {"account": account, "amount": amount}

    credit = step(Tracked, amount=arg.result("debit", "amount"))
    notify = step(Tracked, wait_for=["credit"])

    class Meta:
        returns = "credit"


class ShowChild(Reactor):
    inner = step(Tracked)


class ShowParent(Reactor):
    first = step(Tracked)
    nested = compose(ShowChild, wait_for=["first"])


class ShowApproval(serializers.Serializer):
    approved = serializers.BooleanField()


class ShowWait(Reactor):
    first = step(Tracked)
    approval = interrupt(
        after="first",
        payload=ShowApproval,
        correlation_id=lambda run: "show-corr-1",
        timeout=3600,
        max_attempts=3,
    )


def show(*args: Any, **options: Any) -> str:
    out = StringIO()
    call_command("reactor_show", *args, stdout=out, no_color=True, **options)
    return out.getvalue()


def test_completed_run_steps_and_trace_with_secrets_redacted() -> None:
    outcome = ShowSecret.run({"account": "acc-9", "amount": 7, "pin": "s3cret-pin"})
    text = show(str(outcome.execution_id))
    assert f"execution {outcome.execution_id}" in text
    assert "status: completed" in text
    assert "debit" in text
    assert "credit" in text
    assert "notify" in text
    steps = read_table(section(text, "steps:"))
    assert [row["STEP"] for row in steps] == ["debit", "credit", "notify"]
    assert {(row["STATUS"], row["ATTEMPTS"], row["ROLLBACK"]) for row in steps} == {
        ("completed", "1", "-")
    }
    assert json.loads(steps[0]["RESULT"]) == {"account": "acc-9", "amount": 7}
    assert all(row["DURATION"].endswith(" ms") for row in steps)
    assert "trace:" in text
    assert "run started" in text
    assert "run completed" in text
    assert "s3cret-pin" not in text
    assert "[REDACTED]" in text
    assert "trace:" not in show(str(outcome.execution_id), no_trace=True)


def test_json_output_redacts_secrets() -> None:
    outcome = ShowSecret.run({"account": "acc-9", "amount": 7, "pin": "s3cret-pin"})
    raw = show(str(outcome.execution_id), json=True)
    assert "s3cret-pin" not in raw
    data = json.loads(raw)
    assert data["status"] == "completed"
    assert data["inputs"]["pin"] == "[REDACTED]"
    assert [s["name"] for s in data["steps"]] == ["debit", "credit", "notify"]
    assert data["steps"][0]["arguments"]["pin"] == "[REDACTED]"
    assert data["trace"][0]["kind"] == "start"
    assert data["value"]["amount"] == 7
    assert "trace" not in json.loads(show(str(outcome.execution_id), json=True, no_trace=True))


def test_failed_run_shows_the_failure_and_its_traceback() -> None:
    FAIL_AT.add("credit")
    outcome = Transfer.run({"account": "a", "amount": 1, "pin": "p"})
    text = show(str(outcome.execution_id))
    assert "status: failed" in text
    assert "  kind: step\n" in text
    assert "step: credit" in text
    assert "  exception: RuntimeError\n" in text
    assert "message: credit exploded" in text
    assert "traceback:" in text
    assert "Traceback" in text
    steps = {row["STEP"]: row for row in read_table(section(text, "steps:"))}
    assert (steps["debit"]["STATUS"], steps["debit"]["ROLLBACK"]) == ("completed", "undone")
    assert steps["credit"]["STATUS"] == "failed"
    assert section(text, "step errors:") == [
        "credit: step 'credit' failed (RuntimeError): credit exploded"
    ]
    data = json.loads(show(str(outcome.execution_id), json=True))
    assert data["failure"]["step"] == "credit"
    assert data["failure"]["traceback"]


def test_rollback_failures_are_listed() -> None:
    FAIL_AT.update({"second", "undo"})
    outcome = Fragile.run({})
    text = show(str(outcome.execution_id))
    assert "status: needs_attention" in text
    assert "rollback failures" in text
    assert "could not undo first: the refund service is down" in text


def test_paused_run_lists_its_interrupts() -> None:
    outcome = ShowWait.run({})
    assert isinstance(outcome, Paused)
    text = show(str(outcome.execution_id))
    assert "waiting at:" in text
    assert "approval (correlation id show-corr-1, expires " in text
    assert "invalid payloads 0 of 3" in text
    assert "reactor_resume" in text
    data = json.loads(show(str(outcome.execution_id), json=True))
    assert data["interrupts"][0]["step"] == "approval"
    assert data["interrupts"][0]["correlation_id"] == "show-corr-1"
    assert data["interrupts"][0]["expires_at"]
    assert data["interrupts"][0]["invalid_attempts"] == 0


def test_children_and_parent() -> None:
    outcome = ShowParent.run({})
    data = json.loads(show(str(outcome.execution_id), json=True))
    assert data["status"] == "completed"
    (child,) = data["children"]
    assert child["step"] == "nested"
    assert child["status"] == "completed"
    (listed,) = read_table(section(show(str(outcome.execution_id)), "children:"))
    assert listed == {
        "STEP": "nested",
        "ID": child["id"],
        "STATUS": "completed",
        "KIND": "composed",
    }
    child_data = json.loads(show(child["id"], json=True))
    assert child_data["parent_id"] == str(outcome.execution_id)
    assert f"parent: {outcome.execution_id}" in show(child["id"])


@pytest.mark.parametrize(
    ("execution_id", "message"),
    [
        ("0f3e2b1c-9a8d-4c7b-8e6f-5d4c3b2a1908", "no execution with id"),
        ("not-a-uuid", "is not an execution id"),
    ],
)
def test_unknown_and_malformed_ids(execution_id: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        show(execution_id)


def test_a_map_step_is_shown_as_its_summary() -> None:
    from tests.integration.test_maps import Tolerant

    FAIL_AT.update({"item-2", "item-4"})
    outcome = Tolerant.run({"items": [1, 2, 3, 4, 5]})
    text = show(str(outcome.execution_id), no_trace=True)
    assert "map lines (settled): 5 elements: 3 succeeded, 2 failed" in text
    assert "element 1 failed: card declined for 2" in text
    data = json.loads(show(str(outcome.execution_id), json=True, no_trace=True))
    (summary,) = data["maps"]
    assert (summary["succeeded"], summary["failed"]) == (3, 2)
