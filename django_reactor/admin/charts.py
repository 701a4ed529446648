"""Charts drawn on the server as SVG: no script, no stylesheet of their own.

Colours come from CSS classes (``reactor-fill-<status>``, ``_styles.html``) that follow the
admin's light and dark themes; every mark has a ``<title>`` (its tooltip) and ``data-``
attributes that name what it shows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

#: The order statuses are stacked in, bottom first; others follow in the order met.
STACK_ORDER = (
    "completed",
    "halted",
    "cancelled",
    "aborted",
    "failed",
    "needs_attention",
)


@dataclass
class Bar:
    """One bar: its label (on the axis when ``tick``), tooltip title, counts by series, and
    whether its time was counted at all (``counted``; a bar not counted is drawn hatched)."""

    label: str
    title: str
    counts: dict[str, int] = field(default_factory=dict)
    tick: bool = True
    counted: bool = True

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def nice_ceiling(value: float) -> int:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return int(step * power)
    return int(10 * power)  # pragma: no cover - the loop always returns


def stacked_bars(
    bars: Sequence[Bar],
    series: Sequence[tuple[str, str]],
    *,
    label: str,
    width: int = 760,
    height: int = 220,
) -> SafeString:
    """Bars of ``series`` (``(name, label)`` pairs, bottom first) stacked per bar, with a y
    axis of counts. ``label`` is the chart's accessible name."""
    left, right, top, bottom = 44, 8, 10, 26
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = nice_ceiling(max((bar.total for bar in bars), default=0))
    slot = plot_w / max(len(bars), 1)
    bar_w = max(slot * 0.72, 1.0)
    parts: list[str] = []
    for fraction in (0, 0.25, 0.5, 0.75, 1):
        y = top + plot_h * (1 - fraction)
        value = peak * fraction
        text = f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"
        parts.append(
            format_html(
                '<line class="reactor-chart-grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<text class="reactor-chart-label" x="{}" y="{}" text-anchor="end">{}</text>',
                left,
                width - right,
                _n(y),
                _n(y),
                left - 6,
                _n(y + 4),
                text,
            )
        )
    labels = dict(series)
    for index, bar in enumerate(bars):
        x = left + slot * index + (slot - bar_w) / 2
        marks: list[str] = []
        if not bar.counted:
            marks.append(
                format_html(
                    '<rect class="reactor-chart-uncounted" x="{}" y="{}" width="{}" '
                    'height="{}"><title>{}</title></rect>',
                    _n(x),
                    top,
                    _n(bar_w),
                    plot_h,
                    bar.title,
                )
            )
        y = top + plot_h
        for name, _label in series:
            count = bar.counts.get(name, 0)
            if not count:
                continue
            h = plot_h * count / peak
            y -= h
            marks.append(
                format_html(
                    '<rect class="reactor-fill-{}" x="{}" y="{}" width="{}" height="{}" '
                    'data-status="{}" data-count="{}"><title>{}: {} {}</title></rect>',
                    name,
                    _n(x),
                    _n(y),
                    _n(bar_w),
                    _n(max(h, 1.0)),
                    name,
                    count,
                    bar.title,
                    f"{count:,}",
                    labels.get(name, name),
                )
            )
        if bar.tick:
            marks.append(
                format_html(
                    '<text class="reactor-chart-label" x="{}" y="{}" text-anchor="middle">'
                    "{}</text>",
                    _n(x + bar_w / 2),
                    height - 8,
                    bar.label,
                )
            )
        parts.append(
            format_html(
                '<g class="reactor-chart-bar" data-label="{}" data-total="{}"{}>{}</g>',
                bar.label,
                bar.total,
                mark_safe(' data-uncounted="true"') if not bar.counted else "",
                mark_safe("".join(marks)),
            )
        )
    return format_html(
        '<svg class="reactor-chart" viewBox="0 0 {} {}" role="img" aria-label="{}" '
        'xmlns="http://www.w3.org/2000/svg">{}</svg>',
        width,
        height,
        label,
        mark_safe("".join(parts)),
    )


def legend(series: Sequence[tuple[str, str, int]]) -> SafeString:
    """A row of swatches with labels and totals: ``(name, label, total)``."""
    return format_html(
        '<ul class="reactor-legend">{}</ul>',
        format_html_join(
            "",
            '<li data-status="{}"><span class="reactor-swatch reactor-fill-{}"></span>{} '
            '<span class="reactor-legend-count">{}</span></li>',
            ((name, name, label, f"{total:,}") for name, label, total in series),
        ),
    )


def _n(value: float) -> str:
    """A coordinate with at most one decimal."""
    return f"{value:.1f}".rstrip("0").rstrip(".")
