"""``reactor_clock``: move time forward in a test instead of waiting.

::

    def test_the_seller_is_paid_after_the_return_window(reactor_clock):
        outcome = Marketplace.run({"order": 7})          # sleeps three days after the charge
        assert Marketplace.find(outcome.execution_id).status == "pending"
        reactor_clock.advance(days=3)
        assert Marketplace.find(outcome.execution_id).status == "completed"

:meth:`ReactorClock.advance` moves every time the runs wait for closer by the amount: wake-up
times (sleeps, retries' backoffs, scheduled starts), deadlines, interrupt expiry (and the
schedules' next fire times). Then it does what the sweeper and a worker would: a sweep (which
expires interrupts and stops paused runs past their deadline), and each run now due is resumed
in this process. It needs a database the test can write to, and a run resumed here runs its
steps here.
"""

from __future__ import annotations

import datetime as dt
from typing import Any


class ReactorClock:
    """Moves the time runs wait for; see the module."""

    def __init__(self) -> None:
        #: How far this clock has been moved in all.
        self.moved = dt.timedelta()

    def advance(
        self, delta: dt.timedelta | None = None, /, *, run: bool = True, **units: float
    ) -> list[Any]:
        """Move time forward by ``delta`` (or ``days=``, ``hours=``, ``minutes=``,
        ``seconds=``); with ``run`` (the default), sweep and resume every run now due, here.
        Returns the outcomes of the runs it resumed."""
        from .. import store

        if delta is None:
            delta = dt.timedelta(**units)
        elif units:
            raise TypeError("advance() takes a timedelta or units such as days=3, not both")
        if delta < dt.timedelta():
            raise ValueError(f"time only moves forward: advance() got {delta}")
        for alias in store.aliases():  # every database runs are routed to
            with store.bound(alias):
                store.time_in_tests.shift_due_times(delta)
        self.moved += delta
        if not run:
            return []
        return self.tick()

    def tick(self) -> list[Any]:
        """Sweep, then resume every run that is due now, here (as a worker would)."""
        from .. import services, store

        services.sweep()
        outcomes = []
        for alias in store.aliases():
            with store.bound(alias):
                for execution_id in store.due_now():
                    outcome = services.resume(execution_id)
                    if outcome is not None:
                        outcomes.append(outcome)
        return outcomes
