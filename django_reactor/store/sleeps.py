"""Ending sleeps whose time has come, for runs nobody owns: the sweeper does it for the runs
it wakes (many in one statement), and "wake now" for one run, so the worker that resumes the
run goes on from the step after the sleep without a checkpoint of its own for it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connections

from ..engine.serialization import decode
from ..models import StepRecord
from ..states import StepStatus
from . import sql
from .db import USING
from .reads import last_seq


def end_due_sleeps(execution_ids: list[Any], now: dt.datetime) -> int:
    """Write completed the sleeps of these runs whose time has come (``sql.END_DUE_SLEEPS``),
    as the worker resuming the run would; how many. The caller holds the runs' rows and
    nobody owns them."""
    if connections[USING].vendor == "postgresql":
        return end_due_sleeps_sql(execution_ids, now)
    return end_due_sleeps_orm(execution_ids, now)


def end_due_sleeps_sql(execution_ids: list[Any], now: dt.datetime) -> int:
    """:func:`end_due_sleeps` in one statement, on PostgreSQL."""
    row = sql.execute(sql.END_DUE_SLEEPS, {"ids": execution_ids, "now": now})
    return int(row[0]) if row else 0


def end_due_sleeps_orm(execution_ids: list[Any], now: dt.datetime) -> int:
    """:func:`end_due_sleeps` through the ORM, a record at a time (other databases)."""
    ended = 0
    records = StepRecord.objects.using(USING).filter(
        execution_id__in=execution_ids, status=StepStatus.SLEEPING, traced=False
    )
    for record in records.order_by("execution_id", "seq"):
        if dt.datetime.fromisoformat(str(decode(record.result))) > now:
            continue  # woken by its deadline: the worker stops the run there
        record.status = StepStatus.COMPLETED
        record.seq = last_seq(record.execution_id) + 1
        record.attempts = 1
        record.started_at = record.finished_at = now
        record.traced = True
        record.duration_ms = 0.0
        record.save(
            using=USING,
            update_fields=[
                "status",
                "seq",
                "attempts",
                "started_at",
                "finished_at",
                "traced",
                "duration_ms",
            ],
        )
        ended += 1
    return ended
