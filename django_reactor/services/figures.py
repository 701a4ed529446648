"""The fleet's figures in each database runs are written to, as the Prometheus metrics show
them (``django_reactor.api.metrics``).

Each database gets :func:`~django_reactor.services.health.fleet_health` (its late work and its
reactors' last hour; the workers and sweepers are the fleet's, read from the default database)
and the admin overview's capped counts of runs by status. Every read is capped and
index-backed, so a scrape costs the same at a thousand runs or a million, times the number of
databases.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.utils import timezone

from .. import store
from ..states import ExecutionStatus
from ..store.health import IN_FLIGHT
from ..store.overview import Capped
from .databases import in_each_database
from .health import Health, fleet_health

#: The statuses whose runs are counted, each up to ``store.overview.COUNT_CAP`` (runs that
#: ended are never counted whole: at a million runs that count would read them all).
COUNTED = (*IN_FLIGHT, ExecutionStatus.NEEDS_ATTENTION)


@dataclass(frozen=True)
class DatabaseFigures:
    """One database's figures: its health report, its runs by status (those of
    :data:`COUNTED`, each capped) and its runs whose lease expired (their process is gone)."""

    alias: str
    health: Health
    runs: dict[str, Capped]
    lease_expired: Capped


def fleet_figures(now: dt.datetime | None = None) -> list[DatabaseFigures]:
    """The figures of each database runs are written to (only the bound one when a database
    is bound), the default first."""
    now = now or timezone.now()

    def here() -> DatabaseFigures:
        counted = store.overview.counts(now, COUNTED)
        return DatabaseFigures(
            alias=store.using(),
            health=fleet_health(now),
            runs={status: counted[status] for status in COUNTED},
            lease_expired=counted["lease_expired"],
        )

    return in_each_database(here)
