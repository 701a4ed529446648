"""What the execution admin shows of a run's maps: their sections on the run's page, and the
maps runs on the parked page wait for."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from .. import store
from ..models import Execution, MapRun
from ..states import EventKind, MapStatus
from .display import (
    APP,
    MAP_WAITS,
    progress,
    status_badge,
)

# Counts shown beside a map's progress bar when not zero (the first four always are).
MAP_COUNTS = (
    ("total", _("Total")),
    ("succeeded", _("Succeeded")),
    ("failed", _("Failed")),
    ("pending", _("Pending or running")),
    ("halted", _("Halted")),
    ("not_started", _("Not started")),
    ("undone", _("Undone")),
    ("undoing", _("Being undone")),
    ("undo_failed", _("Undo failed")),
)


def map_sections(request: HttpRequest, obj: Execution) -> list[dict[str, Any]]:
    """Each map step of the run: its summary (a few aggregate queries), progress and links.

    One query reads the run's maps (without their shared arguments); then, per map,
    ``store.maps.summary`` counts the elements by status and samples the first failures.
    """
    runs = list(
        MapRun.objects.filter(execution=obj)
        .order_by("created_at")
        .only(
            "id",
            "step",
            "status",
            "size",
            "fan_out",
            "atomic",
            "max_failures",
            "batch_size",
            "chunk_size",
            "stop_reason",
            "rollback_total",
            "rollback_settled",
            "created_at",
        )
    )
    if not runs:
        return []
    elements_url = ""
    if request.user.has_perm(f"{APP}.view_mapresult"):
        elements_url = reverse(f"admin:{APP}_mapresult_changelist")
    labels = dict(MapStatus.choices)
    sections = []
    for run in runs:
        summary = store.maps.summary(run.pk, run)
        if not summary:  # deleted since the first query
            continue
        total = int(summary["total"])
        pending = int(summary["pending"])
        size = run.size if run.size is not None else total
        # Red: failed elements, and undos that failed.
        bad = int(summary["failed"]) + int(summary["undo_failed"])
        other = max(total - pending - int(summary["succeeded"]) - bad, 0)
        bar = progress(total - pending, size)
        segments = []
        for css, count, label in (
            ("succeeded", int(summary["succeeded"]), _("succeeded")),
            ("failed", bad, _("failed")),
            ("other", other, _("halted, not started or undone")),
        ):
            if count and size:
                width = f"{100.0 * count / size:.3f}"
                segments.append({"css": css, "count": count, "label": label, "width": width})
        counts = [
            {"name": name, "label": label, "value": summary[name]}
            for index, (name, label) in enumerate(MAP_COUNTS)
            if index < 4 or summary[name]
        ]
        link = ""
        failed_link = ""
        if elements_url:
            link = f"{elements_url}?{urlencode({'map_run__id__exact': str(run.pk)})}"
            failed_link = (
                f"{elements_url}?"
                f"{urlencode({'map_run__id__exact': str(run.pk), 'status__exact': 'failed'})}"
            )
        rollback = None
        if run.status in (MapStatus.ROLLING_BACK, MapStatus.ROLLED_BACK) and run.rollback_total:
            rollback = progress(run.rollback_settled, run.rollback_total)
        failures = summary["failures"]
        sections.append(
            {
                "run": run,
                "summary": summary,
                "badge": status_badge(run.status, labels.get(run.status, run.status)),
                "size": run.size,
                "progress": bar,
                "segments": segments,
                "counts": counts,
                "rollback": rollback,
                "failures": failures,
                "more_failures": max(int(summary["failed"]) - len(failures), 0)
                if summary["failures_truncated"]
                else 0,
                "elements_url": link,
                "failed_url": failed_link,
            }
        )
    return sections


def parked_maps(rows: list[Execution]) -> dict[tuple[Any, str], dict[str, Any]]:
    """The counters of the maps a page of parked runs waits for, in one query."""
    ids = [
        row.id
        for row in rows
        if getattr(row, "last_kind", None) == EventKind.PARK
        and (getattr(row, "last_data", None) or {}).get("waiting_for") in MAP_WAITS
    ]
    if not ids:
        return {}
    found = MapRun.objects.filter(execution_id__in=ids).values(
        "execution_id",
        "step",
        "size",
        "settled",
        "status",
        "rollback_total",
        "rollback_settled",
        "created_at",
    )
    return {(m["execution_id"], m["step"]): dict(m) for m in found}


def waiting_since(row: Execution, map_run: dict[str, Any] | None) -> Any:
    """When a parked run began to wait: its map's start, its last park, or its last change."""
    last_at = getattr(row, "last_at", None)  # annotated by the parked view's queryset
    if map_run is not None and (getattr(row, "last_data", None) or {}).get("waiting_for") == "map":
        return map_run["created_at"]
    if getattr(row, "last_kind", None) == EventKind.PARK and last_at is not None:
        return last_at
    return row.updated_at
