"""Runs that should be moving and are not: their process is gone (lease expired), or the step
they run has been in flight longer than its timeout. What the admin's overview and
``reactor_list --stuck`` show."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from django.utils import timezone

from .. import registry, store
from ..conf import reactor_settings
from ..exceptions import ReactorError

#: Running runs examined for steps past their timeout (the oldest first).
CANDIDATES = 500


@dataclass(frozen=True, slots=True)
class StuckRun:
    """One stuck run: which, where, since when, and why (``display.stuck_reason`` words it)."""

    execution_id: uuid.UUID
    reactor: str
    status: str
    step: str
    since: dt.datetime | None
    # "lease_expired" (``owner``'s lease ran out ``seconds`` ago) or "past_timeout" (the step has
    # been in flight ``seconds``, longer than its ``timeout``).
    kind: str
    seconds: float
    owner: str = ""
    timeout: float | None = None


def stuck_runs(limit: int = 50, now: dt.datetime | None = None) -> list[StuckRun]:
    """Runs whose lease expired (their process is gone: the sweeper hands them to a worker),
    then runs whose step in flight has run longer than its ``timeout`` (or
    ``REACTOR["STEP_TIMEOUT"]``), longest first."""
    now = now or timezone.now()
    found = [
        StuckRun(
            row.pk,
            row.reactor,
            row.status,
            row.current_step,
            row.lease_expires_at,
            "lease_expired",
            (now - row.lease_expires_at).total_seconds() if row.lease_expires_at else 0.0,
            owner=row.lease_owner or "",
        )
        for row in store.overview.lease_expired(now, limit)
    ]
    return (found + past_timeout(limit - len(found), now))[:limit]


def past_timeout(limit: int, now: dt.datetime) -> list[StuckRun]:
    """Running runs (their lease alive) whose step in flight has run longer than its timeout."""
    if limit <= 0:
        return []
    rows = [
        row
        for row in store.overview.oldest_running(CANDIDATES)
        if row.lease_expires_at is None or row.lease_expires_at >= now
    ]
    since = store.overview.in_flight_since(row.pk for row in rows)
    found: list[StuckRun] = []
    for row in rows:
        try:
            spec = registry.of_run(row.reactor, row.version).definition.by_name.get(
                row.current_step
            )
        except ReactorError:
            continue
        if spec is None:
            continue
        timeout = spec.timeout if spec.timeout is not None else reactor_settings.STEP_TIMEOUT
        start = since.get(row.pk) or row.started_at
        if timeout is None or start is None:
            continue
        took = (now - start).total_seconds()
        if took > timeout:
            found.append(
                StuckRun(
                    row.pk,
                    row.reactor,
                    row.status,
                    row.current_step,
                    start,
                    "past_timeout",
                    took,
                    owner=row.lease_owner or "",
                    timeout=timeout,
                )
            )
    found.sort(key=lambda s: s.since or now)
    return found[:limit]
