"""reactor_cancel, reactor_undo and reactor_retry: steering runs from the command line."""

from __future__ import annotations

import json
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_reactor import Paused, Reactor, compose, interrupt, step
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import FAIL_AT, Fragile, Tracked, Transfer, ledger

pytestmark = pytest.mark.django_db(transaction=True)

INPUTS = {"account": "a", "amount": 5, "pin": "1"}


class SteerWait(Reactor):
    first = step(Tracked)
    approval = interrupt(after="first")


class SteerChild(Reactor):
    inner = step(Tracked)


class SteerParent(Reactor):
    nested = compose(SteerChild)


def command(name: str, *args: Any, **options: Any) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(name, *args, stdout=out, stderr=err, no_color=True, **options)
    return out.getvalue(), err.getvalue()


def failing(name: str, *args: Any, **options: Any) -> tuple[str, str, str]:
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as caught:
        call_command(name, *args, stdout=out, stderr=err, no_color=True, **options)
    return out.getvalue(), err.getvalue(), str(caught.value)


def status(execution_id: Any) -> str:
    return Execution.objects.get(pk=execution_id).status


def completed() -> str:
    return str(Transfer.run(INPUTS).execution_id)


def failed() -> str:
    FAIL_AT.add("credit")
    outcome = Transfer.run(INPUTS)
    FAIL_AT.clear()
    assert outcome.status == "failed"
    return str(outcome.execution_id)


# ---------------------------------------------------------------------- cancel


def test_cancel_a_paused_run_with_a_reason() -> None:
    outcome = SteerWait.run({})
    assert isinstance(outcome, Paused)
    out, _ = command("reactor_cancel", str(outcome.execution_id), reason="customer left")
    assert f"execution {outcome.execution_id}: cancelled" in out
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.CANCELLED
    assert row.cancel_reason == "customer left"
    assert ("undo", "first") not in ledger.calls  # cancel rolls nothing back


def test_cancel_json_for_several_ids() -> None:
    ids = [str(SteerWait.run({}).execution_id) for _ in range(2)]
    out, _ = command("reactor_cancel", *ids, json=True)
    data = json.loads(out)
    assert [d["execution_id"] for d in data] == ids
    assert all(d["ok"] and d["status"] == "cancelled" for d in data)
    assert all(d["cancel_requested"] is False for d in data)


def test_cancel_a_completed_run_is_refused() -> None:
    run_id = completed()
    _, err, message = failing("reactor_cancel", run_id)
    assert f"cannot cancel execution {run_id}: it is completed" in err
    assert "1 of 1 execution(s) could not be cancelled" in message
    assert status(run_id) == ExecutionStatus.COMPLETED


def test_several_ids_with_one_bad_handles_the_others_and_fails_at_the_end() -> None:
    good = [str(SteerWait.run({}).execution_id) for _ in range(2)]
    missing = str(uuid.uuid4())
    out, err, message = failing("reactor_cancel", good[0], missing, "not-an-id", good[1])
    assert all(status(g) == ExecutionStatus.CANCELLED for g in good)
    assert f"execution {good[0]}: cancelled" in out
    assert f"execution {good[1]}: cancelled" in out
    assert f"no execution with id {missing}" in err
    assert "'not-an-id' is not an execution id" in err
    assert "2 of 4 execution(s) could not be cancelled" in message


def test_several_ids_json_reports_errors_per_id() -> None:
    good = str(SteerWait.run({}).execution_id)
    out, _, message = failing("reactor_cancel", good, "bad", json=True)
    data = json.loads(out)
    assert data[0] == {
        "execution_id": good,
        "ok": True,
        "status": "cancelled",
        "cancel_requested": False,
    }
    assert data[1]["ok"] is False
    assert "is not an execution id" in data[1]["error"]
    assert "see the JSON output" in message


def test_cancel_a_composed_child_is_refused() -> None:
    parent = SteerParent.run({})
    child = Execution.objects.get(parent_id=parent.execution_id)
    _, err, _ = failing("reactor_cancel", str(child.id))
    assert "composed child" in err


# ---------------------------------------------------------------------- undo


def test_undo_a_completed_run() -> None:
    run_id = completed()
    ledger.clear()
    out, _ = command("reactor_undo", run_id)
    assert f"execution {run_id}: cancelled" in out
    assert status(run_id) == ExecutionStatus.CANCELLED
    assert ledger.calls == [("undo", "notify"), ("undo", "credit"), ("undo", "debit")]


def test_undo_json_reports_rollback_failures() -> None:
    FAIL_AT.update({"second", "undo"})
    run_id = str(Fragile.run({}).execution_id)
    assert status(run_id) == ExecutionStatus.NEEDS_ATTENTION
    out, _ = command("reactor_undo", run_id, json=True)
    (data,) = json.loads(out)
    assert data["ok"] is True
    assert data["status"] == ExecutionStatus.NEEDS_ATTENTION
    assert data["rollback_failures"][0]["step"] == "first"
    text, _ = command("reactor_undo", run_id)
    assert "could not undo first" in text
    FAIL_AT.clear()
    text, _ = command("reactor_undo", run_id)
    assert "failed" in text
    assert status(run_id) == ExecutionStatus.FAILED


def test_undo_a_failed_run_is_refused() -> None:
    run_id = failed()
    _, err, message = failing("reactor_undo", run_id)
    assert f"cannot undo execution {run_id}: it is failed" in err
    assert "could not be undone" in message


# ---------------------------------------------------------------------- retry


def test_retry_a_failed_run() -> None:
    run_id = failed()
    ledger.clear()
    out, _ = command("reactor_retry", run_id)
    retried = Execution.objects.get(retry_of_id=run_id)
    assert f"execution {run_id}: retried as {retried.id}: completed" in out
    assert "value:" in out
    assert retried.status == ExecutionStatus.COMPLETED


def test_a_retry_that_fails_again_exits_1_unless_exit_zero() -> None:
    run_id = failed()
    FAIL_AT.add("credit")  # it fails the same way again
    out, _, message = failing("reactor_retry", run_id)
    assert ": failed" in out
    assert "1 of 1 retried run(s) failed" in message
    assert "--exit-zero" in message
    again = str(Execution.objects.get(retry_of_id=run_id).id)
    out, _ = command("reactor_retry", again, exit_zero=True)
    assert f"execution {again}: retried as " in out


def test_a_run_is_named_by_the_short_id_the_admin_shows() -> None:
    run_id = str(SteerWait.run({}).execution_id)
    out, _ = command("reactor_cancel", run_id[:8])
    assert f"execution {run_id}: cancelled" in out
    text = StringIO()
    call_command("reactor_show", run_id[:13], stdout=text, no_color=True)  # dash included
    assert run_id in text.getvalue()


def test_a_short_id_that_names_no_run_or_several_is_refused_with_what_to_do() -> None:
    base = uuid.UUID(str(SteerWait.run({}).execution_id)).hex[:8]
    twins = [uuid.UUID(base + suffix * 24) for suffix in ("1", "2")]
    for twin in twins:
        Execution.objects.create(id=twin, reactor="tests.SteerWait", status="completed")
    _, err, message = failing("reactor_cancel", base)
    assert "1 of 1 execution(s) could not be cancelled" in message
    assert f"'{base}' could be any of several runs" in err
    assert str(twins[0]) in err
    assert "give more of the id" in err
    _, err, _ = failing("reactor_cancel", "0123abcd")
    assert "no execution id starts with '0123abcd'" in err
    _, err, _ = failing("reactor_cancel", "abc")
    assert "or its first 8 or more characters" in err
    with pytest.raises(CommandError, match="could be any of several runs"):
        call_command("reactor_show", base, stdout=StringIO())


def test_retry_json() -> None:
    run_id = failed()
    out, _ = command("reactor_retry", run_id, json=True)
    (data,) = json.loads(out)
    assert data["ok"] is True
    assert data["execution_id"] == run_id
    assert data["retry"]["status"] == "completed"
    assert Execution.objects.get(pk=data["retry"]["execution_id"]).retry_of_id == uuid.UUID(run_id)


def test_retry_a_completed_run_or_twice_is_refused() -> None:
    run_id = completed()
    _, err, message = failing("reactor_retry", run_id)
    assert "only failed runs are retried" in err
    assert "could not be retried" in message
    failed_id = failed()
    command("reactor_retry", failed_id)
    _, err, _ = failing("reactor_retry", failed_id)
    assert "was already retried as" in err


def test_retry_of_invalid_inputs_is_refused() -> None:
    outcome = Transfer.run({"account": "a", "amount": 0, "pin": "1"})
    _, err, _ = failing("reactor_retry", str(outcome.execution_id))
    assert "its inputs were invalid" in err


def test_an_id_is_required() -> None:
    with pytest.raises(CommandError, match="execution_id"):
        command("reactor_undo")


def test_reactor_wake_says_which_runs_could_not_be_woken() -> None:
    done = completed()
    _, err, message = failing("reactor_wake", done)
    assert f"cannot wake execution {done}: " in err
    assert "1 of 1 execution(s) could not be woken; see the messages above" in message
    assert status(done) == ExecutionStatus.COMPLETED


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("reactor_cancel", "could not be cancelled"),
        ("reactor_undo", "could not be undone"),
        ("reactor_retry", "could not be retried"),
        ("reactor_wake", "could not be woken"),
    ],
)
def test_every_steering_command_words_its_refusals(name: str, words: str) -> None:
    missing = str(uuid.uuid4())
    _, _, message = failing(name, missing, json=True)
    assert message == f"1 of 1 execution(s) {words}; see the JSON output"
