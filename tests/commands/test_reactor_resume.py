"""reactor_resume: delivering an interrupt's payload from the command line."""

from __future__ import annotations

import json
import uuid
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework import serializers

from django_reactor import Paused, Reactor, arg, interrupt, services, step
from django_reactor.models import Dispatch, Execution
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import FAIL_AT, Tracked, ledger

pytestmark = pytest.mark.django_db(transaction=True)


class Approval(serializers.Serializer):
    approved = serializers.BooleanField()
    note = serializers.CharField(max_length=20, required=False, default="")


class CommandRefund(Reactor):
    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    request = step(Tracked, order=arg.input("order"))
    approval = interrupt(
        after=["request"],
        payload=Approval,
        correlation_id=lambda run: f"cmd-refund-{run.inputs['order']}",
        max_attempts=2,
    )
    refund = step(
        Tracked, approved=arg.result("approval", "approved"), note=arg.result("approval", "note")
    )

    class Meta:
        returns = "refund"


class CommandTwoApprovals(Reactor):
    request = step(Tracked)
    finance = interrupt(after="request", payload=Approval, timeout=3600)
    legal = interrupt(after="request", payload=Approval, timeout=3600)
    pay = step(Tracked, wait_for=["finance", "legal"])


class CommandNoPause(Reactor):
    only = step(Tracked)


def resume(*args: Any, **options: Any) -> str:
    out = StringIO()
    call_command("reactor_resume", *args, stdout=out, no_color=True, **options)
    return out.getvalue()


def paused(order: str = "A1") -> Paused:
    outcome = CommandRefund.run({"order": order})
    assert isinstance(outcome, Paused)
    return outcome


def status(execution_id: Any) -> str:
    return Execution.objects.get(pk=execution_id).status


def test_resume_inline_by_execution_id_completes_the_run() -> None:
    run = paused()
    text = resume(str(run.execution_id), payload='{"approved": true}')
    assert f"execution {run.execution_id}: completed" in text
    assert 'value: {"step": "refund", "approved": true, "note": ""}' in text
    assert status(run.execution_id) == ExecutionStatus.COMPLETED
    assert ledger.calls == [("run", "request"), ("run", "refund")]


def test_resume_by_correlation_id_with_the_reactor_named_by_its_class() -> None:
    run = paused("B2")
    text = resume(
        correlation_id="cmd-refund-B2", reactor="CommandRefund", payload='{"approved": false}'
    )
    assert f"execution {run.execution_id}: completed" in text
    assert services.find(run.execution_id).step_result("refund")["approved"] is False


def test_key_value_pairs_build_the_payload_and_values_parse_as_json() -> None:
    run = paused()
    # Options between the id and the pairs, as one types them on a command line.
    text = resume(str(run.execution_id), "--step", "approval", "approved=true", "note=hello")
    assert "completed" in text
    assert services.find(run.execution_id).step_result("approval") == {
        "approved": True,
        "note": "hello",
    }


def test_key_value_pairs_with_a_correlation_id_and_no_execution_id() -> None:
    run = paused("C3")
    resume("approved=false", "note=42", correlation_id="cmd-refund-C3")
    # note=42 parses as the number 42; the serializer's CharField takes it as "42".
    assert services.find(run.execution_id).step_result("approval") == {
        "approved": False,
        "note": "42",
    }


def test_background_hands_the_rest_to_a_worker() -> None:
    run = paused()
    text = resume(str(run.execution_id), "--background", payload='{"approved": true}')
    assert f"execution {run.execution_id}: pending" in text
    assert "a worker runs the rest" in text
    assert status(run.execution_id) == ExecutionStatus.PENDING
    assert Dispatch.objects.filter(execution_id=run.execution_id, reason="resume").count() == 1
    assert ledger.calls == [("run", "request")]


def test_an_invalid_payload_names_the_field_and_the_attempts_left() -> None:
    run = paused()
    with pytest.raises(CommandError) as first:
        resume(str(run.execution_id), "approved=perhaps")
    message = str(first.value)
    assert "approved: Must be a valid boolean." in message
    assert "Invalid attempts: 1 of 2 allowed." in message
    assert "still paused" in message
    assert status(run.execution_id) == ExecutionStatus.PAUSED

    with pytest.raises(CommandError) as last:
        resume(str(run.execution_id), payload='{"note": "' + "x" * 30 + '"}')
    message = str(last.value)
    assert "approved: This field is required." in message
    assert "note: Ensure this field has no more than 20 characters." in message
    assert "Invalid attempts: 2 of 2 allowed." in message
    assert "the run was undone and failed" in message
    assert status(run.execution_id) == ExecutionStatus.FAILED


def test_a_second_delivery_is_refused() -> None:
    run = paused()
    resume(str(run.execution_id), "approved=true")
    with pytest.raises(CommandError, match="already accepted a payload"):
        resume(str(run.execution_id), "approved=false")


def test_a_closed_interrupt_says_why() -> None:
    run = paused()
    services.cancel(run.execution_id)
    with pytest.raises(CommandError, match=r"reason: cancelled"):
        resume(str(run.execution_id), "approved=true")


def test_unknown_or_malformed_ids_and_correlation_ids_are_refused() -> None:
    missing = uuid.uuid4()
    with pytest.raises(CommandError, match=f"no execution with id {missing}"):
        resume(str(missing), "approved=true")
    with pytest.raises(CommandError, match="is not an execution id"):
        resume("not-a-uuid", "approved=true")
    with pytest.raises(CommandError, match="no run waits under correlation id 'cmd-refund-x'"):
        resume(correlation_id="cmd-refund-x", payload="{}")
    with pytest.raises(CommandError, match="no reactor of that name"):
        resume(correlation_id="cmd-refund-x", reactor="Nonexistent", payload="{}")


def test_a_finished_run_that_never_paused_takes_no_payload() -> None:
    done = CommandNoPause.run({})
    with pytest.raises(CommandError, match="did not stop at an interrupt; it takes no payload"):
        resume(str(done.execution_id), "approved=true")


def test_payload_mistakes_are_refused_before_anything_is_delivered() -> None:
    run = paused()
    key = str(run.execution_id)
    with pytest.raises(CommandError, match="--payload is not valid JSON"):
        resume(key, payload="{approved: true}")
    with pytest.raises(CommandError, match=r"must be a JSON object .* got an array"):
        resume(key, payload="[1, 2]")
    with pytest.raises(CommandError, match="give the payload one way"):
        resume(key, "approved=true", payload='{"approved": true}')
    with pytest.raises(CommandError, match="no payload given"):
        resume(key)
    with pytest.raises(CommandError, match="'approved' is not a key=value pair"):
        resume(key, "note=x", "approved")
    with pytest.raises(CommandError, match="given twice"):
        resume(key, "approved=true", "approved=false")
    with pytest.raises(CommandError, match="cannot read the payload file"):
        resume(key, payload_file="/nonexistent/payload.json")
    with pytest.raises(CommandError, match="name the run to resume"):
        resume(payload="{}")
    with pytest.raises(CommandError, match="not both"):
        resume(key, correlation_id="cmd-refund-A1", payload="{}")
    with pytest.raises(CommandError, match="--reactor only narrows"):
        resume(key, reactor="CommandRefund", payload="{}")
    assert status(run.execution_id) == ExecutionStatus.PAUSED
    assert Execution.objects.get(pk=run.execution_id).interrupts.get().invalid_attempts == 0


def test_payload_from_a_file_and_from_standard_input(tmp_path: Path) -> None:
    first, second = paused("F1"), paused("F2")
    path = tmp_path / "payload.json"
    path.write_text('{"approved": true, "note": "from a file"}')
    resume(str(first.execution_id), payload_file=str(path))
    resume(str(second.execution_id), payload_file="-", stdin=StringIO('{"approved": false}'))
    assert services.find(first.execution_id).step_result("approval")["note"] == "from a file"
    assert services.find(second.execution_id).step_result("approval")["approved"] is False


def test_json_output_parses_and_lists_the_interrupts_still_waiting() -> None:
    run = CommandTwoApprovals.run({})
    assert isinstance(run, Paused)
    data = json.loads(resume(str(run.execution_id), "--step", "legal", "approved=true", "--json"))
    assert data["execution_id"] == str(run.execution_id)
    assert data["status"] == "paused"
    [waiting] = data["interrupts"]
    assert waiting["step"] == "finance"
    assert waiting["expires_at"].startswith(str(run.interrupts[0].expires_at.year))

    data = json.loads(
        resume(str(run.execution_id), step="finance", payload='{"approved": true}', json=True)
    )
    assert data["status"] == "completed"
    assert data["value"]["finance"] == {"approved": True, "note": ""}


def test_json_output_of_a_completed_run() -> None:
    run = paused()
    data = json.loads(resume(str(run.execution_id), "approved=true", json=True))
    assert data == {
        "execution_id": str(run.execution_id),
        "status": "completed",
        "idempotent_replay": False,
        "value": {"step": "refund", "approved": True, "note": ""},
    }


def test_the_human_summary_of_a_paused_run_lists_the_interrupts() -> None:
    run = CommandTwoApprovals.run({})
    text = resume(str(run.execution_id), "--step", "finance", "approved=true")
    assert f"execution {run.execution_id}: paused" in text
    assert "legal (expires " in text
    assert "--step STEP" in text


def test_a_failed_run_after_the_delivery_is_reported() -> None:
    run = paused()
    FAIL_AT.add("refund")
    data = json.loads(resume(str(run.execution_id), "approved=true", json=True))
    assert data["status"] == "failed"
    assert data["error"]["step"] == "refund"


def test_an_idempotency_key_makes_the_delivery_safe_to_repeat() -> None:
    run = paused()
    key = str(run.execution_id)
    resume(key, "approved=true", idempotency_key="mail-1")
    again = resume(key, "approved=true", idempotency_key="mail-1")
    assert "completed" in again
    assert "this idempotency key was used before" in again
    with pytest.raises(
        CommandError, match=r"first used with another payload.*new --idempotency-key"
    ):
        resume(key, "approved=false", idempotency_key="mail-1")
    assert ledger.calls == [("run", "request"), ("run", "refund")]
