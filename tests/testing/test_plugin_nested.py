"""The plugin's fixtures with nested paths, children and maps, as a user's test file uses them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

USER_TESTS = """
import pytest

from tests.integration.reactors import Tracked
from tests.testing.nested_reactors import Basket, FannedBasket, Fulfil, LineCharge, Shipment

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_child_step_mocked(reactor_runner, mock_step):
    pack = mock_step(Fulfil, "ship.pack", returns="boxed")
    result = reactor_runner(Fulfil, {"order": "A1"}).assert_completed()
    assert result.child("ship").result_of("pack") == "boxed"
    assert pack.calls == [{"order": "A1"}]


def test_an_element_failed(reactor_runner, fail_step):
    charge = fail_step(Basket, "lines[1].charge", "declined")
    result = reactor_runner(Basket, {"items": [1, 2, 3]}).assert_failed(step="lines")
    result.elements("lines").assert_element_undone(0).assert_element_failed(1, message="declined")
    result.assert_map("lines", undone=1, failed=1, not_started=1)
    assert charge.indices == [1]


def test_fanned_out_elements_failed_on_the_eager_workers(reactor_runner, fail_step):
    fail_step(FannedBasket, "lines[*].charge", "declined")
    result = reactor_runner(FannedBasket, {"items": [1, 2]}).assert_failed(step="lines")
    assert result.elements("lines").indices("failed") != []


def test_everything_is_restored_after_the_tests():
    assert Shipment.definition.step("pack").impl is Tracked
    for reactor in (Basket, FannedBasket):
        element = reactor.definition.step("lines").map.element_definition
        assert element.step("charge").impl is LineCharge
    assert Fulfil.definition.step("ship").child is Shipment
"""


def test_the_fixtures_reach_nested_steps_and_restore_them(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)

    result = pytester.runpytest_subprocess(
        "--ds=tests.settings", "-p", "no:cacheprovider", "-p", "no:schemathesis", "-q"
    )

    result.assert_outcomes(passed=4)
