"""mock_step, fail_step and assert_idempotent."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import Failure, Halt, registry
from django_reactor.testing import assert_idempotent, fail_step, mock_step, run_reactor
from tests.integration.reactors import Tracked, ledger
from tests.testing.reactors import Numbering, Order, OrderLater, Refund

pytestmark = pytest.mark.django_db(transaction=True)


def test_returns_replaces_the_body_and_records_the_calls() -> None:
    with mock_step(Order, "charge", returns={"charged": 10}) as charge:
        result = run_reactor(Order, {"order": "A1"})

    result.assert_completed()
    assert result.value == {"charged": 10}
    assert charge.called
    assert charge.calls == [{"order": "A1"}]
    assert ("run", "charge") not in ledger.calls
    assert ledger.calls == [("run", "reserve"), ("run", "ship")]


def test_the_original_step_is_back_after_the_block() -> None:
    original = Order.definition
    with mock_step(Order, "charge", returns=1):
        assert Order.definition is not original
        assert Order.definition.step("charge").impl is not Tracked
        assert Order.definition.step("charge").impl.__qualname__ == "Tracked"
        assert registry.get(Order.definition.name).definition is Order.definition
    assert Order.definition is original
    assert registry.get(original.name) is Order

    run_reactor(Order, {"order": "A1"}).assert_completed()
    assert ("run", "charge") in ledger.calls


def test_side_effect_gets_the_arguments() -> None:
    def charge(order: str) -> Any:
        return f"charged {order}"

    with mock_step(Order, "charge", side_effect=charge):
        result = run_reactor(Order, {"order": "B2"})

    assert result.value == "charged B2"


def test_raises_fails_the_step_and_keeps_its_compensate() -> None:
    with mock_step(Order, "charge", raises=ValueError("card declined")):
        result = run_reactor(Order, {"order": "A1"})

    result.assert_failed(step="charge").assert_compensated("charge").assert_undid("reserve")
    assert "card declined" in str(result.error)


def test_returns_may_be_a_step_outcome() -> None:
    with mock_step(Order, "charge", returns=Halt("fraud check")):
        run_reactor(Order, {"order": "A1"}).assert_halted("fraud check")


def test_the_patch_reaches_the_worker_that_resumes_a_background_run() -> None:
    with mock_step(OrderLater, "charge", returns="mocked"):
        result = run_reactor(OrderLater)

    result.assert_completed()
    assert result.result_of("charge") == "mocked"
    assert ("run", "charge") not in ledger.calls


def test_a_run_started_under_a_mock_continues_without_it() -> None:
    with mock_step(OrderLater, "reserve", returns="mocked"):
        result = run_reactor(OrderLater, background="none")

    result.drain().assert_completed()
    assert ledger.calls == [("run", "charge"), ("run", "ship")]


def test_fail_step_fails_without_retrying() -> None:
    with fail_step(Order, "ship", error="warehouse closed"):
        result = run_reactor(Order, {"order": "A1"})

    result.assert_failed(step="ship").assert_undid("charge", "reserve")
    assert "warehouse closed" in str(result.error)


def test_fail_step_may_raise_an_exception() -> None:
    with fail_step(Order, "ship", error=TimeoutError("slow"), retryable=True):
        result = run_reactor(Order, {"order": "A1"})

    result.assert_failed(step="ship")
    assert result.error.exception_class == "TimeoutError"


def test_nested_mocks_restore_in_order() -> None:
    original = Order.definition
    with mock_step(Order, "charge", returns=1), mock_step(Order, "ship", returns=Failure("x")):
        run_reactor(Order, {"order": "A1"}).assert_failed(step="ship")
    assert Order.definition is original


def test_mock_step_refuses_unknown_steps_and_interrupts() -> None:
    with (
        pytest.raises(ValueError, match="Order has no step 'pay'; its steps: reserve, charge"),
        mock_step(Order, "pay", returns=1),
    ):
        pass
    with (
        pytest.raises(ValueError, match="step 'reserve' of Order is not a compose"),
        mock_step(Order, "reserve.pay", returns=1),
    ):
        pass
    with (
        pytest.raises(ValueError, match="only plain steps can be replaced"),
        mock_step(Refund, "approval", returns=1),
    ):
        pass
    with (
        pytest.raises(TypeError, match="exactly one of returns=, side_effect=, raises= or wraps="),
        mock_step(Order, "charge"),
    ):
        pass


def test_assert_idempotent_passes_for_repeatable_steps() -> None:
    result = assert_idempotent(Order, {"order": "A1"})

    result.assert_completed()
    assert ledger.calls.count(("run", "charge")) == 2


def test_assert_idempotent_names_the_step_that_differs() -> None:
    with pytest.raises(AssertionError) as failure:
        assert_idempotent(Numbering)

    message = str(failure.value)
    assert message.startswith(
        "step 'number' is not idempotent: its first call returned 1, its second call with the "
        "same arguments returned 2\n"
    )
    assert "trace:" in message
    assert "first" not in message.split("\n")[0].split(":")[0]


def test_assert_idempotent_names_the_step_whose_second_call_raised() -> None:
    calls: list[str] = []

    def once(order: str) -> str:
        if calls:
            raise RuntimeError("already charged")
        calls.append("charged")
        return "ok"

    with mock_step(Order, "charge", side_effect=once), pytest.raises(AssertionError) as failure:
        assert_idempotent(Order, {"order": "A1"})

    assert str(failure.value).startswith(
        "step 'charge' raised on its second call with the same arguments: "
        "RuntimeError: already charged\n"
    )
