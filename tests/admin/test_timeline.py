"""A run's timeline: a Gantt chart of its trace on its page (attempts, retries, waits, the
rollback), and the drawing's rules (waits up to what ended them, long idle stretches cut)."""

from __future__ import annotations

import datetime as dt
import re
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_reactor.admin import timeline
from django_reactor.states import EventKind, ExecutionStatus
from tests.admin.reactors import TRIGGERS, Payment, Refund

T0 = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)


def detail(execution_id: Any) -> str:
    return reverse("admin:django_reactor_execution_change", args=[str(execution_id)])


def drawn(html: str) -> list[dict[str, str]]:
    """The timeline's bars and marks, as their data attributes (and tooltip)."""
    svg = html.split('<svg class="reactor-timeline"')[1].split("</svg>")[0]
    items = []
    for tag, attributes, title in re.findall(
        r"<(rect|path) ([^>]*data-kind[^>]*)><title>([^<]*)</title>", svg
    ):
        found = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', attributes))
        found["tag"], found["title"] = tag, title
        items.append(found)
    return items


def of(items: list[dict[str, str]], lane: str, kind: str) -> list[dict[str, str]]:
    return [i for i in items if i["lane"] == lane and i["kind"] == kind]


@pytest.mark.django_db(transaction=True)
def test_a_run_that_retried_and_rolled_back_shows_its_retry_and_undo_bars(
    client_operator: Client,
) -> None:
    TRIGGERS.update({"flaky", "ship"})
    outcome = Payment.run({})
    assert outcome.status == ExecutionStatus.FAILED

    html = client_operator.get(detail(outcome.execution_id)).content.decode()
    items = drawn(html)

    [retry] = of(items, "pay", "retry")
    assert retry["attempt"] == "1"
    assert "TimeoutError" in retry["title"]
    assert "the card gateway timed out" in retry["title"]
    [second] = of(items, "pay", "run")
    assert second["attempt"] == "2"
    assert float(second["start-ms"]) >= float(retry["start-ms"]) + float(retry["duration-ms"])
    [failed] = of(items, "ship", "fail")
    assert "no courier for this postcode" in failed["title"]
    [undo_pay] = of(items, "pay", "undo")
    [undo_hold] = of(items, "hold", "undo")
    # Newest first: pay is undone before hold, both after ship failed.
    assert float(failed["start-ms"]) <= float(undo_pay["start-ms"])
    assert float(undo_pay["start-ms"]) <= float(undo_hold["start-ms"])
    assert of(items, "run", "rollback")
    assert of(items, "run", "start")
    # Durations in milliseconds, as format_duration writes them.
    assert re.search(r"pay: Step undone · \d+(\.\d)? ms", undo_pay["title"])
    assert 'id="reactor-timeline"' in html


@pytest.mark.django_db(transaction=True)
def test_a_paused_run_waits_for_its_payload_until_now(client_operator: Client) -> None:
    outcome = Refund.run({"order": "T-1"})
    assert outcome.status == ExecutionStatus.PAUSED
    items = drawn(client_operator.get(detail(outcome.execution_id)).content.decode())
    [pause] = of(items, "approval", "pause")
    assert pause["tag"] == "rect"
    assert "approval: waiting for a payload" in pause["title"]
    assert of(items, "request", "run")


def event(seq: int, kind: str, at: float, step: str = "", **fields: Any) -> SimpleNamespace:
    """A trace entry ``at`` seconds after T0."""
    return SimpleNamespace(
        seq=seq,
        kind=kind,
        step=step,
        at=T0 + dt.timedelta(seconds=at),
        attempt=fields.pop("attempt", 1 if step else 0),
        duration_ms=fields.pop("duration_ms", None),
        data=fields.pop("data", {}),
    )


def build(events: list[SimpleNamespace], **kwargs: Any) -> timeline.Timeline:
    return timeline.build(
        events,
        kwargs.pop("steps", []),
        now=kwargs.pop("now", T0 + dt.timedelta(hours=1)),
        moving=kwargs.pop("moving", False),
        labels=dict(EventKind.choices),
    )


def items_of(line: timeline.Timeline) -> list[tuple[str, str, float, float]]:
    return [
        (i.lane, i.kind, (i.start - T0).total_seconds(), (i.end - T0).total_seconds())
        for i in line.items
    ]


def test_a_backoff_waits_from_the_retry_to_the_next_attempt() -> None:
    line = build(
        [
            event(1, EventKind.START, 0),
            event(2, EventKind.RETRY, 0.010, "pay", duration_ms=10, data={"delay": 30}),
            event(3, EventKind.RUN, 30.015, "pay", attempt=2, duration_ms=5),
            event(4, EventKind.COMPLETE, 30.016),
        ]
    )
    found = items_of(line)
    assert ("pay", "retry", 0.0, 0.01) in found
    assert ("pay", "backoff", 0.01, 30.01) in found
    assert ("pay", "run", 30.01, 30.015) in found
    assert line.lanes == ["", "pay"]


def test_a_hand_off_and_a_park_wait_until_a_worker_resumes_the_run() -> None:
    line = build(
        [
            event(1, EventKind.START, 0),
            event(2, EventKind.HANDOFF, 0.002, data={"next_step": "a"}),
            event(3, EventKind.RESUME, 1.5),
            event(4, EventKind.PARK, 1.6, "a", data={"waiting_for": "map"}),
            event(5, EventKind.RESUME, 4.0),
            event(6, EventKind.RUN, 4.1, "a", duration_ms=50),
        ]
    )
    found = items_of(line)
    assert ("", "handoff", 0.002, 1.5) in found
    assert ("a", "park", 1.6, 4.0) in found
    park = next(i for i in line.items if i.kind == "park")
    assert park.wait
    assert "waiting for map" in park.title


def test_a_wait_still_going_reaches_now_for_a_moving_run() -> None:
    now = T0 + dt.timedelta(minutes=10)
    line = build(
        [
            event(1, EventKind.START, 0),
            event(2, EventKind.RETRY, 0.1, "pay", duration_ms=100, data={"delay": 900}),
        ],
        moving=True,
        now=now,
    )
    assert ("pay", "backoff", 0.1, 600.0) in items_of(line)
    assert line.end == now


def test_a_failed_attempt_without_a_duration_starts_when_its_step_started() -> None:
    started = T0 + dt.timedelta(seconds=1)
    line = build(
        [event(1, EventKind.START, 0), event(2, EventKind.FAIL, 3, "ship")],
        steps=[SimpleNamespace(step="ship", started_at=started)],
    )
    assert ("ship", "fail", 1.0, 3.0) in items_of(line)


def test_a_long_idle_stretch_is_cut_and_labelled_with_its_length() -> None:
    line = build(
        [
            event(1, EventKind.START, 0),
            event(2, EventKind.RUN, 0.004, "a", duration_ms=3),
            event(3, EventKind.INTERRUPT, 0.005, "review"),
            event(4, EventKind.PAYLOAD, 2 * 86400 + 4 * 3600, "review"),
            event(5, EventKind.RUN, 2 * 86400 + 4 * 3600 + 0.002, "b", duration_ms=1),
        ]
    )
    segments = timeline.axis(line)
    assert [s.cut for s in segments] == [False, True, False]
    svg = str(timeline.render(line))
    assert "2 d 04 h" in svg
    assert "with nothing running, drawn shortened" in svg
    # The millisecond bars keep a readable width beside the two-day wait.
    a = next(i for i in line.items if i.lane == "a")
    width = timeline._x(segments, a.end) - timeline._x(segments, a.start)
    assert width > 50


def test_runs_of_millisecond_steps_are_drawn_to_scale() -> None:
    line = build(
        [
            event(1, EventKind.START, 0),
            event(2, EventKind.RUN, 0.0015, "a", duration_ms=0.2),
            event(3, EventKind.RUN, 0.0030, "b", duration_ms=0.3),
            event(4, EventKind.COMPLETE, 0.0032),
        ]
    )
    assert [s.cut for s in timeline.axis(line)] == [False]
    svg = str(timeline.render(line))
    assert "+1.0 ms" in svg  # the time axis, in milliseconds
    assert "a: Step ran, attempt 1 · 0.2 ms" in svg


def test_a_very_long_trace_is_drawn_up_to_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "MAX_EVENTS", 3)
    line = build([event(n, EventKind.RUN, n, f"s{n}", duration_ms=1) for n in range(1, 6)])
    assert line.cut == 2
    assert line.lanes == ["", "s1", "s2", "s3"]


def test_an_empty_trace_draws_nothing() -> None:
    line = build([], now=timezone.now())
    assert str(timeline.render(line)) == ""


def axis_labels(svg: str) -> list[tuple[float, str, str]]:
    """The time axis's labels: x, anchor and text (the cut lengths' and the ticks')."""
    found = re.findall(
        r'<text (?:class="reactor-tl-tick" )?x="([\d.]+)" y="\d+" '
        r'text-anchor="(\w+)">([^<]*)</text>',
        svg,
    )
    return [(float(x), anchor, text) for x, anchor, text in found]


@pytest.mark.parametrize(
    "trace",
    [
        # Milliseconds; a minute; a cut of two days; hours.
        [(EventKind.START, 0, "", None), (EventKind.RUN, 0.0030, "a", 0.3)],
        [(EventKind.START, 0, "", None), (EventKind.RUN, 30, "a", 30000),
         (EventKind.RUN, 64.5, "b", 34000), (EventKind.COMPLETE, 65.3, "", None)],
        [(EventKind.START, 0, "", None), (EventKind.RUN, 0.004, "a", 3),
         (EventKind.INTERRUPT, 0.005, "review", None),
         (EventKind.PAYLOAD, 2 * 86400 + 4 * 3600, "review", None),
         (EventKind.RUN, 2 * 86400 + 4 * 3600 + 0.002, "b", 1)],
        [(EventKind.START, 0, "", None), (EventKind.RUN, 3000, "a", 3_000_000),
         (EventKind.RUN, 7300, "b", 4_000_000), (EventKind.COMPLETE, 7301, "", None)],
    ],
)  # fmt: skip
def test_the_time_axis_labels_never_repeat_and_stay_inside_the_drawing(
    trace: list[tuple[str, float, str, float | None]],
) -> None:
    line = build(
        [
            event(n, kind, at, step, duration_ms=duration)
            for n, (kind, at, step, duration) in enumerate(trace, start=1)
        ]
    )
    svg = str(timeline.render(line))
    labels = axis_labels(svg)
    ticks = [text for _x, _anchor, text in labels if text.startswith("+")]
    assert len(ticks) >= 2, labels
    assert len(set(ticks)) == len(ticks), ticks
    texts = [text for _x, _anchor, text in labels]
    assert len(set(texts)) == len(texts), texts  # no tick repeats a cut's length either
    width = float(re.search(r'viewBox="0 0 (\d+) ', svg).group(1))  # type: ignore[union-attr]
    for x, anchor, text in labels:
        extent = len(text) * timeline.CHAR_W
        right = x if anchor == "end" else x + extent / 2
        assert right <= width, (text, x, anchor)
