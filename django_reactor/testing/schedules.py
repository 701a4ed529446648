"""Testing schedules without waiting for their ticks.

::

    from django_reactor import services
    from django_reactor.testing import make_schedules_due

    def test_the_nightly_reconcile_runs():
        schedule = services.schedules.create(Reconcile, cron="0 2 * * *")
        make_schedules_due(schedule)          # its 02:00 tick has come
        report = services.schedules.fire_due()  # what the sweeper does
        assert report.started == 1

The runs a tick starts are background runs (a worker runs them); ``run_reactor`` is for runs
you start yourself, so look them up with ``services.schedules.fires(schedule)`` and resume
them with ``services.resume(fire.execution_id)`` when the test should see them finish.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

# pytest loads this package through the ``pytest11`` entry point before Django is configured:
# nothing here may import models or settings at import time, so imports are inside functions.


def make_schedules_due(
    *schedules: Any, late_by: dt.timedelta = dt.timedelta(0), now: dt.datetime | None = None
) -> int:
    """Make the next tick of ``schedules`` (ids, names or rows; none: every enabled schedule)
    come now, as if the clock had reached it: their next fire time is moved to ``now``
    (default: the current time) minus ``late_by``. Returns how many schedules moved.

    The next sweep (``services.sweep()`` or ``services.schedules.fire_due()``) fires that tick
    on time. With ``late_by`` longer than ``SCHEDULE_MISSED_AFTER`` it is a missed tick, and so
    are the schedule's ticks that would have come during ``late_by``: the schedule's catch-up
    policy decides what they do, as after downtime. The time moved to becomes the tick's fire
    time; moving a schedule back onto ticks it has already fired does not fire them again (the
    sweeper treats that as a clock that went backwards).
    """
    from django.utils import timezone

    from ..services import schedules as service
    from ..store import schedules as rows

    at = (now or timezone.now()) - late_by
    ids: Iterable[int] | None = None
    if schedules:
        ids = [service.get(s).id for s in schedules]
    return rows.make_due(ids, at)
