"""Ending sleeps whose time has come, for runs nobody owns: the sweeper does it for the runs
it wakes (many in one update), and "wake now" for one run, so the worker that resumes the
run goes on from the step after the sleep without a checkpoint of its own for it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..engine.serialization import decode
from ..exceptions import StoredValueUnreadable
from ..models import StepRecord
from ..states import StepStatus
from .db import logger, using
from .dialects import dialect


def end_due_sleeps(execution_ids: list[Any], now: dt.datetime) -> int:
    """Write completed the sleeps of these runs whose time has come, as the worker resuming
    the run would; how many. The caller holds the runs' rows and nobody owns them. One update
    on PostgreSQL (``sql.END_SLEEPS``), a record at a time elsewhere (the dialect's
    ``end_sleeps``)."""
    due = _over(execution_ids, now)
    if not due:
        return 0
    return dialect().end_sleeps(due, now)


def _over(execution_ids: list[Any], now: dt.datetime) -> list[tuple[int, Any]]:
    """``(record id, execution id)`` of the sleeping records of these runs whose time has come,
    in order. A record whose time has not come (a run woken by its deadline) is left to the
    worker, and so is one whose time does not read (the worker parks that run for a person):
    one bad row must not stop the sweep for every run."""
    records = (
        StepRecord.objects.using(using())
        .filter(execution_id__in=execution_ids, status=StepStatus.SLEEPING, traced=False)
        .order_by("execution_id", "seq")
        .values_list("id", "execution_id", "result")
    )
    over = []
    for record_id, execution_id, result in records:
        try:
            due = dt.datetime.fromisoformat(str(decode(result)))
            if due.tzinfo is None:
                raise ValueError("no time zone")
            if due > now:
                continue
        except (ValueError, TypeError, StoredValueUnreadable):
            logger.warning(
                "execution %s: its sleep's time %r does not read; left to the worker",
                execution_id,
                result,
            )
            continue
        over.append((record_id, execution_id))
    return over
