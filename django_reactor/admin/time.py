"""What a run's page says about time: what it waits for (a sleep, its start, a wake-up), its
deadline and the last heartbeat of its step in flight."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from ..display import format_duration, short_json
from ..models import Execution
from ..states import ExecutionStatus, StepStatus
from .display import moment


def waits_for_time(row: Execution, records: Sequence[Any]) -> dict[str, Any] | None:
    """What the run waits for, when it waits for a time nobody else will bring closer: a sleep,
    its scheduled start, or a wake-up (a retry's backoff, a park). None otherwise."""
    if row.wake_at is None or row.lease_owner is not None:
        return None
    if row.status == ExecutionStatus.SCHEDULED:
        return {
            "label": _("Starts at"),
            "until": row.wake_at,
            "wake_help": _("Start the run now instead of at its time."),
        }
    if row.status != ExecutionStatus.PENDING:
        return None
    sleeping = [r.step for r in records if r.status == StepStatus.SLEEPING]
    if sleeping:
        return {
            "label": _("Sleeping until"),
            "step": sleeping[0],
            "until": row.wake_at,
            "wake_help": _("End the sleep now: a worker takes the run at once."),
        }
    return {
        "label": _("Wakes up at"),
        "until": row.wake_at,
        "wake_help": _("Do not wait for the wake-up time: a worker takes the run now."),
    }


def time_facts(row: Execution, waits: dict[str, Any] | None) -> list[tuple[str, SafeString]]:
    """Rows of the page's Time section (empty when the run has nothing to say about time)."""
    now = timezone.now()
    facts: list[tuple[str, SafeString]] = []
    if waits is not None:
        text = format_html("{} ({})", moment(waits["until"]), _from_now(waits["until"], now))
        if waits.get("step"):
            text = format_html("{} · {}", text, _("step %(step)s") % {"step": waits["step"]})
        facts.append((str(waits["label"]), text))
    if row.deadline_at is not None:
        text = format_html("{} ({})", moment(row.deadline_at), _from_now(row.deadline_at, now))
        facts.append((_("Deadline"), text))
    beat = row.heartbeat
    if isinstance(beat, dict) and row.status in (ExecutionStatus.RUNNING, ExecutionStatus.PENDING):
        at = _parse(beat.get("at"))
        if at is not None:
            text = format_html("{} · {} ({})", beat.get("step", ""), moment(at), _from_now(at, now))
        else:
            text = format_html("{} · {}", beat.get("step", ""), beat.get("at", ""))
        if beat.get("details") is not None:
            text = format_html("{} · {}", text, short_json(beat["details"], 200))
        facts.append((_("Last heartbeat"), text))
    return facts


def _from_now(moment: dt.datetime, now: dt.datetime) -> str:
    seconds = (moment - now).total_seconds()
    if seconds >= 0:
        return _("in %(duration)s") % {"duration": format_duration(seconds)}
    return _("%(duration)s ago") % {"duration": format_duration(-seconds)}


def _parse(text: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(text))
    except ValueError:
        return None
