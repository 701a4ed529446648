"""A run's timeline: a Gantt chart of its trace, drawn on the server as SVG.

One lane for the run (hand-offs to workers, resumes, the rollback) and one per step: each
attempt is a bar (its body's duration, ending at its trace entry), a retry's backoff and a
park or a pause are dashed waits up to what ended them, and the rollback's undo and compensate
calls are bars of their own. Built from the trace (``store.event_rows``: event rows and the
step records that stand for their entries) and the step records (``store.step_rows``, for when
a failed step started), so it shows exactly what the trace says.

Long waits (a retry's backoff of minutes between millisecond steps, a pause of days) are drawn
shortened, with their length written on them: the time axis is cut where nothing ran for much
longer than the longest step took.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from ..display import format_duration
from ..states import EventKind

#: Trace entries drawn at most (a longer trace is drawn up to there, and says so).
MAX_EVENTS = 2_000

RUN_LANE = ""

#: Entries that are a step attempt's body, and how its bar is drawn.
ATTEMPTS = {
    EventKind.RUN: "run",
    EventKind.SKIP: "skip",
    EventKind.HALT: "halt",
    EventKind.RETRY: "retry",
    EventKind.FAIL: "fail",
}
#: Entries that are a rollback call.
ROLLBACKS = {
    EventKind.UNDO: "undo",
    EventKind.COMPENSATE: "compensate",
    EventKind.UNDO_FAILED: "rollback-failed",
    EventKind.COMPENSATE_FAILED: "rollback-failed",
}
#: Rollback entries of a step without a handler (nothing ran).
SKIPPED_ROLLBACKS = (EventKind.UNDO_SKIPPED, EventKind.COMPENSATE_SKIPPED)
#: Entries drawn as a mark at their moment (on their step's lane, or the run's).
MARKS = {
    EventKind.START: "start",
    EventKind.COMPLETE: "complete",
    EventKind.CANCEL: "cancel",
    EventKind.ABORT: "fail",
    EventKind.ATTENTION: "fail",
    EventKind.HAND_BACK: "fail",
    EventKind.RERUN: "start",
    EventKind.CONTINUE: "complete",
    EventKind.RESUME: "resume",
    EventKind.DISPATCH: "dispatch",
    EventKind.MAP: "dispatch",
    EventKind.ACQUIRE: "acquire",
    EventKind.PAYLOAD: "resume",
    EventKind.STEER: "resume",
    EventKind.INVALID_PAYLOAD: "fail",
    EventKind.EXPIRE: "fail",
    EventKind.UNDO_SKIPPED: "skip",
    EventKind.COMPENSATE_SKIPPED: "skip",
    EventKind.ROLLBACK: "rollback",
}

LABEL_W, PLOT_W, ROW_H, AXIS_H, GAP_W, MIN_BAR = 170, 780, 24, 26, 44, 3.0
#: A stretch with nothing running is cut when it is longer than this (seconds), than ten times
#: the longest bar and than a fifth of the run: a backoff of seconds between millisecond steps
#: is cut, the milliseconds between two steps' commits never are.
MIN_CUT = 0.1
#: The least room between two labels of the time axis (px), and about how wide one character
#: of a label is (10 px text; the server has no font metrics: a generous estimate).
TICK_GAP = 10
CHAR_W = 6.5
#: Steps of the time axis from a second up (seconds): whole seconds, minutes, hours and days.
TIME_STEPS = (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200, 86400, 172800, 432000, 864000,
)  # fmt: skip


@dataclass
class Item:
    """A bar (``end`` after ``start``), a wait (``wait``) or a mark (``start == end``)."""

    lane: str
    kind: str
    start: dt.datetime
    end: dt.datetime
    title: str
    attempt: int = 0
    wait: bool = False
    mark: bool = False

    @property
    def ms(self) -> float:
        return (self.end - self.start).total_seconds() * 1000


@dataclass
class Timeline:
    """The lanes (the run's first, then the steps in the order they first appear) and items."""

    lanes: list[str] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    origin: dt.datetime | None = None
    end: dt.datetime | None = None
    cut: int = 0

    def lane(self, name: str) -> str:
        if name not in self.lanes:
            self.lanes.append(name)
        return name


def _ms(value: float | None) -> dt.timedelta:
    return dt.timedelta(milliseconds=value or 0.0)


def build(
    events: Sequence[Any],
    steps: Sequence[Any],
    *,
    now: dt.datetime,
    moving: bool,
    labels: Mapping[str, Any],
) -> Timeline:
    """The timeline of a run's trace ``events`` (``ExecutionEvent`` rows in sequence order),
    its step records ``steps`` (``RecordedStep``) and, for a run still moving or waiting,
    ``now``."""
    timeline = Timeline(lanes=[RUN_LANE])
    if not events:
        return timeline
    timeline.cut = max(len(events) - MAX_EVENTS, 0)
    events = list(events[:MAX_EVENTS])
    started = {row.step: row.started_at for row in steps}
    timeline.origin = origin = events[0].at
    last = max(event.at for event in events)
    end = max(now, last) if moving else last
    timeline.end = end
    previous_at = origin
    # A step's last retry (its backoff ends where its next attempt starts).
    backoff: dict[str, tuple[dt.datetime, float, int]] = {}
    # When the rollback's calls started and ended.
    rolled_back: list[dt.datetime] = []
    # Waits in progress by lane: a hand-off (run lane), a park, an interrupt waiting.
    waiting: dict[tuple[str, str], tuple[dt.datetime, str]] = {}

    def close(lane: str, what: str, at: dt.datetime) -> None:
        begun = waiting.pop((lane, what), None)
        if begun is not None:
            timeline.items.append(
                Item(lane, what, begun[0], max(at, begun[0]), begun[1], wait=True)
            )

    for event in events:
        kind, step, at = event.kind, event.step or "", event.at
        label = labels.get(kind, kind)
        lane = timeline.lane(step) if step else RUN_LANE
        data = event.data or {}
        detail = _detail(data)
        if kind in ROLLBACKS or kind in SKIPPED_ROLLBACKS or kind == EventKind.ROLLBACK:
            rolled_back.append(at - _ms(event.duration_ms) if event.duration_ms else at)
            rolled_back.append(at)
        if kind in ATTEMPTS and step:
            if step in backoff:
                retried_at, delay, attempt = backoff.pop(step)
                start = at - _ms(event.duration_ms) if event.duration_ms is not None else at
                start = max(start, retried_at)
                timeline.items.append(
                    Item(
                        lane,
                        "backoff",
                        retried_at,
                        start,
                        f"{step}: backoff after attempt {attempt} "
                        f"(planned {format_duration(delay)})",
                        wait=True,
                    )
                )
            close(lane, "park", at)
            if event.duration_ms is not None:
                start = at - _ms(event.duration_ms)
            elif event.attempt <= 1 and started.get(step) is not None:
                start = started[step]
            else:
                start = previous_at
            start = min(max(start, origin), at)
            duration = format_duration((at - start).total_seconds())
            what = f"{step}: {label}" if step else str(label)
            if event.attempt:
                what += f", attempt {event.attempt}"
            timeline.items.append(
                Item(
                    lane,
                    ATTEMPTS[kind],
                    start,
                    at,
                    f"{what} · {duration}{detail}",
                    attempt=event.attempt,
                )
            )
            if kind == EventKind.RETRY and float(data.get("delay") or 0.0) > 0:
                backoff[step] = (at, float(data["delay"]), event.attempt)
        elif kind in ROLLBACKS:
            start = min(max(at - _ms(event.duration_ms), origin), at)
            duration = format_duration((at - start).total_seconds())
            timeline.items.append(
                Item(lane, ROLLBACKS[kind], start, at, f"{step}: {label} · {duration}{detail}")
            )
        else:
            if kind == EventKind.HANDOFF:
                waiting[(RUN_LANE, "handoff")] = (at, str(_("waiting for a worker")))
            elif kind == EventKind.RESUME:
                close(RUN_LANE, "handoff", at)
                for key in [k for k in waiting if k[1] == "park"]:
                    close(key[0], "park", at)
            elif kind == EventKind.PARK:
                reason = data.get("reason") or data.get("waiting_for") or "an async result"
                waiting[(lane, "park")] = (at, f"{step or 'run'}: parked, waiting for {reason}")
            elif kind == EventKind.INTERRUPT:
                waiting[(lane, "pause")] = (at, f"{step}: waiting for a payload")
            elif kind in (EventKind.PAYLOAD, EventKind.EXPIRE):
                close(lane, "pause", at)
            if kind in MARKS or kind in ATTEMPTS:
                title = f"{step}: {label}" if step else str(label)
                mark = MARKS.get(kind) or ATTEMPTS[kind]
                timeline.items.append(Item(lane, mark, at, at, f"{title}{detail}", mark=True))
        previous_at = at
    for (lane, what), _begun in list(waiting.items()):
        close(lane, what, end)
    if rolled_back:
        first, last_call = min(rolled_back), max(rolled_back)
        timeline.items.append(
            Item(
                RUN_LANE,
                "rollback",
                first,
                last_call,
                f"{_('rollback')} · {format_duration((last_call - first).total_seconds())}",
                wait=True,
            )
        )
    for step, (retried_at, delay, attempt) in backoff.items():
        if moving:
            timeline.items.append(
                Item(
                    step,
                    "backoff",
                    retried_at,
                    max(end, retried_at),
                    f"{step}: backoff after attempt {attempt} (planned {format_duration(delay)})",
                    wait=True,
                )
            )
    return timeline


def _detail(data: dict[str, Any]) -> str:
    """What an entry's data adds to its tooltip: the error, who steered, a reason, a delay."""
    parts = []
    if data.get("exception_class") or data.get("error"):
        parts.append(
            ": ".join(str(p) for p in (data.get("exception_class"), data.get("error")) if p)
        )
    if data.get("by"):
        parts.append(f"by {data['by']} via {data.get('via', '?')}")
    if data.get("reason"):
        parts.append(f"reason: {data['reason']}")
    if data.get("delay"):
        parts.append(f"next attempt in {format_duration(float(data['delay']))}")
    return "".join(f" · {p}" for p in parts)


# ---------------------------------------------------------------------------- drawing


@dataclass(frozen=True)
class Segment:
    """A stretch of the time axis: drawn to scale, or cut (``cut``: a fixed width)."""

    start: dt.datetime
    end: dt.datetime
    x: float
    width: float
    cut: bool


def axis(timeline: Timeline) -> list[Segment]:
    """The time axis: stretches where nothing ran for far longer than the longest bar are cut
    to a fixed width, the rest share the plot's width in proportion to their length."""
    assert timeline.origin is not None
    assert timeline.end is not None
    origin, end = timeline.origin, timeline.end
    span = (end - origin).total_seconds()
    busy = sorted((i.start, i.end) for i in timeline.items if not i.wait) or [(origin, origin)]
    longest = max((i.ms for i in timeline.items if not i.wait and not i.mark), default=0.0)
    threshold = max(MIN_CUT, 10 * longest / 1000, 0.2 * span)
    cuts: list[tuple[dt.datetime, dt.datetime]] = []
    reached = origin
    for start, stop in [*busy, (end, end)]:
        if (start - reached).total_seconds() > threshold:
            cuts.append((reached, start))
        reached = max(reached, stop)
    linear = span - sum((b - a).total_seconds() for a, b in cuts)
    if linear <= 0:  # nothing ran but at single moments: draw it all to scale
        cuts, linear = [], span
    width = PLOT_W - GAP_W * len(cuts)
    scale = width / linear if linear > 0 else 0.0
    segments: list[Segment] = []
    x, at = float(LABEL_W), origin
    for start, stop in [*cuts, (end, end)]:
        length = (start - at).total_seconds()
        if length > 0 or not segments:
            w = length * scale if scale else (width if not cuts else 0.0)
            segments.append(Segment(at, start, x, w, False))
            x += w
        if stop > start:
            segments.append(Segment(start, stop, x, GAP_W, True))
            x += GAP_W
        at = stop
    return segments


def _x(segments: list[Segment], moment: dt.datetime) -> float:
    for segment in segments:
        if moment <= segment.end or segment is segments[-1]:
            length = (segment.end - segment.start).total_seconds()
            if length <= 0:
                return segment.x
            share = min(max((moment - segment.start).total_seconds() / length, 0.0), 1.0)
            return segment.x + share * segment.width
    return float(LABEL_W)  # pragma: no cover - the last segment always answers


def render(timeline: Timeline) -> SafeString:
    """The timeline as an SVG (empty when the trace is)."""
    if timeline.origin is None or timeline.end is None:
        return mark_safe("")
    origin = timeline.origin
    segments = axis(timeline)
    height = AXIS_H + ROW_H * len(timeline.lanes) + 6
    width = LABEL_W + PLOT_W + 10
    parts: list[str] = []
    for index, lane in enumerate(timeline.lanes):
        y = AXIS_H + ROW_H * index
        name = lane or str(_("run"))
        shown = name if len(name) <= 24 else name[:23] + "…"
        parts.append(
            format_html(
                '<rect class="reactor-tl-row{}" x="0" y="{}" width="{}" height="{}"/>'
                '<text class="reactor-tl-lane" x="6" y="{}"><title>{}</title>{}</text>',
                " reactor-tl-row-odd" if index % 2 else "",
                y,
                width,
                ROW_H,
                y + ROW_H / 2 + 4,
                name,
                shown,
            )
        )
    labels = AxisLabels(right=width - 2)
    for segment in segments:
        if segment.cut:
            text = format_duration((segment.end - segment.start).total_seconds())
            labels.place(segment.x + GAP_W / 2, text, repeat=True)  # a length: always drawn
            parts.append(
                format_html(
                    '<g class="reactor-tl-cut"><rect x="{}" y="{}" width="{}" height="{}"/>'
                    '<text x="{}" y="{}" text-anchor="middle">{}</text>'
                    "<title>{}</title></g>",
                    _n(segment.x),
                    AXIS_H,
                    GAP_W,
                    ROW_H * len(timeline.lanes),
                    _n(segment.x + GAP_W / 2),
                    AXIS_H - 8,
                    text,
                    _("%(length)s with nothing running, drawn shortened") % {"length": text},
                )
            )
    for segment in segments:
        if not segment.cut:
            for x, offset in _ticks(segment, origin):
                text = f"+{format_duration(offset)}"
                placed = labels.place(x, text)
                if placed is not None:
                    parts.append(_tick(x, text, *placed))
    lane_index = {lane: i for i, lane in enumerate(timeline.lanes)}
    for item in sorted(timeline.items, key=lambda i: (i.wait is False, i.mark)):
        y = AXIS_H + ROW_H * lane_index[item.lane]
        x0 = _x(segments, item.start)
        since = format_duration((item.start - origin).total_seconds())
        at = timezone.localtime(item.start).strftime("%H:%M:%S.%f")[:-3]
        common = format_html(
            'data-lane="{}" data-kind="{}" data-attempt="{}" data-start-ms="{}" '
            'data-duration-ms="{}"',
            item.lane or "run",
            item.kind,
            item.attempt,
            f"{(item.start - origin).total_seconds() * 1000:.3f}",
            f"{item.ms:.3f}",
        )
        title = f"{item.title} · at +{since} ({at})"
        if item.mark:
            parts.append(
                format_html(
                    '<path class="reactor-tl-mark reactor-tl-{}" {} d="M{} {}l5 7l-5 7l-5 -7z">'
                    "<title>{}</title></path>",
                    item.kind,
                    common,
                    _n(x0),
                    y + ROW_H / 2 - 7,
                    title,
                )
            )
            continue
        x1 = _x(segments, item.end)
        w = max(x1 - x0, MIN_BAR)
        top, h = (y + 8, ROW_H - 16) if item.wait else (y + 4, ROW_H - 8)
        parts.append(
            format_html(
                '<rect class="reactor-tl-bar reactor-tl-{}{}" {} x="{}" y="{}" width="{}" '
                'height="{}" rx="2"><title>{}</title></rect>',
                item.kind,
                " reactor-tl-wait" if item.wait else "",
                common,
                _n(x0),
                top,
                _n(w),
                h,
                title,
            )
        )
    return format_html(
        '<svg class="reactor-timeline" viewBox="0 0 {} {}" width="{}" role="img" '
        'aria-label="{}" xmlns="http://www.w3.org/2000/svg">{}</svg>',
        width,
        height,
        width,
        _("Timeline of the run's steps, waits and rollback"),
        mark_safe("".join(parts)),
    )


def _ticks(segment: Segment, origin: dt.datetime) -> list[tuple[float, float]]:
    """Where the time axis is labelled along a stretch drawn to scale: ``(x, seconds from
    the run's start)``, at round offsets, never closer than the labels can tell apart."""
    seconds = (segment.end - segment.start).total_seconds()
    first = (segment.start - origin).total_seconds()
    if segment.width < 1 or seconds <= 0:
        return [(segment.x, first)]
    count = max(int(segment.width // 110), 1)
    # A step finer than the labels' precision would write the same label twice (1 min 00 s
    # for +60.2 s and +60.4 s).
    step = _nice(max(seconds / count, _resolution(first + seconds)))
    value = step * -(-first // step)
    out = []
    while value <= first + seconds + 1e-9:
        out.append((segment.x + (value - first) / seconds * segment.width, value))
        value += step
    return out


def _resolution(seconds: float) -> float:
    """The smallest difference ``format_duration`` shows around ``seconds``."""
    for below, resolution in ((0.01, 0.0001), (1, 0.001), (60, 0.1), (3600, 1), (172800, 60)):
        if seconds < below:
            return resolution
    return 3600


def _tick(x: float, text: str, at: float, anchor: str) -> str:
    """A grid line at ``x`` and its label, written at ``at`` with ``anchor``."""
    return format_html(
        '<line class="reactor-tl-grid" x1="{}" x2="{}" y1="{}" y2="100%"/>'
        '<text class="reactor-tl-tick" x="{}" y="{}" text-anchor="{}">{}</text>',
        _n(x),
        _n(x),
        AXIS_H - 4,
        _n(at),
        AXIS_H - 10,
        anchor,
        text,
    )


class AxisLabels:
    """The labels of the time axis, placed so that none repeats another, none overlaps
    another and none runs past the drawing's right edge (``right``)."""

    def __init__(self, right: float) -> None:
        self.right = right
        self.boxes: list[tuple[float, float]] = []
        self.texts: set[str] = set()

    def place(self, x: float, text: str, *, repeat: bool = False) -> tuple[float, str] | None:
        """Where to write ``text`` for the moment at ``x`` (its x and anchor), or None when
        it would repeat a label or collide with one (it is left out)."""
        width = len(text) * CHAR_W
        at, anchor, left = x, "middle", x - width / 2
        if left + width > self.right:  # at the right edge: ends at the edge
            at, anchor, left = self.right, "end", self.right - width
        if (text in self.texts and not repeat) or any(
            left < end + TICK_GAP and start < left + width + TICK_GAP for start, end in self.boxes
        ):
            return None
        self.boxes.append((left, left + width))
        self.texts.add(text)
        return at, anchor


def _nice(value: float) -> float:
    """A round step at or above ``value`` seconds: 1, 2 or 5 times a power of ten below a
    second, whole seconds, minutes, hours or days above."""
    if value <= 0:
        return 1.0
    if value > 1:
        for step in TIME_STEPS:
            if step >= value:
                return float(step)
        return 86400 * _nice(value / 86400)
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power  # pragma: no cover


def _n(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")
