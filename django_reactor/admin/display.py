"""How runs, statuses and errors are shown on the admin pages (shared helpers)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..display import short_json
from ..models import Execution
from ..states import EventKind

APP = Execution._meta.app_label

# Trace entries drawn in the error colour, and those drawn as rollback work.
FAILURE_EVENTS = frozenset(
    {
        EventKind.FAIL,
        EventKind.RETRY,
        EventKind.COMPENSATE_FAILED,
        EventKind.UNDO_FAILED,
        EventKind.ATTENTION,
        EventKind.ABORT,
        EventKind.HAND_BACK,
        EventKind.INVALID_PAYLOAD,
        EventKind.EXPIRE,
    }
)
ROLLBACK_EVENTS = frozenset(
    {
        EventKind.COMPENSATE,
        EventKind.COMPENSATE_SKIPPED,
        EventKind.UNDO,
        EventKind.UNDO_SKIPPED,
        EventKind.ROLLBACK,
        EventKind.CANCEL,
    }
)


def status_badge(status: str, label: Any = None) -> SafeString:
    """A coloured badge for an execution, step or interrupt status."""
    return format_html(
        '<span class="reactor-badge reactor-badge-{}">{}</span>', status, label or status
    )


def short_reactor(name: str) -> SafeString:
    """The last part of a reactor's dotted name, with the full name as its title."""
    return format_html('<span title="{}">{}</span>', name, name.rsplit(".", 1)[-1])


def execution_link(execution_id: Any, label: Any = None) -> SafeString:
    """A link to a run's admin page (its short id unless ``label`` is given)."""
    url = reverse(f"admin:{APP}_execution_change", args=[quote(str(execution_id))])
    return format_html('<a href="{}">{}</a>', url, label or str(execution_id)[:8])


MAP_WAITS = ("map", "map rollback")


def waits_for(row: Any, map_run: dict[str, Any] | None = None) -> str:
    """What a parked run waits for, from its last trace entry (``last_kind``/``last_data``);
    ``map_run`` holds the counters of the map it waits for (``MapRun`` values)."""
    data = row.last_data or {}
    if row.last_kind == EventKind.PARK:
        if data.get("waiting_for") in MAP_WAITS:
            return map_wait(getattr(row, "last_step", "") or "", data["waiting_for"], map_run)
        if "waiting_for" in data:
            return f"async unit {data['waiting_for']}"
        if "child_step" in data:
            return f"composed child at {data['child_step']} ({data.get('reason', '')})".replace(
                " ()", ""
            )
        return "an async result"
    if row.last_kind == EventKind.RETRY:
        return "its next attempt"
    return "its wake-up time"


def map_wait(step: str, waiting_for: str, map_run: dict[str, Any] | None) -> str:
    """``map pack: 4 of 10 elements settled``, or its rollback's ``2 of 6 elements undone``."""
    if map_run is None:
        return f"map {step}: its elements" if waiting_for == "map" else f"map {step}: its rollback"
    if waiting_for == "map rollback":
        return (
            f"map {step}: {map_run['rollback_settled']} of {map_run['rollback_total']} "
            "elements undone"
        )
    if map_run["size"] is None:
        return f"map {step}: reading its source"
    return f"map {step}: {map_run['settled']} of {map_run['size']} elements settled"


def progress(done: int, total: int | None) -> dict[str, Any]:
    """A progress bar's numbers: ``done``, ``total`` and the percentage (``0`` to ``100``)."""
    total = total or 0
    done = min(done, total) if total else done
    percent = (100.0 * done / total) if total else 100.0
    return {"done": done, "total": total, "percent": percent, "label": f"{percent:.0f} %"}


def failure_fields(failure: Any) -> list[tuple[Any, Any]]:
    """A run's failure as ``(label, value)`` rows for the run page."""
    if failure is None:
        return []
    rows: list[tuple[Any, Any]] = [(_("kind"), failure.kind)]
    if failure.step:
        rows.append((_("step"), failure.step))
    if failure.exception_class:
        rows.append((_("exception"), failure.exception_class))
    if failure.attempts:
        rows.append((_("attempts"), failure.attempts))
    rows.append((_("message"), failure.message))
    if failure.field_errors:
        rows.append((_("field errors"), short_json(failure.field_errors, 400)))
    if failure.arguments:
        rows.append((_("arguments"), short_json(failure.arguments, 400)))
    return rows


def pretty_json(value: Any) -> str:
    """Indented JSON for a ``<pre>`` block."""
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)
