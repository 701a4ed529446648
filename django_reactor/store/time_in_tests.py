"""Moving time forward in tests: every time a run waits for comes closer by the same amount.

Wake-up times (sleeps, retries' backoffs, scheduled starts), deadlines, interrupt expiry, the
time each sleep waits until and the schedules' next fire times are moved back by ``delta``,
which is what the clock moving forward would do, for the database's clock and this process's
alike (and for workers in other processes). Used by the ``reactor_clock`` fixture
(``django_reactor.testing``); other modules that keep times register a shift of their own
with :func:`register`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from django.db import transaction
from django.db.models import F

from ..models import Execution, Interrupt, Schedule
from ..states import InterruptStatus
from .db import using
from .dialects import dialect

_shifts: list[Callable[[dt.timedelta], None]] = []


def register(shift: Callable[[dt.timedelta], None]) -> None:
    """Also call ``shift(delta)`` when test time moves (for times kept elsewhere)."""
    if shift not in _shifts:
        _shifts.append(shift)


def shift_due_times(delta: dt.timedelta) -> None:
    """Move every stored time that runs wait for back by ``delta`` (in one transaction)."""
    with transaction.atomic(using=using()):
        executions = Execution.objects.using(using())
        executions.filter(wake_at__isnull=False).update(wake_at=F("wake_at") - delta)
        executions.filter(deadline_at__isnull=False).update(deadline_at=F("deadline_at") - delta)
        executions.filter(debounce_latest__isnull=False).update(
            debounce_latest=F("debounce_latest") - delta
        )
        Interrupt.objects.using(using()).filter(
            status=InterruptStatus.WAITING, expires_at__isnull=False
        ).update(expires_at=F("expires_at") - delta)
        Schedule.objects.using(using()).filter(next_fire_at__isnull=False).update(
            next_fire_at=F("next_fire_at") - delta
        )
        dialect().shift_sleeps(delta)  # the time each sleep waits until, in its record
        for shift in _shifts:
            shift(delta)
