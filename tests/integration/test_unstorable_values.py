"""Values PostgreSQL cannot store are answered with a failure or a clear error, never a raw
database exception or a run left ``running``."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import Halt, Reactor, Step, interrupt, services, step
from django_reactor.engine.outcomes import ErrorKind
from django_reactor.engine.serialization import MAX_DEPTH
from django_reactor.exceptions import InvalidPayload, ReactorError
from django_reactor.models import Execution, StepRecord
from django_reactor.states import ExecutionStatus, StepStatus
from tests.helpers import nested
from tests.integration.reactors import Tracked, ledger

pytestmark = pytest.mark.django_db


def cyclic() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


BAD_VALUES = {
    "nul": "a\x00b",
    "nul key": {"k\x00": 1},
    "surrogate": "\udc00",
    "surrogate key": {"\ud83d": 1},
    "too deep": nested(MAX_DEPTH + 5),
    "deeper than Python's recursion limit": nested(5000),
    "cyclic": cyclic(),
    "huge integer": 10**5000,
}


class Untyped(Reactor):
    """No Inputs serializer: whatever the caller passes must be stored as it is."""

    only = step(Tracked)


RETURNED: dict[str, Any] = {}


class ReturnsWhatItIsTold(Step):
    def run(self) -> Any:
        ledger("run", self.context.step)
        return RETURNED["value"]


class Returning(Reactor):
    give = step(ReturnsWhatItIsTold)
    after = step(Tracked, wait_for=["give"])


@pytest.mark.parametrize("name", BAD_VALUES)
def test_unstorable_inputs_fail_the_run_as_invalid_inputs(name: str) -> None:
    outcome = Untyped.run({"value": BAD_VALUES[name]})
    assert not outcome.ok
    assert outcome.error.kind == ErrorKind.INPUT_VALIDATION
    assert "cannot be stored" in outcome.error.message
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.FAILED
    assert ledger.calls == []


@pytest.mark.parametrize("name", BAD_VALUES)
def test_an_unstorable_step_result_fails_the_step_once(name: str) -> None:
    RETURNED["value"] = {"value": BAD_VALUES[name]}
    outcome = Returning.run({})
    assert outcome.error.kind == ErrorKind.RESULT
    assert outcome.error.step == "give"
    row = Execution.objects.get(pk=outcome.execution_id)
    assert (row.status, row.lease_owner) == (ExecutionStatus.FAILED, None)
    record = StepRecord.objects.get(execution=row, step="give")
    assert record.status == StepStatus.FAILED
    assert ledger.calls == [("run", "give")]
    assert [e.kind for e in services.find(row.id).trace][-1] == "fail"


@pytest.mark.postgres  # MariaDB's JSON columns refuse nesting past 32 levels (docs: MariaDB)
def test_the_deepest_storable_value_is_stored_by_postgresql() -> None:
    RETURNED["value"] = {"deep": nested(MAX_DEPTH - 1)}
    outcome = Returning.run({})
    assert outcome.ok
    record = StepRecord.objects.get(execution_id=outcome.execution_id, step="give")
    assert services.find(outcome.execution_id).steps[0].result == {"deep": nested(MAX_DEPTH - 1)}
    assert record.status == StepStatus.COMPLETED


class RaisesText(Step):
    def run(self) -> Any:
        raise ValueError("gateway said \x00 and \udc00")


class Raising(Reactor):
    boom = step(RaisesText)


def test_an_exception_message_the_database_cannot_store_is_escaped() -> None:
    outcome = Raising.run({})
    assert outcome.error.kind == ErrorKind.STEP
    assert outcome.error.message == "gateway said \\x00 and \\udc00"
    stored = Execution.objects.get(pk=outcome.execution_id)
    assert stored.status == ExecutionStatus.FAILED
    assert stored.failure["message"] == "gateway said \\x00 and \\udc00"


class HaltsStrangely(Step):
    def run(self) -> Any:
        return Halt({"why": "\udc00", "loop": cyclic()})


class Halting(Reactor):
    stop = step(HaltsStrangely)


def test_an_unstorable_halt_reason_is_shown_not_refused() -> None:
    outcome = Halting.run({})
    assert outcome.status == ExecutionStatus.HALTED
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.HALTED
    assert "\\udc00" in str(row.result["reason"])


@pytest.mark.parametrize("key", ["k\x00", "\udc00", "", "x" * 256, 7])
def test_an_unstorable_idempotency_key_is_refused_before_anything_is_written(key: Any) -> None:
    with pytest.raises(ReactorError, match="idempotency_key must be"):
        Untyped.run({}, idempotency_key=key)
    assert not Execution.objects.exists()


@pytest.mark.parametrize("reason", ["\udc00", "stop\x00", 42])
def test_an_unstorable_cancel_reason_is_refused_and_nothing_changes(reason: Any) -> None:
    outcome = Paused.run({})
    with pytest.raises(ReactorError, match="cannot cancel with the reason"):
        services.cancel(outcome.execution_id, reason=reason)
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.PAUSED


class Approval(serializers.Serializer):
    note = serializers.JSONField()


class Paused(Reactor):
    first = step(Tracked)
    approval = interrupt(after=["first"], payload=Approval)
    last = step(Tracked, wait_for=["approval"])


@pytest.mark.parametrize("name", BAD_VALUES)
def test_an_unstorable_payload_is_an_invalid_payload_and_the_run_stays_paused(name: str) -> None:
    outcome = Paused.run({})
    with pytest.raises(InvalidPayload, match="the run stays paused"):
        services.resume_interrupt(
            outcome.execution_id, step="approval", payload={"note": BAD_VALUES[name]}
        )
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.PAUSED
    done = services.resume_interrupt(
        outcome.execution_id, step="approval", payload={"note": "ok"}, background=False
    )
    assert done.ok


class Correlated(Reactor):
    first = step(Tracked)
    approval = interrupt(after=["first"], correlation_id=lambda scope: "order\x00")


def test_an_unstorable_correlation_id_fails_the_run_clearly() -> None:
    outcome = Correlated.run({})
    assert outcome.error.kind == ErrorKind.CORRELATION
    assert "cannot store" in outcome.error.message
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.FAILED


class ReturningInBackground(Reactor):
    give = step(ReturnsWhatItIsTold)

    class Meta:
        background = "all"


@pytest.mark.parametrize("name", ["surrogate", "nul key", "cyclic", "huge integer"])
def test_on_a_worker_an_unstorable_result_fails_the_run_instead_of_looping(name: str) -> None:
    RETURNED["value"] = [BAD_VALUES[name]]
    outcome = ReturningInBackground.run({})
    result = services.resume(outcome.execution_id)
    assert result is not None
    assert result.error.kind == ErrorKind.RESULT
    row = Execution.objects.get(pk=outcome.execution_id)
    assert (row.status, row.lease_owner, row.recovery_attempts) == (ExecutionStatus.FAILED, None, 0)
    assert services.resume(outcome.execution_id) is None
    assert ledger.calls == [("run", "give")]
