"""Helpers for testing your own reactors, and the pytest plugin that provides them as fixtures.

::

    from django_reactor.testing import run_reactor, mock_step

    def test_refund_is_rolled_back_when_the_charge_fails():
        with mock_step(Checkout, "charge", raises=PaymentDeclined("card declined")):
            result = run_reactor(Checkout, {"order": "A1"})
        result.assert_failed(step="charge")
        result.assert_undid("reserve")

:func:`run_reactor` runs a reactor in this process and also works off the background work it
queues (``Meta.background``, ``interrupt(resume="background")``, retries a worker would pick
up): instead of sending Celery tasks to a broker, it captures them and resumes each run here.

pytest loads this package through the ``pytest11`` entry point before Django is configured, so
nothing here may import Django models or settings at import time: imports are kept inside the
functions. By what they do: ``results`` (:func:`run_reactor`, :class:`ReactorResult`),
``mocks`` (:func:`mock_step`, :func:`fail_step`), ``idempotency`` (:func:`assert_idempotent`),
``coordination`` (lock and rate-limit readers), ``schedules`` (:func:`make_schedules_due`); the
fixtures are defined here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .clock import ReactorClock
from .coordination import (
    assert_lock_free,
    assert_lock_held,
    lock_holder,
    rate_limit_count,
    semaphore_available,
)
from .idempotency import assert_idempotent
from .mocks import StepMock, fail_step, mock_step
from .results import MapElements, ReactorResult, run_reactor
from .schedules import make_schedules_due

if TYPE_CHECKING:
    from ..reactor import Reactor

__all__ = [
    "MapElements",
    "ReactorClock",
    "ReactorResult",
    "StepMock",
    "assert_idempotent",
    "assert_lock_free",
    "assert_lock_held",
    "fail_step",
    "lock_holder",
    "make_schedules_due",
    "mock_step",
    "rate_limit_count",
    "run_reactor",
    "semaphore_available",
]

try:
    import pytest
except ImportError:  # pragma: no cover - unittest users need not install pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def reactor_clock() -> ReactorClock:
        """:class:`ReactorClock`: ``reactor_clock.advance(days=3)`` moves the times runs wait
        for (sleeps, scheduled starts, deadlines, interrupt expiry) and resumes what is due."""
        return ReactorClock()

    @pytest.fixture
    def reactor_runner() -> Callable[..., ReactorResult]:
        """:func:`run_reactor`: ``reactor_runner(MyReactor, {...}).assert_completed()``."""
        return run_reactor

    @pytest.fixture(name="mock_step")
    def mock_step_fixture() -> Iterator[Callable[..., StepMock]]:
        """:func:`mock_step` for the rest of the test: ``mock_step(R, "charge", returns=1)``
        (or a path: ``"ship.pack"``, ``"lines[3].charge"``)."""
        with contextlib.ExitStack() as stack:

            def replace(reactor: type[Reactor], step: str, **options: Any) -> StepMock:
                return stack.enter_context(mock_step(reactor, step, **options))

            yield replace

    @pytest.fixture(name="fail_step")
    def fail_step_fixture() -> Iterator[Callable[..., StepMock]]:
        """:func:`fail_step` for the rest of the test: ``fail_step(R, "charge", "declined")``."""
        with contextlib.ExitStack() as stack:

            def replace(reactor: type[Reactor], step: str, *args: Any, **options: Any) -> StepMock:
                return stack.enter_context(fail_step(reactor, step, *args, **options))

            yield replace
