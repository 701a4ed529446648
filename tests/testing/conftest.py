"""Fixtures of the testing helpers' tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.reactors import FAIL_AT, ledger
from tests.testing.reactors import COUNTER


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    ledger.clear()
    FAIL_AT.clear()
    COUNTER["n"] = 0
    yield
    FAIL_AT.clear()
