"""Running reactors against the database: checkpoints, the stored trace, inputs and errors."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from django_reactor import services, store
from django_reactor.engine.serialization import decode
from django_reactor.exceptions import (
    ExecutionNotFound,
    ReactorError,
    TransactionActive,
)
from django_reactor.models import Execution, StepRecord
from django_reactor.states import ExecutionStatus, RollbackStatus, StepStatus
from tests.integration.reactors import FAIL_AT, Fragile, Transfer, ledger

pytestmark = pytest.mark.django_db

INPUTS = {"account": "acc-1", "amount": 25, "pin": "1234"}


def pairs(execution_id: object) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace]  # type: ignore[arg-type]


def test_completed_run_is_checkpointed_step_by_step() -> None:
    outcome = Transfer.run(INPUTS)
    assert outcome.ok
    assert outcome.value == {"step": "credit", "amount": 25}
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED
    assert row.reactor == "tests.integration.reactors.Transfer"
    assert row.definition_hash == Transfer.definition.definition_hash
    assert row.lease_owner is None
    assert row.finished_at is not None
    records = list(StepRecord.objects.filter(execution=row).order_by("seq"))
    assert [(r.step, r.status, r.attempts) for r in records] == [
        ("debit", StepStatus.COMPLETED, 1),
        ("credit", StepStatus.COMPLETED, 1),
        ("notify", StepStatus.COMPLETED, 1),
    ]
    assert pairs(row.id) == [
        ("start", ""),
        ("run", "debit"),
        ("run", "credit"),
        ("run", "notify"),
        ("complete", ""),
    ]
    seqs = [e.seq for e in store.event_rows(row.pk)]
    assert seqs == list(range(1, len(seqs) + 1))


def test_failed_run_rolls_back_and_records_everything() -> None:
    FAIL_AT.add("notify")
    outcome = Transfer.run(INPUTS)
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.step == "notify"
    assert outcome.error.exception_class == "RuntimeError"
    assert outcome.error.message == "notify exploded"
    assert "Traceback (most recent call last)" in outcome.error.traceback
    assert ledger.calls == [
        ("run", "debit"),
        ("run", "credit"),
        ("run", "notify"),
        ("compensate", "notify"),
        ("undo", "credit"),
        ("undo", "debit"),
    ]
    assert pairs(outcome.execution_id) == [
        ("start", ""),
        ("run", "debit"),
        ("run", "credit"),
        ("fail", "notify"),
        ("compensate", "notify"),
        ("undo", "credit"),
        ("undo", "debit"),
        ("fail", ""),
    ]
    handle = Transfer.find(outcome.execution_id)
    assert handle.status == ExecutionStatus.FAILED
    assert handle.step("debit").rollback == RollbackStatus.UNDONE
    assert handle.step("notify").rollback == RollbackStatus.COMPENSATED
    assert handle.error is not None
    assert handle.error.step == "notify"
    assert handle.outcome == outcome


def test_secrets_are_redacted_on_display_and_kept_for_the_steps() -> None:
    outcome = Transfer.run(INPUTS)
    handle = services.find(outcome.execution_id)
    assert handle.inputs == {"account": "acc-1", "amount": 25, "pin": "[REDACTED]"}
    assert handle.step("debit").arguments["pin"] == "[REDACTED]"
    row = Execution.objects.get(pk=outcome.execution_id)
    # Stored sealed (tests/integration/test_secrets_at_rest.py reads the raw columns), opened
    # where the run reads them back.
    assert decode(row.inputs["pin"]) == "1234"
    record = StepRecord.objects.get(execution=row, step="debit")
    assert decode(record.arguments["pin"]) == "1234"
    assert "1234" not in json.dumps([row.inputs, record.arguments])


def test_invalid_inputs_fail_with_field_errors_and_run_nothing() -> None:
    outcome = Transfer.run({"account": "acc-1", "amount": 0, "pin": "9999"})
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.kind == "input_validation"
    assert outcome.error.field_errors == {
        "amount": ["Ensure this value is greater than or equal to 1."]
    }
    assert "amount: Ensure this value is greater than or equal to 1." in outcome.error.message
    assert ledger.calls == []
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.FAILED
    assert row.inputs["pin"] == "[REDACTED]"  # nothing to keep: the run can never proceed
    assert not StepRecord.objects.filter(execution=row).exists()


def test_missing_inputs_are_field_errors() -> None:
    outcome = Transfer.run({})
    assert set(outcome.error.field_errors) == {"account", "amount", "pin"}


def test_inputs_must_be_a_mapping_and_keys_strings() -> None:
    with pytest.raises(ReactorError, match="takes the inputs as a dict, got list"):
        Transfer.run([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ReactorError, match="idempotency_key must be a non-empty string"):
        Transfer.run(INPUTS, idempotency_key="")


def test_unknown_and_malformed_execution_ids() -> None:
    with pytest.raises(ExecutionNotFound, match="no execution with id 00000000"):
        services.find("00000000-0000-0000-0000-000000000000")
    with pytest.raises(ExecutionNotFound, match="'nope' is not an execution id"):
        services.find("nope")


def test_find_refuses_another_reactors_execution() -> None:
    outcome = Transfer.run(INPUTS)
    with pytest.raises(ExecutionNotFound, match=r"is a run of tests\.integration\.reactors\."):
        Fragile.find(outcome.execution_id)


def test_run_refuses_to_start_inside_a_transaction() -> None:
    with transaction.atomic(), pytest.raises(TransactionActive, match=r"transaction\.on_commit"):
        Transfer.run(INPUTS)
    assert ledger.calls == []
    assert not Execution.objects.exists()


def test_the_setting_can_allow_runs_inside_transactions(settings: object) -> None:
    settings.REACTOR = {"REFUSE_INLINE_IN_TRANSACTION": False}  # type: ignore[attr-defined]
    with transaction.atomic():
        assert Transfer.run(INPUTS).ok


@pytest.mark.django_db
def test_inputs_with_a_nul_character_fail_validation_and_are_recorded() -> None:
    from django_reactor import Failed, Reactor, step

    class Echo(Reactor):
        @step
        def echo() -> str:
            return "ok"

    outcome = Echo.run({"note": "a\x00b"})
    assert isinstance(outcome, Failed)
    assert outcome.error.kind == "input_validation"
    assert "NUL character" in outcome.error.message
