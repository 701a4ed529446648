"""Fixtures of the database tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.reactors import FAIL_AT, ledger


@pytest.fixture(autouse=True)
def _reset_ledger() -> Iterator[None]:
    """Every test starts with an empty ledger and no step set to fail."""
    ledger.clear()
    FAIL_AT.clear()
    yield
    FAIL_AT.clear()
