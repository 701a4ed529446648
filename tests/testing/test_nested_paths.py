"""mock_step and fail_step at nested paths: composed children, async units, map elements."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import registry
from django_reactor.testing import fail_step, mock_step, run_reactor
from tests.integration.reactors import ledger
from tests.testing.nested_reactors import (
    Basket,
    Dispatching,
    Doubling,
    FannedBasket,
    Fulfil,
    FulfilLater,
    Line,
    Outer,
    Shipment,
    Warehouse,
)

pytestmark = pytest.mark.django_db(transaction=True)


# ---------------------------------------------------------------------------- compose


def test_a_step_of_a_composed_child_is_replaced_and_restored() -> None:
    shipment, fulfil = Shipment.definition, Fulfil.definition
    with mock_step(Fulfil, "ship.pack", returns={"box": "M"}) as pack:
        assert Shipment.definition is not shipment
        assert registry.get(shipment.name).definition is Shipment.definition
        result = run_reactor(Fulfil, {"order": "A1"})

    result.assert_completed().assert_ran("reserve", "ship", "notify")
    assert pack.calls == [{"order": "A1"}]
    assert pack.indices == []
    child = result.child("ship")
    child.assert_completed().assert_ran("pack", "label")
    assert child.result_of("pack") == {"box": "M"}
    assert ("run", "pack") not in ledger.calls
    assert Shipment.definition is shipment
    assert Fulfil.definition is fulfil
    assert registry.get(shipment.name) is Shipment


def test_a_failing_child_step_rolls_back_the_child_then_the_parent() -> None:
    with fail_step(Fulfil, "ship.label", "no labels left"):
        result = run_reactor(Fulfil, {"order": "A1"})

    result.assert_failed(step="ship").assert_compensated("ship").assert_undid("reserve")
    assert "no labels left" in str(result.error)
    assert result.trace == [
        ("start", ""),
        ("run", "reserve"),
        ("fail", "ship"),
        ("compensate", "ship"),
        ("undo", "reserve"),
        ("fail", ""),
    ]
    child = result.child("ship")
    child.assert_failed(step="label").assert_compensated("label").assert_undid("pack")
    assert child.trace == [
        ("start", ""),
        ("run", "pack"),
        ("fail", "label"),
        ("compensate", "label"),
        ("undo", "pack"),
        ("fail", ""),
    ]


def test_a_path_reaches_any_depth() -> None:
    with mock_step(Outer, "fulfil.ship.pack", raises=LookupError("no boxes")) as pack:
        result = run_reactor(Outer, {"order": "A1"})

    assert pack.called
    result.assert_failed(step="fulfil")
    result.child("fulfil").assert_failed(step="ship").assert_undid("reserve")
    result.child("fulfil.ship").assert_failed(step="pack", kind="step")
    assert result.child("fulfil").child("ship").execution_id == (
        result.child("fulfil.ship").execution_id
    )


def test_wraps_gets_the_original_body_of_a_nested_step() -> None:
    def heavier(original: Any, order: str) -> Any:
        packed = original(order=order)
        return {**packed.value, "weight": 3}

    with mock_step(Fulfil, "ship.pack", wraps=heavier) as pack:
        result = run_reactor(Fulfil, {"order": "A1"})

    result.assert_completed()
    assert result.child("ship").result_of("pack") == {"step": "pack", "order": "A1", "weight": 3}
    assert ("run", "pack") in ledger.calls  # the original ran, inside the wrapper
    assert pack.calls == [{"order": "A1"}]


def test_a_nested_replacement_holds_on_the_eager_worker() -> None:
    with fail_step(FulfilLater, "ship.label", "printer jammed"):
        result = run_reactor(FulfilLater, {"order": "A1"})

    assert ("handoff", "") in result.trace
    result.assert_failed(step="ship").assert_undid("reserve")
    result.child("ship").assert_failed(step="label")


def test_a_nested_replacement_holds_while_draining_step_by_step() -> None:
    with mock_step(FulfilLater, "ship.label", returns="LBL-1"):
        result = run_reactor(FulfilLater, {"order": "A1"}, background="none")
        assert result.status == "pending"
        result.drain()

    result.assert_completed()
    assert result.value == "LBL-1"
    # Once the block is left, the child runs its own step again.
    run_reactor(FulfilLater, {"order": "A2"}).assert_completed()
    assert ("run", "label") in ledger.calls


def test_two_nested_replacements_combine_and_restore_in_order() -> None:
    shipment = Shipment.definition
    with (
        mock_step(Fulfil, "ship.pack", returns="packed"),
        mock_step(Fulfil, "ship.label", returns="labelled"),
    ):
        result = run_reactor(Fulfil, {"order": "A1"})
    assert result.value == "labelled"
    assert result.child("ship").result_of("pack") == "packed"
    assert Shipment.definition is shipment


# ---------------------------------------------------------------------------- async units


def test_a_step_of_an_async_reactor_unit_is_replaced_on_its_worker() -> None:
    with fail_step(Dispatching, "shipment.pack", "warehouse closed") as pack:
        result = run_reactor(Dispatching, {"order": "A1"})

    result.assert_completed()  # the parent does not wait for its units
    assert pack.calls == [{"order": "A1"}]
    unit = result.child("shipment")
    unit.assert_failed(step="pack")
    assert unit.trace[:3] == [("start", ""), ("resume", ""), ("fail", "pack")]


def test_an_async_step_is_replaced_where_its_unit_runs() -> None:
    with mock_step(Dispatching, "receipt", returns="R-1") as receipt:
        result = run_reactor(Dispatching, {"order": "A1"})

    assert receipt.calls == [{"order": "A1"}]
    result.child("receipt").assert_completed()
    assert result.child("receipt").value == "R-1"
    assert ("run", "receipt") not in ledger.calls


# ---------------------------------------------------------------------------- map elements


def test_fail_step_fails_one_element_by_index() -> None:
    with fail_step(Basket, "lines[1].charge", "card declined") as charge:
        result = run_reactor(Basket, {"items": [1, 2, 3]})

    assert charge.indices == [1]
    assert charge.calls == [{"item": 2, "amount": 20}]
    result.assert_failed(step="lines").assert_compensated("lines")
    assert "map element 1 (of 3) failed at step 'charge': card declined" in str(result.error)
    elements = result.elements("lines")
    elements.assert_element_undone(0).assert_element_failed(1, step="charge")
    elements.assert_element_not_started(2)
    # Element 0 ran its own body, and was undone by rollback.
    assert ledger.calls == [
        ("run", "price-1"),
        ("run", "charge-1"),
        ("run", "price-2"),
        ("undo", "charge-1"),
    ]


def test_every_element_with_a_star() -> None:
    with mock_step(Basket, "lines[*].charge", side_effect=lambda item, amount: {"charged": 1}) as m:
        result = run_reactor(Basket, {"items": [4, 5, 6]})

    result.assert_completed()
    assert result.value == 3
    assert m.indices == [0, 1, 2]
    assert not [call for call in ledger.calls if call[1].startswith("charge")]


def test_an_element_step_replacement_gets_the_original() -> None:
    def discounted(original: Any, item: int, amount: int) -> Any:
        return {**original(item=item, amount=amount), "charged": amount // 2}

    with mock_step(Basket, "lines[2].charge", wraps=discounted):
        result = run_reactor(Basket, {"items": [10, 20, 30]})

    assert result.value == 100 + 200 + 150
    assert [call for call in ledger.calls if call[1].startswith("charge")] == [
        ("run", "charge-10"),
        ("run", "charge-20"),
        ("run", "charge-30"),
    ]


def test_element_replacements_stay_in_their_map() -> None:
    basket, line = Basket.definition, Line.definition
    with mock_step(Basket, "lines[*].charge", returns={"charged": 0}):
        assert Line.definition is line  # the element reactor's own class is left alone
        assert Basket.definition.step("lines").map.element_definition is not line
    assert Basket.definition is basket


def test_fanned_out_elements_are_replaced_on_the_eager_workers() -> None:
    with fail_step(FannedBasket, "lines[3].charge", "declined") as charge:
        result = run_reactor(FannedBasket, {"items": [1, 2, 3, 4, 5]})

    assert charge.indices == [3]
    result.assert_failed(step="lines")
    result.elements("lines").assert_element_failed(3, message="declined")


def test_fanned_out_elements_drained_step_by_step() -> None:
    with mock_step(FannedBasket, "lines[*].charge", returns={"charged": 2}) as charge:
        result = run_reactor(FannedBasket, {"items": [1, 2, 3, 4]}, background="none")
        assert result.status == "pending"
        while result.step_once():
            pass

    result.assert_completed()
    assert result.value == 8
    assert sorted(charge.indices) == [0, 1, 2, 3]


def test_elements_of_a_map_inside_a_composed_child() -> None:
    with fail_step(Warehouse, "stock.lines[0].charge", "no stock") as charge:
        result = run_reactor(Warehouse, {"items": [7, 8]})

    assert charge.indices == [0]
    result.assert_failed(step="stock")
    result.child("stock").assert_failed(step="lines")
    result.elements("stock.lines").assert_element_failed(0, message="no stock")


def test_a_one_step_element_is_named_by_its_map() -> None:
    with mock_step(Doubling, "doubled[1]", returns=-1) as doubled:
        result = run_reactor(Doubling, {"items": [1, 2, 3]})

    assert doubled.indices == [1]
    assert result.elements("doubled").values() == [2, -1, 6]
    with mock_step(Doubling, "doubled[*].double", returns=0):
        assert run_reactor(Doubling, {"items": [1, 2]}).elements("doubled").values() == [0, 0]


# ---------------------------------------------------------------------------- bad paths


@pytest.mark.parametrize(
    ("reactor", "path", "message"),
    [
        (Fulfil, "ship.", r"'' is not a step name"),
        (Fulfil, "ship[x].pack", r"'ship\[x\]' is not a step name"),
        (Fulfil, "ship.box", r"Shipment \(reached by 'ship'\) has no step 'box'; its steps: pack"),
        (Fulfil, "ship", r"runs the reactor Shipment; only plain steps can be replaced: name one"),
        (Fulfil, "reserve.pack", r"step 'reserve' of Fulfil is not a compose\(\) or async_"),
        (Fulfil, "ship[2].pack", r"step 'ship' of Fulfil is not a map_over\(\) step"),
        (Dispatching, "shipment", r"runs the reactor Shipment"),
        (Basket, "lines", r"is a map; only plain steps can be replaced: name an element's step"),
        (Basket, "lines.charge", r"choose its elements: lines\[3\]\.<step>"),
        (Basket, "lines[*]", r"have several steps; name one: lines\[\*\]\.<step>"),
        (Basket, "lines[0].pay", r"the elements of map 'lines' have no step 'pay'; their steps"),
        (Basket, "lines[0].charge.x", r"have nothing nested in them"),
    ],
)
def test_a_path_that_leads_nowhere_says_why(reactor: Any, path: str, message: str) -> None:
    before = reactor.definition
    with pytest.raises(ValueError, match=message), mock_step(reactor, path, returns=1):
        pass
    assert reactor.definition is before
