"""Fixtures of the testing helpers' tests."""

from __future__ import annotations

import pytest

from tests.testing.reactors import COUNTER


@pytest.fixture(autouse=True)
def _reset_counter() -> None:
    COUNTER["n"] = 0
