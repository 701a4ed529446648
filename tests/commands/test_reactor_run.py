"""reactor_run: starting a run from the command line."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_reactor import Reactor, arg, services, step
from django_reactor.models import Dispatch, Execution
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import FAIL_AT, Tracked, ledger

pytestmark = pytest.mark.django_db(transaction=True)

TRANSFER = "tests.integration.reactors.Transfer"


class CommandRunNoInputs(Reactor):
    only = step(Tracked)
    second = step(Tracked, size=arg.result("only", "step"))


def run(*args: Any, **options: Any) -> str:
    out = StringIO()
    call_command("reactor_run", *args, stdout=out, no_color=True, **options)
    return out.getvalue()


def test_inline_run_from_key_value_pairs_prints_the_value() -> None:
    text = run(TRANSFER, "account=acc-1", "amount=5", "pin=1234")
    row = Execution.objects.get()
    assert f"execution {row.id}: completed" in text
    assert '"amount": 5' in text
    assert row.status == ExecutionStatus.COMPLETED
    assert ledger.calls == [("run", "debit"), ("run", "credit"), ("run", "notify")]


def test_inputs_as_json_and_json_output() -> None:
    text = run(TRANSFER, inputs='{"account": "a", "amount": 3, "pin": "0000"}', json=True)
    data = json.loads(text)
    assert data["status"] == "completed"
    assert data["value"]["amount"] == 3
    assert str(Execution.objects.get().id) == data["execution_id"]


def test_inputs_file_and_standard_input(tmp_path: Path) -> None:
    path = tmp_path / "inputs.json"
    path.write_text('{"account": "a", "amount": 2, "pin": "1"}', encoding="utf-8")
    assert "completed" in run(TRANSFER, inputs_file=str(path))
    stdin = StringIO('{"account": "b", "amount": 4, "pin": "1"}')
    assert "completed" in run(TRANSFER, inputs_file="-", stdin=stdin)
    assert Execution.objects.filter(status="completed").count() == 2


def test_unique_class_name_and_no_inputs() -> None:
    text = run("CommandRunNoInputs")
    assert "completed" in text


def test_a_failed_run_prints_the_error_and_exits_1() -> None:
    FAIL_AT.add("credit")
    out = StringIO()
    with pytest.raises(CommandError) as failure:
        call_command(
            "reactor_run", TRANSFER, "account=a", "amount=5", "pin=1", stdout=out, no_color=True
        )
    assert failure.value.returncode == 1
    assert "the run of Transfer ended failed" in str(failure.value)
    assert "--exit-zero" in str(failure.value)
    assert ": failed" in out.getvalue()
    assert "credit exploded" in out.getvalue()


def test_exit_zero_keeps_a_failed_run_a_success_for_the_shell() -> None:
    FAIL_AT.add("credit")
    text = run(TRANSFER, "account=a", "amount=5", "pin=1", exit_zero=True)
    assert ": failed" in text


def test_invalid_inputs_are_a_failed_run_with_field_errors() -> None:
    data = json.loads(run(TRANSFER, "account=a", "amount=0", "pin=1", json=True, exit_zero=True))
    assert data["status"] == "failed"
    assert data["error"]["kind"] == "input_validation"
    assert "amount" in data["error"]["field_errors"]
    # The secret is redacted in the recorded inputs.
    assert data["error"]["inputs"]["pin"] == "[REDACTED]"


def test_background_creates_a_pending_run_with_its_dispatch() -> None:
    data = json.loads(run(TRANSFER, "account=a", "amount=5", "pin=1", background=True, json=True))
    assert data["status"] == "pending"
    row = Execution.objects.get(pk=data["execution_id"])
    assert row.status == ExecutionStatus.PENDING
    assert Dispatch.objects.filter(execution_id=row.id, reason="start").count() == 1
    assert ledger.calls == []
    # What the worker's task does: the run completes from its first step.
    services.resume(row.id)
    row.refresh_from_db()
    assert row.status == ExecutionStatus.COMPLETED
    assert ledger.calls == [("run", "debit"), ("run", "credit"), ("run", "notify")]


def test_background_text_output() -> None:
    text = run(TRANSFER, "--background", "account=a", "amount=5", "pin=1")
    assert ": pending" in text
    assert "a worker runs the rest" in text


def test_idempotency_key_replays_and_refuses_other_inputs() -> None:
    first = json.loads(
        run(TRANSFER, "account=a", "amount=5", "pin=1", idempotency_key="k1", json=True)
    )
    again = json.loads(
        run(TRANSFER, "account=a", "amount=5", "pin=1", idempotency_key="k1", json=True)
    )
    assert again["execution_id"] == first["execution_id"]
    assert again["idempotent_replay"] is True
    assert "used before" in run(TRANSFER, "account=a", "amount=5", "pin=1", idempotency_key="k1")
    with pytest.raises(CommandError, match="new --idempotency-key"):
        run(TRANSFER, "account=a", "amount=6", "pin=1", idempotency_key="k1")
    assert Execution.objects.count() == 1


def test_background_idempotency_key_replays() -> None:
    first = json.loads(
        run(
            TRANSFER,
            "account=a",
            "amount=5",
            "pin=1",
            "--background",
            idempotency_key="bg",
            json=True,
        )
    )
    again = json.loads(
        run(
            TRANSFER,
            "account=a",
            "amount=5",
            "pin=1",
            "--background",
            idempotency_key="bg",
            json=True,
        )
    )
    assert again["execution_id"] == first["execution_id"]
    assert again["idempotent_replay"] is True
    with pytest.raises(CommandError, match="new --idempotency-key"):
        run(TRANSFER, "account=a", "amount=7", "pin=1", "--background", idempotency_key="bg")


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        (("NoSuchReactor",), {}, "no reactor of that name"),
        ((TRANSFER,), {"inputs": "{not json"}, "--inputs is not valid JSON"),
        ((TRANSFER,), {"inputs": "[1, 2]"}, "must be a JSON object"),
        ((TRANSFER, "amount"), {}, "is not a key=value pair"),
        ((TRANSFER, "a=1", "a=2"), {}, "given twice"),
        ((TRANSFER, "a=1"), {"inputs": "{}"}, "one way, not several"),
        ((TRANSFER,), {"inputs_file": "/nonexistent/inputs.json"}, "cannot read the file"),
        ((TRANSFER,), {"idempotency_key": "x" * 300}, "idempotency_key must be"),
    ],
)
def test_errors(args: tuple[str, ...], options: dict[str, Any], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run(*args, **options)
    assert Execution.objects.count() == 0


def test_ambiguous_class_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_reactor import registry

    known = registry.all_reactors()
    monkeypatch.setattr(
        registry,
        "all_reactors",
        lambda: {**known, "other.app.Transfer": known[TRANSFER], TRANSFER: known[TRANSFER]},
    )
    with pytest.raises(CommandError, match="matches several reactors"):
        run("Transfer")
