"""The overview page: how the runs are doing now, on one page.

Runs that ended in the last hour or day by status (a chart), throughput and failure rate,
runs in flight by status, stuck runs, runs needing attention, the oldest waiting interrupts
and the outbox's depth. Everything is read through ``store.overview`` (capped counts and index
ranges: the page costs the same at a thousand runs or a million).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.formats import number_format
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from .. import services, store
from ..display import duration_seconds, format_duration, stuck_reason
from ..engine.outcomes import ErrorInfo
from ..models import Dispatch
from ..states import ExecutionStatus
from ..store.overview import Capped
from .charts import STACK_ORDER, Bar, legend, stacked_bars
from .display import APP, execution_link, short_reactor, status_badge_of

#: The chart's windows: their length, their bars' length, and how often a bar is labelled.
WINDOWS: dict[str, tuple[dt.timedelta, dt.timedelta, int]] = {
    "hour": (dt.timedelta(hours=1), dt.timedelta(minutes=5), 2),
    "day": (dt.timedelta(days=1), dt.timedelta(hours=1), 3),
}
WINDOW_LABELS = {"hour": _("Last hour"), "day": _("Last day")}

#: Statuses of runs in flight, shown as counts.
IN_FLIGHT = (
    ExecutionStatus.PENDING,
    ExecutionStatus.RUNNING,
    ExecutionStatus.PAUSED,
    ExecutionStatus.SUSPENDED,
    ExecutionStatus.ROLLING_BACK,
)
#: Statuses counted as failures in the failure rate.
FAILURES = (ExecutionStatus.FAILED, ExecutionStatus.NEEDS_ATTENTION)

#: Rows of each list on the page.
LIST_ROWS = 10
#: A running run is stuck when it has run this many times longer than its reactor's usual
#: (95th percentile of its runs completed in the last day), and at least STUCK_MIN long.
STUCK_FACTOR = 3
STUCK_MIN = dt.timedelta(minutes=1)
#: The oldest running runs looked at for "longer than usual".
STUCK_CANDIDATES = 50


def count_text(count: Capped) -> str:
    """``523`` or ``more than 10,000``."""
    number = number_format(count.value, force_grouping=True)
    return number if count.exact else str(_("more than %(number)s") % {"number": number})


def _changelist(**params: str) -> str:
    url = reverse(f"admin:{APP}_execution_changelist")
    return f"{url}?{urlencode(params)}" if params else url


def _ago(now: dt.datetime, moment: dt.datetime | None) -> str:
    return format_duration(duration_seconds(moment, now))


@dataclass(frozen=True)
class Figures:
    """Runs that ended in a span: by status, per minute, and the share that failed."""

    minutes: float
    totals: dict[str, int]
    complete: bool = True

    @property
    def ended(self) -> int:
        return sum(self.totals.values())

    def ended_text(self) -> str:
        """``523``, or ``more than 50,000`` when the span was counted back to its cap."""
        return count_text(Capped(self.ended, self.complete))

    @property
    def failed(self) -> int:
        return sum(self.totals.get(s, 0) for s in FAILURES)

    def per_minute(self) -> str:
        """Runs that ended per minute: ``0``, ``0.0069``, ``0.2``, ``5.5``, ``1,234``."""
        rate = self.ended / self.minutes if self.minutes > 0 else 0.0
        return f"{rate:.2g}" if rate < 10 else f"{rate:,.0f}"

    def failure_rate(self) -> str:
        if not self.ended:
            return "-"
        return f"{100 * self.failed / self.ended:.1f} %"


def _floor(moment: dt.datetime, step: dt.timedelta) -> dt.datetime:
    seconds = int(step.total_seconds())
    epoch = int(moment.timestamp())
    return dt.datetime.fromtimestamp(epoch - epoch % seconds, tz=dt.UTC)


def chart_bars(
    ended: store.overview.Ended, now: dt.datetime, window: str
) -> tuple[list[Bar], dt.datetime]:
    """The bars of ``window`` (the last one is the bar in progress), and where they start."""
    length, step, every = WINDOWS[window]
    count = int(length / step)
    last = _floor(now, step)
    start = last - step * (count - 1)
    per_bar: list[dict[str, int]] = [{} for _ in range(count)]
    for bucket, by_status in ended.buckets.items():
        index = int((bucket - start) / step) if bucket >= start else -1
        if 0 <= index < count:
            counts = per_bar[index]
            for status, n in by_status.items():
                counts[status] = counts.get(status, 0) + n
    bars = []
    for index in range(count):
        begin = start + step * index
        end = begin + step
        local_begin, local_end = timezone.localtime(begin), timezone.localtime(end)
        title = f"{local_begin:%H:%M}-{local_end:%H:%M}"
        if window == "day":
            title = f"{local_begin:%a %H:%M}-{local_end:%H:%M}"
        counts = per_bar[index]
        bars.append(
            Bar(
                label=f"{local_begin:%H:%M}",
                title=title,
                counts=counts,
                tick=(count - 1 - index) % every == 0,
                counted=end > ended.counted_from,
            )
        )
    return bars, start


def overview_context(window: str, now: dt.datetime | None = None) -> dict[str, Any]:
    """Everything the overview page shows (``window``: ``"hour"`` or ``"day"``)."""
    now = now or timezone.now()
    labels = dict(ExecutionStatus.choices)
    # The last hour by minute (its figures, its chart's 5-minute bars), the day by hour: each
    # a few hundred rows at most, however many runs ended.
    hour_start = _floor(now, WINDOWS["hour"][1]) - WINDOWS["hour"][0]
    day_start = _floor(now, WINDOWS["day"][1]) - WINDOWS["day"][1] * 23
    by_minute = store.overview.ended(hour_start, now, "minute")
    by_hour = store.overview.ended(day_start, now, "hour")
    ended = by_minute if window == "hour" else by_hour

    bars, start = chart_bars(ended, now, window)
    statuses = [s for s in STACK_ORDER if any(s in b.counts for b in bars)]
    statuses += sorted({s for b in bars for s in b.counts} - set(statuses))
    series = [(s, str(labels.get(s, s))) for s in statuses]
    window_totals = ended.total(start)
    chart = stacked_bars(
        bars,
        series,
        label=str(_("Runs that ended, by status: %(window)s") % {"window": WINDOW_LABELS[window]}),
    )

    def figures(read: store.overview.Ended, since: dt.datetime) -> Figures:
        counted_from = max(since, read.counted_from)
        minutes = max((now - counted_from).total_seconds() / 60, 1.0)
        return Figures(minutes, read.total(counted_from), complete=read.counted_from <= since)

    hour, day = figures(by_minute, now - WINDOWS["hour"][0]), figures(by_hour, day_start)

    counted = store.overview.counts(now, [*IN_FLIGHT, ExecutionStatus.NEEDS_ATTENTION])
    expired = store.overview.lease_expired(now, LIST_ROWS)
    attention = store.overview.needing_attention(LIST_ROWS)
    waiting = store.overview.waiting_interrupts(LIST_ROWS)
    outbox = store.overview.outbox_depth(now, LIST_ROWS)
    slow = _longer_than_usual(now)
    reasons = dict(Dispatch.Reason.choices)

    return {
        "window": window,
        "windows": [
            {"name": name, "label": label, "url": "?" + urlencode({"window": name})}
            for name, label in WINDOW_LABELS.items()
        ],
        "window_label": WINDOW_LABELS[window],
        "now": now,
        "chart": chart,
        "legend": legend([(s, label, window_totals.get(s, 0)) for s, label in series]),
        "chart_empty": not window_totals,
        "chart_complete": ended.complete or ended.counted_from <= start,
        "counted_from": ended.counted_from,
        "ended_cap": store.overview.ENDED_CAP,
        "hour": hour,
        "day": day,
        "in_flight": [
            {
                "status": status,
                "label": labels[status],
                "count": count_text(counted[status]),
                "value": counted[status].value,
                "url": _changelist(status__exact=status),
            }
            for status in IN_FLIGHT
        ],
        "attention_count": count_text(counted[ExecutionStatus.NEEDS_ATTENTION]),
        "attention_url": _changelist(status__exact=ExecutionStatus.NEEDS_ATTENTION),
        "attention": [
            {
                "link": execution_link(row.pk),
                "reactor": short_reactor(row.reactor),
                "step": row.current_step,
                "since": _ago(now, row.updated_at),
                "message": _failure_message(row.failure),
            }
            for row in attention
        ],
        "expired_count": count_text(counted["lease_expired"]),
        "expired": [
            {
                "link": execution_link(row.pk),
                "reactor": short_reactor(row.reactor),
                "badge": status_badge_of(row),
                "step": row.current_step,
                "owner": row.lease_owner or "-",
                "expired": _ago(now, row.lease_expires_at),
                "recoveries": row.recovery_attempts,
            }
            for row in expired
        ],
        "slow": slow,
        "past_timeout": [
            {
                "link": execution_link(run.execution_id),
                "reactor": short_reactor(run.reactor),
                "step": run.step,
                "why": stuck_reason(run),
            }
            for run in services.stuck.past_timeout(LIST_ROWS, now)
        ],
        "stuck_factor": STUCK_FACTOR,
        "stuck_min": format_duration(STUCK_MIN.total_seconds()),
        "waiting_count": count_text(counted["waiting"]),
        "waiting": [
            {
                "link": execution_link(row.execution_id),
                "reactor": short_reactor(row.reactor),
                "step": row.step,
                "correlation_id": row.correlation_id or "-",
                "waiting": _ago(now, row.created_at),
                "expires": row.expires_at,
            }
            for row in waiting
        ],
        "waiting_url": reverse(f"admin:{APP}_execution_parked"),
        "outbox": outbox,
        "outbox_count": count_text(counted["unsent"]),
        "outbox_complete": counted["unsent"].exact and outbox.examined == counted["unsent"].value,
        "outbox_rows": [
            {
                "link": execution_link(row.execution_id),
                "reason": reasons.get(row.reason, row.reason),
                "age": _ago(now, row.created_at),
                "not_before": row.not_before,
                "due": row.not_before is None or row.not_before <= now,
            }
            for row in outbox.oldest
        ],
        "outbox_url": reverse(f"admin:{APP}_dispatch_changelist") + "?sent=no",
    }


def _failure_message(failure: Any) -> str:
    if not failure:
        return ""
    try:
        return ErrorInfo.from_dict(failure).message
    except (TypeError, ValueError, KeyError):
        return str(failure)[:200]


def _longer_than_usual(now: dt.datetime) -> list[dict[str, Any]]:
    """Running runs (lease alive) in flight much longer than their reactor's runs usually take."""
    candidates = [
        row
        for row in store.overview.oldest_running(STUCK_CANDIDATES)
        # Those whose lease expired are listed as such.
        if row.lease_expires_at is None or row.lease_expires_at >= now
    ]
    usual = store.overview.usual_durations(now - dt.timedelta(days=1)) if candidates else {}
    rows = []
    for row in candidates:
        typical = usual.get(row.reactor)
        since = row.started_at or row.created_at
        age = duration_seconds(since, now) or 0.0
        if typical is None or age < max(STUCK_FACTOR * typical, STUCK_MIN.total_seconds()):
            continue
        rows.append(
            {
                "link": execution_link(row.pk),
                "reactor": short_reactor(row.reactor),
                "step": row.current_step,
                "running": format_duration(age),
                "usual": format_duration(typical),
                "owner": row.lease_owner or "-",
            }
        )
        if len(rows) >= LIST_ROWS:
            break
    return rows
