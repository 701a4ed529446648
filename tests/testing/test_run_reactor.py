"""run_reactor, ReactorResult and its assertions."""

from __future__ import annotations

import pytest

from django_reactor import Completed, Dispatched, Failed, Paused
from django_reactor.testing import run_reactor
from tests.integration.reactors import FAIL_AT, ledger
from tests.testing.reactors import (
    Order,
    OrderLater,
    Refund,
    Retrying,
    RetryingLater,
    Stops,
    UndoBreaks,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_inline_run_completes_and_exposes_what_it_did() -> None:
    result = run_reactor(Order, {"order": "A1"})

    assert isinstance(result.outcome, Completed)
    assert result.status == "completed"
    assert result.value == {"step": "charge", "order": "A1"}
    assert result.error is None
    assert result.result_of("reserve") == {"step": "reserve", "order": "A1"}
    assert result.handle.id == result.execution_id
    assert result.trace == [
        ("start", ""),
        ("run", "reserve"),
        ("run", "charge"),
        ("run", "ship"),
        ("complete", ""),
    ]
    assert result.paused_at == ()
    result.assert_completed().assert_ran("reserve", "charge", "ship").assert_ran("reserve", "ship")


def test_a_failed_run_is_described_by_its_assertions() -> None:
    FAIL_AT.add("ship")

    result = run_reactor(Order, {"order": "A1"})

    result.assert_failed(step="ship", kind="step")
    result.assert_ran("reserve", "charge", "ship")
    result.assert_undid("charge", "reserve")
    result.assert_compensated("ship")
    assert isinstance(result.outcome, Failed)
    assert "ship exploded" in str(result.error)


def test_assertion_messages_name_the_expectation_and_show_the_trace() -> None:
    FAIL_AT.add("charge")
    result = run_reactor(Order, {"order": "A1"})

    with pytest.raises(AssertionError) as failure:
        result.assert_completed()
    message = str(failure.value)
    assert message.startswith("expected the run to complete, but it is failed\n")
    assert f"Order run {result.execution_id}: status failed" in message
    assert "error: step 'charge' failed (RuntimeError): charge exploded" in message
    assert "  run                reserve\n" in message
    assert "  compensate         charge\n" in message
    assert "  undo               reserve\n" in message

    with pytest.raises(AssertionError, match="fail at step 'ship', but it failed at 'charge'"):
        result.assert_failed(step="ship")
    with pytest.raises(AssertionError, match="a failure of kind 'contract', but it is 'step'"):
        result.assert_failed(kind="contract")
    with pytest.raises(
        AssertionError,
        match=r"(?m)run to run ship, reserve \(in this order\), but it ran reserve, charge$",
    ):
        result.assert_ran("ship", "reserve")
    with pytest.raises(
        AssertionError,
        match=r"(?m)rollback to undo charge \(in this order\), but it undid reserve$",
    ):
        result.assert_undid("charge")
    with pytest.raises(AssertionError, match="expected step 'reserve' to be compensated"):
        result.assert_compensated("reserve")
    with pytest.raises(AssertionError, match="'charge' to be retried at least once, but it was "):
        result.assert_retried("charge")
    with pytest.raises(AssertionError, match="wait at interrupt 'approval', but it is failed"):
        result.assert_paused_at("approval")
    with pytest.raises(AssertionError, match="rollback of step 'reserve' to fail, but nothing"):
        result.assert_rollback_failure("reserve")
    with pytest.raises(AssertionError, match="expected the run to halt, but it is failed"):
        result.assert_halted()


def test_a_completed_run_does_not_pass_assert_failed() -> None:
    result = run_reactor(Order, {"order": "A1"})

    with pytest.raises(AssertionError, match="expected the run to fail, but it is completed"):
        result.assert_failed()


def test_halts_and_their_reason() -> None:
    result = run_reactor(Stops)

    result.assert_halted().assert_halted("out of stock").assert_ran("check", "stop")
    with pytest.raises(AssertionError, match="reason 'sold', but the reason is 'out of stock'"):
        result.assert_halted("sold")


def test_retries_are_counted() -> None:
    result = run_reactor(Retrying)

    result.assert_completed().assert_retried("fetch", times=2).assert_retried("fetch")
    with pytest.raises(AssertionError, match="retried 1 time\\(s\\), but it was retried 2"):
        result.assert_retried("fetch", times=1)


def test_a_failed_undo_is_a_rollback_failure() -> None:
    FAIL_AT.add("charge")

    result = run_reactor(UndoBreaks)

    result.assert_failed(step="charge").assert_rollback_failure("hold")
    with pytest.raises(AssertionError, match="rollback of step 'charge' to fail, but only hold"):
        result.assert_rollback_failure("charge")


def test_background_work_is_drained_in_process() -> None:
    result = run_reactor(OrderLater)

    result.assert_completed().assert_ran("reserve", "charge", "ship")
    assert ("handoff", "") in result.trace or ("resume", "") in result.trace
    assert result.queued == []


def test_background_none_leaves_the_work_queued_until_stepped() -> None:
    result = run_reactor(OrderLater, background="none")

    assert isinstance(result.outcome, Dispatched)
    assert len(result.queued) == 1
    assert ledger.calls == [("run", "reserve")]

    assert result.step_once() is True
    result.assert_completed()
    assert result.step_once() is False


def test_a_retry_waiting_for_its_backoff_is_made_due() -> None:
    result = run_reactor(RetryingLater)

    result.assert_completed().assert_retried("fetch", times=2)


def test_drain_is_bounded() -> None:
    result = run_reactor(RetryingLater, background="none")

    with pytest.raises(AssertionError) as failure:
        result.drain(max_rounds=1)
    assert "work was still queued after 1 resume task(s)" in str(failure.value)
    assert "Raise max_rounds if the run needs more." in str(failure.value)
    result.drain().assert_completed()


def test_an_interrupt_is_resumed_and_the_background_rest_drained() -> None:
    result = run_reactor(Refund)

    assert isinstance(result.outcome, Paused)
    result.assert_paused_at("approval")
    assert result.paused_at == ("approval",)

    result.resume("approval", {"approved": True})

    result.assert_completed().assert_ran("request", "refund")
    assert result.result_of("refund") == {"step": "refund", "approved": True}


def test_resume_without_draining() -> None:
    result = run_reactor(Refund, background="none")

    result.resume(payload={"approved": False})

    assert isinstance(result.outcome, Dispatched)
    result.drain().assert_completed()
    assert result.result_of("refund") == {"step": "refund", "approved": False}


def test_unknown_background_mode_is_refused() -> None:
    with pytest.raises(ValueError, match='background must be "eager", "none" or "workers"'):
        run_reactor(Order, {"order": "A1"}, background="celery")


@pytest.mark.django_db(transaction=False)
def test_it_works_inside_a_test_transaction() -> None:
    run_reactor(OrderLater).assert_completed()
