"""The pytest11 entry point gives a user's tests the fixtures."""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

USER_TESTS = """
import pytest

from tests.testing.reactors import Order

pytestmark = pytest.mark.django_db(transaction=True)


def test_completes(reactor_runner):
    reactor_runner(Order, {"order": "A1"}).assert_completed().assert_ran("reserve", "charge")


def test_mocked(reactor_runner, mock_step):
    charge = mock_step(Order, "charge", returns="mocked")
    assert reactor_runner(Order, {"order": "A1"}).value == "mocked"
    assert charge.calls == [{"order": "A1"}]


def test_failed(reactor_runner, fail_step):
    fail_step(Order, "ship", "closed")
    reactor_runner(Order, {"order": "A1"}).assert_failed(step="ship").assert_undid("charge")


def test_restored_after_the_test():
    assert Order.definition.step("charge").impl.__module__ == "tests.integration.reactors"
    assert Order.definition.step("charge").impl.__bases__[0].__name__ == "Step"
"""


def test_the_package_declares_the_plugin() -> None:
    (plugin,) = [e for e in entry_points(group="pytest11") if e.name == "django_reactor"]
    assert plugin.value == "django_reactor.testing"


def test_the_entry_point_provides_the_fixtures(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    # An ini of its own, so the repository's pytest settings do not apply; pytest-django reads
    # the settings module from --ds, as a user's project would configure it.
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)

    result = pytester.runpytest_subprocess(
        "--ds=tests.settings", "-p", "no:cacheprovider", "-p", "no:schemathesis", "-q"
    )

    result.assert_outcomes(passed=4)
