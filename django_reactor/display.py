"""Plain-text rendering of a stored execution, for commands, logs, the admin and the API.

Also the one definition of a run's and a step's duration (:func:`duration_seconds`) and the one
way to write a duration (:func:`format_duration`), shared by every face.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from .engine.redaction import redact
from .handle import ExecutionHandle
from .states import EventKind

_STEP_LINES: dict[str, str] = {
    EventKind.RUN: "ran",
    EventKind.SKIP: "skipped",
    EventKind.HALT: "halted",
    EventKind.RETRY: "attempt failed",
    EventKind.FAIL: "FAILED",
    EventKind.COMPENSATE: "compensated",
    EventKind.COMPENSATE_FAILED: "compensation FAILED",
    EventKind.COMPENSATE_SKIPPED: "nothing to compensate (no compensate defined)",
    EventKind.UNDO: "undone",
    EventKind.UNDO_FAILED: "undo FAILED",
    EventKind.UNDO_SKIPPED: "nothing to undo (no undo defined)",
    EventKind.HAND_BACK: "worker interrupted mid-step; handed back to run again",
}

_RUN_LINES: dict[str, str] = {
    EventKind.START: "run started",
    EventKind.COMPLETE: "run completed",
    EventKind.FAIL: "run failed",
    EventKind.ABORT: "run aborted",
    EventKind.HAND_BACK: "worker interrupted; run handed back to another worker",
    EventKind.CANCEL: "run cancelled",
    EventKind.ROLLBACK: "rollback started",
    EventKind.RERUN: "retried as a new execution",
    EventKind.SUSPEND: "suspended by a pause",
    EventKind.UNPAUSE: "unpaused",
    EventKind.FORK: "forked as a new execution",
    EventKind.CONTINUE: "continued as a new execution",
    EventKind.QUEUE: "queued for its concurrency key",
    EventKind.ADMIT: "admitted by its concurrency key",
    EventKind.THROTTLE: "delayed by its throttle",
    EventKind.DEBOUNCE: "started again: collapsed into this run",
    EventKind.BATCH: "an item joined this batch",
}

#: What a ``steer`` entry says, by its action.
_STEER_LINES: dict[str, str] = {
    "wake": "woken now",
    "resume": "payload delivered",
    "migrate": "moved onto the deployed definition",
}


def duration_seconds(
    started_at: dt.datetime | None, finished_at: dt.datetime | None
) -> float | None:
    """How long a run or a step took, in seconds: from its ``started_at`` to its ``finished_at``.

    Wall-clock time, waits included (a worker's queue is not: a run starts when it is first
    claimed or run inline). None until both are known: a run or step still going, or one that
    ended without starting (a pending run cancelled). Never negative (clocks of two machines).
    """
    if started_at is None or finished_at is None:
        return None
    return max((finished_at - started_at).total_seconds(), 0.0)


def format_duration(seconds: float | None) -> str:
    """A duration as people read it: ``0.4 ms``, ``12 ms``, ``1.3 s``, ``1 min 05 s``,
    ``2 h 05 min``, ``3 d 04 h``; ``-`` when unknown (None)."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    millis = seconds * 1000
    # Each unit's rounding is checked against the next unit's start: 999.7 ms is "1.0 s".
    if round(millis, 1) < 10:
        return f"{millis:.1f} ms"
    if round(millis) < 1000:
        return f"{millis:.0f} ms"
    if round(seconds, 1) < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


def short_json(value: Any, limit: int = 90) -> str:
    """Compact JSON of ``value``, cut to ``limit`` characters."""
    text = json.dumps(value, default=str, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def trace_lines(handle: ExecutionHandle) -> list[str]:
    """One line per trace event: what happened to which step, with results and errors."""
    results = {view.name: view.result for view in handle.steps}
    lines = []
    for event in handle.trace:
        if event.step:
            what = _STEP_LINES.get(event.kind, event.kind)
            line = f"{event.step:<14} {what}"
            if event.kind in (EventKind.RUN, EventKind.SKIP) and event.step in results:
                line += f" -> {short_json(results[event.step])}"
            if event.attempt > 1 or event.kind == EventKind.RETRY:
                line += f" (attempt {event.attempt})"
            if "error" in event.data:
                line += f": {event.data['error']}"
            if event.kind == EventKind.RETRY:
                line += f"; retrying in {format_duration(event.data.get('delay', 0))}"
            if event.kind == EventKind.HALT:
                line += f": {event.data.get('reason')}"
            if event.kind == EventKind.ACQUIRE:
                line += f" {_acquired(event.data)}"
        else:
            line = _RUN_LINES.get(event.kind, event.kind)
            if event.kind == EventKind.STEER:
                action = str(event.data.get("action", ""))
                line = _STEER_LINES.get(action, action)
                if event.data.get("step"):
                    line += f" to {event.data['step']}"
                if event.data.get("reason"):
                    line += f" ({event.data['reason']})"
            elif event.kind == EventKind.ACQUIRE:
                line = f"acquired {_acquired(event.data)}"
            elif event.kind == EventKind.LAUNCH:
                line = f"started side by side: {', '.join(event.data.get('steps', []))}"
                if event.data.get("alongside"):
                    line += f" (alongside {', '.join(event.data['alongside'])})"
            elif event.data.get("reason"):
                line += f" ({event.data['reason']})"
            if event.kind == EventKind.CONTINUE:
                line += f": {event.data.get('continued_as')}"
            if event.kind == EventKind.START and event.data.get("continued_from"):
                line += (
                    f" (continues {event.data['continued_from']}, "
                    f"generation {event.data.get('generation')})"
                )
            if event.kind == EventKind.BATCH:
                line += f" ({event.data.get('size')} of {event.data.get('max_size')} items)"
            if event.kind in (EventKind.THROTTLE, EventKind.DEBOUNCE, EventKind.BATCH):
                line += f"; starts at {event.data.get('start_at')}"
            if event.kind == EventKind.SUSPEND and event.data.get("reactor_paused"):
                line += " [its reactor is paused]"
        if event.data.get("by"):
            line += f" by {event.data['by']} via {event.data.get('via', '?')}"
        if event.duration_ms is not None:
            line += f"  [{format_duration(event.duration_ms / 1000)}]"
        lines.append(line)
    return lines


def _acquired(data: dict[str, Any]) -> str:
    """What an ``acquire`` entry took: ``lock 'order-7' (fence 12)``."""
    if "lock" in data:
        return f"lock {data['lock']!r} (fence {data.get('fence')})"
    if "semaphore" in data:
        return f"semaphore {data['semaphore']!r} ({data.get('holders')} holding)"
    if "rate_limit" in data:
        return f"rate limit {data['rate_limit']!r}"
    if "period" in data:
        return f"period {data['period']!r} ({data.get('bucket')})"
    return short_json(data)


def summary_lines(handle: ExecutionHandle) -> list[str]:
    """Header, inputs (redacted), trace and ending of one execution."""
    lines = [
        f"{handle.reactor}  execution {handle.id}",
        f"status: {handle.status}",
        f"inputs: {short_json(redact(handle.inputs, []), 200)}",
    ]
    lines.extend(f"  {line}" for line in trace_lines(handle))
    error = handle.error
    if error is not None:
        lines.append(f"failure: {error}")
        for failure in error.rollback_failures:
            lines.append(f"  could not {failure.action} {failure.step}: {failure.message}")
    return lines


def stuck_reason(run: Any) -> str:
    """Why a run is stuck (a ``services.StuckRun``), as the overview and ``reactor_list
    --stuck`` say it."""
    if run.kind == "lease_expired":
        return (
            f"its lease expired {format_duration(run.seconds)} ago (owner {run.owner or '-'}): "
            "its process is gone; the sweeper hands it to a worker"
        )
    return (
        f"step {run.step} in flight for {format_duration(run.seconds)}, longer than its timeout "
        f"({format_duration(run.timeout)})"
    )
