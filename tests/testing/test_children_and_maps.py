"""ReactorResult.child, elements, map_summary and assert_map."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import Halt, Reactor, arg, map_over, step
from django_reactor.runtime.maps import ElementResult
from django_reactor.testing import MapElements, ReactorResult, run_reactor
from tests.integration.reactors import FAIL_AT
from tests.testing.nested_reactors import (
    Basket,
    Dispatching,
    FannedBasket,
    Fulfil,
    Items,
    Line,
    Outer,
    Shipment,
    TolerantBasket,
    Warehouse,
)

pytestmark = pytest.mark.django_db(transaction=True)


# ---------------------------------------------------------------------------- children


def test_a_composed_child_is_a_result_of_its_own() -> None:
    result = run_reactor(Fulfil, {"order": "A1"})

    child = result.child("ship")
    assert isinstance(child, ReactorResult)
    assert child.reactor is Shipment
    assert child.parent is result
    assert child.handle.parent_id == result.execution_id
    assert child.execution_id != result.execution_id
    assert child.value == result.value == {"step": "label", "order": "A1"}
    assert child.trace == [
        ("start", ""),
        ("run", "pack"),
        ("run", "label"),
        ("complete", ""),
    ]
    assert child.handle.trace[0].data == {"parent_step": "ship"}
    child.assert_completed().assert_ran("pack", "label")
    assert repr(child).startswith("<ReactorResult Shipment ")


def test_a_child_of_a_child() -> None:
    result = run_reactor(Outer, {"order": "A1"})

    assert result.child("fulfil").reactor is Fulfil
    grandchild = result.child("fulfil.ship")
    assert grandchild.reactor is Shipment
    assert grandchild.parent is not None
    assert grandchild.parent.reactor is Fulfil
    grandchild.assert_completed().assert_ran("pack", "label")


def test_a_child_failure_message_shows_the_childs_trace() -> None:
    FAIL_AT.add("label")
    result = run_reactor(Fulfil, {"order": "A1"})

    with pytest.raises(AssertionError) as failure:
        result.child("ship").assert_completed()
    message = str(failure.value)
    assert "expected the run to complete, but it is failed" in message
    assert "Shipment run " in message
    assert "fail               label" in message


def test_a_step_without_a_child_is_reported() -> None:
    result = run_reactor(Fulfil, {"order": "A1"})

    with pytest.raises(AssertionError, match="step 'reserve' to have run a composed reactor or"):
        result.child("reserve")
    with pytest.raises(AssertionError, match=r"map elements are not runs of their own; read "):
        run_reactor(Basket, {"items": [1]}).child("lines[0]")


def test_async_units_are_results_of_their_own() -> None:
    result = run_reactor(Dispatching, {"order": "A1"})

    assert ("dispatch", "shipment") in result.trace
    shipment = result.child("shipment")
    assert shipment.reactor is Shipment
    shipment.assert_completed().assert_ran("pack", "label")
    receipt = result.child("receipt")
    receipt.assert_completed().assert_ran("receipt")
    assert receipt.value == {"step": "receipt", "order": "A1"}
    assert receipt.trace == [("start", ""), ("resume", ""), ("run", "receipt"), ("complete", "")]
    assert repr(receipt).startswith(f"<ReactorResult {Dispatching.definition.name}:receipt ")


def test_a_units_result_moves_on_when_the_shared_work_is_drained() -> None:
    result = run_reactor(Dispatching, {"order": "A1"}, background="none")

    result.assert_completed()
    unit = result.child("shipment")
    assert unit.status == "pending"
    assert len(unit.queued) == 2  # the queue is shared: both units wait for a worker
    unit.drain()
    unit.assert_completed()
    result.child("receipt").assert_completed()


# ---------------------------------------------------------------------------- map elements


def test_elements_read_every_outcome_in_index_order() -> None:
    result = run_reactor(Basket, {"items": [1, 2, 3]})

    elements = result.elements("lines")
    assert isinstance(elements, MapElements)
    assert len(elements) == 3
    assert elements[0] == ElementResult(0, "succeeded", {"item": 1, "charged": 10}, None)
    assert [e.index for e in elements] == [0, 1, 2]
    assert elements.statuses == ["succeeded"] * 3
    assert elements.values() == [{"item": i, "charged": i * 10} for i in (1, 2, 3)]
    assert elements.indices("succeeded") == [0, 1, 2]
    elements.assert_element_succeeded(2, value={"item": 3, "charged": 30})
    assert elements.summary()["succeeded"] == 3
    assert repr(elements) == "<MapElements lines of Basket: 3 element(s)>"


def test_a_failed_element_and_what_rollback_did_to_the_others() -> None:
    FAIL_AT.add("item-2")
    result = run_reactor(Basket, {"items": [1, 2, 3, 4]})

    result.assert_failed(step="lines")
    elements = result.elements("lines")
    assert elements.statuses == ["undone", "failed", "not_started", "not_started"]
    elements.assert_element_undone(0)
    elements.assert_element_failed(1, step="charge", kind="step", message="card declined for 2")
    elements.assert_element_not_started(3)
    assert elements[1].error is not None
    assert elements[1].error["exception_class"] == "RuntimeError"
    assert elements.values() == [{"item": 1, "charged": 10}]  # undone, its value kept


def test_element_assertion_messages_show_the_elements() -> None:
    FAIL_AT.add("item-2")
    elements = run_reactor(Basket, {"items": [1, 2]}).elements("lines")

    with pytest.raises(AssertionError) as failure:
        elements.assert_element_succeeded(1)
    message = str(failure.value)
    assert "expected element 1 of map 'lines' to be succeeded, but it is failed" in message
    assert "Basket run " in message  # the run's own description
    assert "map lines (2 element(s)):" in message
    assert "  [0] undone       {'item': 1, 'charged': 10}" in message
    assert "  [1] failed       step error at step 'charge': card declined for 2" in message
    with pytest.raises(AssertionError, match="to fail with step 'price', but its step is 'cha"):
        elements.assert_element_failed(1, step="price")
    with pytest.raises(AssertionError, match="to mention 'timeout', but it is 'card declined"):
        elements.assert_element_failed(1, message="timeout")
    with pytest.raises(AssertionError, match="to be failed, but the map has 2 element"):
        elements.assert_element_failed(5)


def test_a_halted_element() -> None:
    FAIL_AT.add("halt-2")
    result = run_reactor(Basket, {"items": [1, 2, 3]})

    result.assert_halted()
    elements = result.elements("lines")
    elements.assert_element_succeeded(0).assert_element_halted(1, reason="item 2 needs review")
    with pytest.raises(AssertionError, match="to halt with reason 'x', but the reason is 'item"):
        elements.assert_element_halted(1, reason="x")


def test_an_element_whose_undo_failed() -> None:
    FAIL_AT.update({"item-3", "undo-1"})
    result = run_reactor(Basket, {"items": [1, 2, 3]})

    result.assert_failed(step="lines").assert_rollback_failure("lines[0].charge")
    elements = result.elements("lines")
    elements.assert_element_undo_failed(0, message="refund failed for 1")
    elements.assert_element_undone(1).assert_element_failed(2)
    assert elements.rollback_errors(0)[0]["step"] == "charge"
    assert elements.rollback_errors(1) == []
    assert "  [0] undo_failed  undo charge failed: refund failed for 1" in elements._describe()
    with pytest.raises(AssertionError, match="to fail mentioning 'x', but it failed with refund"):
        elements.assert_element_undo_failed(0, message="x")


def test_elements_of_a_fanned_out_map() -> None:
    FAIL_AT.add("item-3")
    result = run_reactor(FannedBasket, {"items": [1, 2, 3, 4, 5]})

    result.assert_failed(step="lines")
    elements = result.elements("lines")
    elements.assert_element_failed(2, message="card declined for 3")
    assert "succeeded" not in elements.statuses  # the others were undone or never started


def test_elements_through_a_child_path() -> None:
    result = run_reactor(Warehouse, {"items": [5, 6]})

    result.elements("stock.lines").assert_element_succeeded(1, value={"item": 6, "charged": 60})
    result.assert_map("stock.lines", succeeded=2)
    assert result.map_summary("stock.lines")["size"] == 2


def test_elements_of_a_step_that_is_not_a_map() -> None:
    result = run_reactor(Fulfil, {"order": "A1"})
    with pytest.raises(AssertionError, match="map step 'reserve' to have run, but it is not a map"):
        result.elements("reserve")

    class Gated(Reactor):
        Inputs = Items

        @step()
        def gate() -> Any:
            return Halt("closed")

        lines = map_over(arg.input("items"), Line, item=arg.element(), wait_for=["gate"])

    gated = run_reactor(Gated, {"items": [1]}).assert_halted("closed")
    with pytest.raises(AssertionError, match="map step 'lines' to have run, but it never ran"):
        gated.elements("lines")


# ---------------------------------------------------------------------------- summaries


def test_map_summary_and_assert_map() -> None:
    FAIL_AT.update({"item-2", "item-4"})
    result = run_reactor(TolerantBasket, {"items": [1, 2, 3, 4, 5]})

    result.assert_completed()
    summary = result.map_summary("lines")
    assert (summary["size"], summary["succeeded"], summary["failed"]) == (5, 3, 2)
    assert [f["index"] for f in summary["failures"]] == [1, 3]
    result.assert_map("lines", size=5, succeeded=3, failed=2, halted=0).assert_completed()
    result.elements("lines").assert_element_failed(3, message="card declined for 4")


def test_assert_map_says_what_it_found() -> None:
    FAIL_AT.add("item-2")
    result = run_reactor(TolerantBasket, {"items": [1, 2, 3]})

    with pytest.raises(AssertionError) as failure:
        result.assert_map("lines", succeeded=3, failed=0)
    message = str(failure.value)
    assert message.splitlines()[0] == (
        "expected map 'lines' to have succeeded=3, failed=0, but it has size=3, succeeded=2, "
        "failed=1"
    )
    assert "TolerantBasket run " in message


def test_assert_map_counts_rolled_back_elements_where_they_are_now() -> None:
    FAIL_AT.add("item-3")
    result = run_reactor(Basket, {"items": [1, 2, 3, 4]})

    result.assert_map("lines", succeeded=0, undone=2, failed=1, not_started=1)
