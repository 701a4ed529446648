"""The overview's health strip and per-reactor table: whether workers and a sweeper are alive,
overdue wake-ups, dispatches no worker took, and each reactor's last hour.

Read through ``services.fleet_health`` (heartbeats, and capped, index-backed counts).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .. import services
from ..display import format_duration
from ..services.health import Health
from ..store.overview import Capped
from .display import short_reactor


def count_text(count: Capped) -> str:
    """``523`` or ``more than 1000``."""
    return str(count.value) if count.exact else f"more than {count.value}"


def _ago(seconds: float) -> str:
    return f"{format_duration(seconds)} ago"


def health_context(now: dt.datetime | None = None) -> dict[str, Any]:
    """The strip's items (``health_items``: each with its name, label, text, whether it is
    bad and what it says next), the problems in words, the processes and the reactors' table."""
    report: Health = services.fleet_health(now or timezone.now())
    sweeper = report.sweeper
    workers_alive = report.workers_alive
    items = [
        {
            "name": "workers",
            "label": _("Workers alive"),
            "text": str(workers_alive),
            "bad": workers_alive == 0,
            "detail": (
                f"of {len(report.workers)} seen in the last day" if report.workers else "none seen"
            ),
        },
        {
            "name": "sweeper",
            "label": _("Sweeper last seen"),
            "text": _ago(sweeper.age) if sweeper else "never",
            "bad": not report.sweeper_ok,
            "detail": (
                f"{sweeper.host}, pid {sweeper.pid}; red past "
                f"{format_duration(sweeper.stale_after)}"
                if sweeper
                else "no sweep in the last day"
            ),
        },
        {
            "name": "overdue",
            "label": _("Overdue wake-ups"),
            "text": count_text(report.overdue),
            "bad": report.overdue.value > 0,
            "detail": f"due more than {format_duration(report.late_after)} ago",
        },
        {
            "name": "not-taken",
            "label": _("Dispatches not taken"),
            "text": count_text(report.not_taken),
            "bad": report.not_taken.value > 0,
            "detail": f"for more than {format_duration(report.late_after)}",
        },
    ]
    return {
        "health": report,
        "health_items": items,
        "health_problems": report.problems,
        "health_processes": [
            {
                "role": p.role,
                "name": p.name or p.host,
                "host": p.host,
                "pid": p.pid,
                "queues": ", ".join(p.queues) or "-",
                "concurrency": p.concurrency if p.concurrency is not None else "-",
                "tasks_done": p.tasks_done if p.role == "worker" else "-",
                "seen": _ago(p.age),
                "alive": p.alive,
                "sweep": (
                    f"{format_duration(p.last_sweep_seconds)}: "
                    + (
                        ", ".join(f"{k} {v}" for k, v in p.last_sweep.items() if v)
                        or "nothing to do"
                    )
                    if p.last_sweep_at is not None
                    else "-"
                ),
            }
            for p in [*report.workers, *report.sweepers]
        ],
        "health_reactors": [
            {
                "reactor": short_reactor(w.reactor),
                "name": w.reactor,
                "started": w.started,
                "completed": w.completed,
                "failed": w.failed,
                "in_flight": w.in_flight,
                "p50": format_duration(w.p50),
                "p95": format_duration(w.p95),
            }
            for w in report.reactors
        ],
        "health_reactors_complete": report.reactors_complete,
        "health_queues": report.queues,
        "health_queues_complete": report.queues_complete,
    }
