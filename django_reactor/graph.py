"""Drawing a reactor's steps: layers, Mermaid, Graphviz DOT and a server-rendered SVG.

Everything here is a pure function of a :class:`~django_reactor.engine.definition.ReactorDefinition`
(and, for a stored run, of rows the caller has already read): no queries, no JavaScript, no
external assets. ``states`` maps step names to one of :data:`STATES`; a step it leaves out is
``pending`` (not reached).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from .engine.definition import ReactorDefinition, StepSpec

__all__ = [
    "STATES",
    "layers",
    "render_svg",
    "step_states",
    "to_dot",
    "to_mermaid",
]

# Every state a step can be drawn in; "pending" (not reached) is the default.
STATES: tuple[str, ...] = (
    "pending",
    "running",
    "parked",
    "waiting",
    "completed",
    "skipped",
    "halted",
    "failed",
    "undone",
    "compensated",
    "rollback_failed",
)
PENDING = "pending"

# (fill, stroke) per state for light and dark backgrounds. Text and edges use currentColor.
_LIGHT: dict[str, tuple[str, str]] = {
    "pending": ("#f8fafc", "#94a3b8"),
    "running": ("#dbeafe", "#2563eb"),
    "parked": ("#fef3c7", "#d97706"),
    "waiting": ("#fef3c7", "#d97706"),
    "completed": ("#dcfce7", "#16a34a"),
    "skipped": ("#f1f5f9", "#64748b"),
    "halted": ("#ede9fe", "#7c3aed"),
    "failed": ("#fee2e2", "#dc2626"),
    "undone": ("#e2e8f0", "#475569"),
    "compensated": ("#e2e8f0", "#475569"),
    # A completed step whose undo failed: neither done nor taken back.
    "rollback_failed": ("#e2e8f0", "#dc2626"),
}
_DARK: dict[str, tuple[str, str]] = {
    "pending": ("#1e293b", "#64748b"),
    "running": ("#1e3a8a", "#60a5fa"),
    "parked": ("#78350f", "#fbbf24"),
    "waiting": ("#78350f", "#fbbf24"),
    "completed": ("#14532d", "#4ade80"),
    "skipped": ("#334155", "#94a3b8"),
    "halted": ("#4c1d95", "#a78bfa"),
    "failed": ("#7f1d1d", "#f87171"),
    "undone": ("#334155", "#94a3b8"),
    "compensated": ("#334155", "#94a3b8"),
    "rollback_failed": ("#334155", "#f87171"),
}
_LIGHT_TEXT = "#1f2937"
_DARK_TEXT = "#e5e7eb"


# ---------------------------------------------------------------------- layering


def layers(definition: ReactorDefinition) -> list[list[str]]:
    """The steps in longest-path layers: a step's layer is one more than its deepest dependency.

    Steps without dependencies are in layer 0; inside a layer the steps keep their declaration
    order. Dependencies on names that are not steps of ``definition`` are ignored.
    """
    by_name = {spec.name: spec for spec in definition.steps}
    depth: dict[str, int] = {}

    def layer_of(name: str, visiting: frozenset[str]) -> int:
        if name in depth:
            return depth[name]
        if name in visiting:
            raise ValueError(f"the steps of {definition.name} have a cycle through {name!r}")
        deps = [d for d in by_name[name].depends_on if d in by_name]
        value = 1 + max((layer_of(d, visiting | {name}) for d in deps), default=-1)
        depth[name] = value
        return value

    result: list[list[str]] = []
    for spec in definition.steps:
        index = layer_of(spec.name, frozenset())
        while len(result) <= index:
            result.append([])
    for spec in definition.steps:
        result[depth[spec.name]].append(spec.name)
    return result


def _edges(definition: ReactorDefinition) -> list[tuple[str, str]]:
    """``(dependency, dependant)`` pairs, by dependant in declaration order."""
    order = {spec.name: index for index, spec in enumerate(definition.steps)}
    return [
        (dep, spec.name)
        for spec in definition.steps
        for dep in sorted((d for d in spec.depends_on if d in order), key=order.__getitem__)
    ]


def _kind(spec: StepSpec) -> str | None:
    """A short marker for special steps: interrupt, compose, async step / async reactor."""
    if spec.interrupt is not None:
        return "interrupt"
    if spec.unit == "step":
        return "async step"
    if spec.unit is not None:
        child = getattr(spec.impl, "child", None)
        return f"async {spec.unit}: {_short(child)}" if child is not None else f"async {spec.unit}"
    if spec.child is not None:
        return f"compose: {_short(spec.child)}"
    return None


def _short(reactor: Any) -> str:
    definition = getattr(reactor, "definition", None)
    name = getattr(definition, "name", None) or getattr(reactor, "__name__", str(reactor))
    return str(name).rsplit(".", 1)[-1]


def _states(definition: ReactorDefinition, states: Mapping[str, str] | None) -> dict[str, str]:
    """Every step's state (``pending`` unless ``states`` says otherwise), checked."""
    given = dict(states or {})
    unknown = sorted({value for value in given.values() if value not in STATES})
    if unknown:
        raise ValueError(
            f"unknown step state(s) {', '.join(map(repr, unknown))}; use one of {', '.join(STATES)}"
        )
    return {spec.name: given.get(spec.name, PENDING) for spec in definition.steps}


# ---------------------------------------------------------------------- Mermaid


def _mermaid_text(text: str) -> str:
    return (
        text.replace("&", "#amp;").replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
    )


# Words Mermaid reads as syntax: such step names get a prefix as node ids.
_MERMAID_WORDS = frozenset(
    {
        "end",
        "graph",
        "flowchart",
        "subgraph",
        "direction",
        "class",
        "classdef",
        "style",
        "linkstyle",
        "click",
        "call",
        "href",
        "default",
    }
)


def _mermaid_id(name: str) -> str:
    if name.lower() in _MERMAID_WORDS or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return "step_" + re.sub(r"[^A-Za-z0-9_]", "_", name)
    return name


def to_mermaid(definition: ReactorDefinition, states: Mapping[str, str] | None = None) -> str:
    """A Mermaid ``flowchart TD`` of the steps; with ``states``, nodes are coloured by state.

    Interrupts are drawn as hexagons, composed reactors as subroutines and async units as
    parallelograms; each label names the step and, for those, what it is.
    """
    ids = {spec.name: _mermaid_id(spec.name) for spec in definition.steps}
    lines = ["flowchart TD"]
    for spec in definition.steps:
        kind = _kind(spec)
        label = _mermaid_text(spec.name + (f" ({kind})" if kind else ""))
        if spec.interrupt is not None:
            node = f'{ids[spec.name]}{{{{"{label}"}}}}'
        elif spec.unit is not None:
            node = f'{ids[spec.name]}[/"{label}"/]'
        elif spec.child is not None:
            node = f'{ids[spec.name]}[["{label}"]]'
        else:
            node = f'{ids[spec.name]}["{label}"]'
        lines.append(f"    {node}")
    for dep, dependant in _edges(definition):
        lines.append(f"    {ids[dep]} --> {ids[dependant]}")
    if states is not None:
        resolved = _states(definition, states)
        for state in STATES:
            members = [ids[name] for name, value in resolved.items() if value == state]
            if not members:
                continue
            fill, stroke = _LIGHT[state]
            lines.append(f"    classDef {state} fill:{fill},stroke:{stroke},color:{_LIGHT_TEXT}")
            lines.append(f"    class {','.join(members)} {state}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- Graphviz


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(definition: ReactorDefinition, states: Mapping[str, str] | None = None) -> str:
    """A Graphviz ``digraph`` of the steps (every name quoted); with ``states``, coloured."""
    resolved = _states(definition, states) if states is not None else None
    lines = [
        f"digraph {_dot_quote(definition.name)} {{",
        "    rankdir=TB;",
        '    node [shape=box, style="rounded", fontname="Helvetica"];',
    ]
    for spec in definition.steps:
        kind = _kind(spec)
        attrs = [f"label={_dot_quote(spec.name + (f' ({kind})' if kind else ''))}"]
        if spec.interrupt is not None:
            attrs.append("shape=hexagon")
        if resolved is not None:
            state = resolved[spec.name]
            fill, stroke = _LIGHT[state]
            attrs += [
                'style="rounded,filled"',
                f'fillcolor="{fill}"',
                f'color="{stroke}"',
                f"tooltip={_dot_quote(f'{spec.name}: {state}')}",
            ]
        lines.append(f"    {_dot_quote(spec.name)} [{', '.join(attrs)}];")
    for dep, dependant in _edges(definition):
        lines.append(f"    {_dot_quote(dep)} -> {_dot_quote(dependant)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- SVG

_BOX_HEIGHT = 46
_MIN_BOX_WIDTH = 110
_CHAR_WIDTH = 7.4
_SMALL_CHAR_WIDTH = 6.0
_GAP_MAJOR = 56  # between layers
_GAP_MINOR = 22  # between boxes of one layer
_MARGIN = 16
_TITLE_HEIGHT = 28


@dataclass(frozen=True, slots=True)
class _Box:
    name: str
    x: float
    y: float
    width: float
    height: float

    @property
    def cx(self) -> float:
        return self.x + self.width / 2

    @property
    def cy(self) -> float:
        return self.y + self.height / 2


def _box_width(name: str, caption: str) -> float:
    wanted = max(len(name) * _CHAR_WIDTH, len(caption) * _SMALL_CHAR_WIDTH) + 28
    return max(_MIN_BOX_WIDTH, round(wanted))


def _layout(
    columns: list[list[str]], widths: Mapping[str, float], direction: str, top: float
) -> tuple[dict[str, _Box], float, float]:
    """Boxes for every step, and the drawing's width and height."""
    boxes: dict[str, _Box] = {}
    if direction == "LR":
        column_widths = [max((widths[n] for n in column), default=0) for column in columns]
        heights = [len(c) * _BOX_HEIGHT + max(len(c) - 1, 0) * _GAP_MINOR for c in columns]
        tallest = max(heights, default=0)
        x = float(_MARGIN)
        for column, column_width, height in zip(columns, column_widths, heights, strict=True):
            y = top + (tallest - height) / 2
            for name in column:
                boxes[name] = _Box(name, x, y, column_width, _BOX_HEIGHT)
                y += _BOX_HEIGHT + _GAP_MINOR
            x += column_width + _GAP_MAJOR
        width = x - _GAP_MAJOR + _MARGIN if columns else 2 * _MARGIN
        return boxes, width, top + tallest + _MARGIN
    row_widths = [
        sum(widths[n] for n in row) + max(len(row) - 1, 0) * _GAP_MINOR for row in columns
    ]
    widest = max(row_widths, default=0)
    y = top
    for row, row_width in zip(columns, row_widths, strict=True):
        x = _MARGIN + (widest - row_width) / 2
        for name in row:
            boxes[name] = _Box(name, x, y, widths[name], _BOX_HEIGHT)
            x += widths[name] + _GAP_MINOR
        y += _BOX_HEIGHT + _GAP_MAJOR
    total = y - _GAP_MAJOR + _MARGIN if columns else top + _MARGIN
    return boxes, widest + 2 * _MARGIN, total


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _arc_lift(span: int) -> float:
    """How far an edge that skips ``span - 1`` layers bends away from the boxes between."""
    return 26.0 + 14.0 * (span - 2)


def _edge_path(source: _Box, target: _Box, direction: str, span: int) -> str:
    """A bezier from ``source`` to ``target``; edges skipping layers arc around the boxes."""
    if span > 1:
        lift = _arc_lift(span)
        if direction == "LR":  # from the top of the source to the top of the target
            x1, y1 = source.cx + 8, source.y
            x2, y2 = target.cx - 8, target.y - 2
            c1, c2 = (x1, min(y1, y2) - lift), (x2, min(y1, y2) - lift)
        else:  # from the right side of the source to the right side of the target
            x1, y1 = source.x + source.width, source.cy + 6
            x2, y2 = target.x + target.width + 2, target.cy - 6
            c1, c2 = (max(x1, x2) + lift, y1), (max(x1, x2) + lift, y2)
    elif direction == "LR":
        x1, y1 = source.x + source.width, source.cy
        x2, y2 = target.x - 2, target.cy
        bend = max((x2 - x1) / 2, 12)
        c1, c2 = (x1 + bend, y1), (x2 - bend, y2)
    else:
        x1, y1 = source.cx, source.y + source.height
        x2, y2 = target.cx, target.y - 2
        bend = max((y2 - y1) / 2, 12)
        c1, c2 = (x1, y1 + bend), (x2, y2 - bend)
    points = " ".join(f"{_num(a)},{_num(b)}" for a, b in (c1, c2, (x2, y2)))
    return f"M{_num(x1)},{_num(y1)} C{points}"


def _style(scope: str) -> str:
    def variables(palette: Mapping[str, tuple[str, str]], text: str) -> str:
        pairs = [f"color:{text}"]
        for state, (fill, stroke) in palette.items():
            pairs.append(f"--rg-{state}-fill:{fill};--rg-{state}-stroke:{stroke}")
        return ";".join(pairs)

    light = variables(_LIGHT, _LIGHT_TEXT)
    dark = variables(_DARK, _DARK_TEXT)
    rules = [
        f".{scope}{{{light}}}",
        # The viewer's system preference, then the Django admin's explicit theme switch.
        f"@media (prefers-color-scheme: dark){{.{scope}{{{dark}}}}}",
        f'html[data-theme="dark"] .{scope}{{{dark}}}',
        f'html[data-theme="light"] .{scope}{{{light}}}',
        f".{scope} text{{fill:currentColor;font-family:system-ui,-apple-system,'Segoe UI',"
        "Roboto,Helvetica,Arial,sans-serif}",
        f".{scope} .step-name{{font-size:13px;font-weight:600}}",
        f".{scope} .step-caption{{font-size:10.5px;opacity:.8}}",
        f".{scope} .graph-title{{font-size:14px;font-weight:600}}",
        f".{scope} .edge{{fill:none;stroke:currentColor;stroke-opacity:.55;stroke-width:1.4}}",
        f".{scope} .arrow{{fill:currentColor;fill-opacity:.7}}",
        f".{scope} .step rect{{stroke-width:1.6}}",
        f".{scope} .step-failed rect,.{scope} .step-rollback_failed rect{{stroke-width:2.4}}",
        f".{scope} .step-running rect{{stroke-width:2.2}}",
        f".{scope} .step-pending rect{{stroke-dasharray:4 3}}",
    ]
    for state in STATES:
        rules.append(
            f".{scope} .step-{state} rect{{fill:var(--rg-{state}-fill);"
            f"stroke:var(--rg-{state}-stroke)}}"
        )
    return "".join(rules)


def _attr(value: object) -> str:
    return escape(str(value), {'"': "&quot;"})


def render_svg(
    definition: ReactorDefinition,
    states: Mapping[str, str] | None = None,
    *,
    title: str | None = None,
    direction: str = "LR",
) -> str:
    """The steps as a self-contained ``<svg>`` element, coloured by ``states``.

    Layers (see :func:`layers`) run left to right (``direction="LR"``) or top to bottom
    (``"TB"``). Each step is a ``<g class="step step-<state>" data-step=... data-state=...>``
    holding a rounded box, its name (and what it is, for interrupts, composed reactors and
    async units) and a ``<title>`` tooltip. Colours come from a scoped ``<style>`` with light and
    dark variants (``prefers-color-scheme`` and the admin's ``data-theme``); text and edges use
    ``currentColor``. No scripts, no external references: safe to inline in a page.
    """
    if direction not in ("LR", "TB"):
        raise ValueError(f"direction must be 'LR' or 'TB', not {direction!r}")
    resolved = _states(definition, states)
    specs = {spec.name: spec for spec in definition.steps}
    captions: dict[str, str] = {}
    for name, spec in specs.items():
        parts = [
            part for part in (_kind(spec), resolved[name] if states is not None else None) if part
        ]
        captions[name] = " · ".join(parts)
    widths = {name: _box_width(name, captions[name]) for name in specs}
    columns = layers(definition)
    layer_of = {name: index for index, column in enumerate(columns) for name in column}
    edges = [
        (dep, dependant, layer_of[dependant] - layer_of[dep])
        for dep, dependant in _edges(definition)
    ]
    longest = max((span for _, _, span in edges), default=1)
    # Room for the arcs of edges that skip layers: above the boxes (LR) or right of them (TB).
    arc_room = round(0.75 * _arc_lift(longest)) + 4 if longest > 1 else 0
    top = float(_MARGIN + (_TITLE_HEIGHT if title else 0))
    boxes, width, height = _layout(
        columns, widths, direction, top + (arc_room if direction == "LR" else 0)
    )
    if direction == "TB":
        width += arc_room
    if title:
        width = max(width, len(title) * 8.2 + 2 * _MARGIN)
    width, height = round(width), round(height)

    digest = hashlib.sha1(definition.name.encode(), usedforsecurity=False).hexdigest()[:8]
    scope = "reactor-graph"
    arrow = f"rg-arrow-{digest}"
    label = title or f"Steps of {definition.name}"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{scope}" role="img" '
        f'aria-label="{_attr(label)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" data-reactor="{_attr(definition.name)}">',
        f"<title>{escape(label)}</title>",
        f"<style>{_style(scope)}</style>",
        "<defs>",
        f'<marker id="{arrow}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse" markerUnits="userSpaceOnUse">',
        '<path class="arrow" d="M0,0 L10,5 L0,10 z" fill="currentColor"/>',
        "</marker>",
        "</defs>",
    ]
    if title:
        out.append(
            f'<text class="graph-title" x="{_MARGIN}" y="{_MARGIN + 14}">{escape(title)}</text>'
        )
    out.append('<g class="edges">')
    for dep, dependant, span in edges:
        path = _edge_path(boxes[dep], boxes[dependant], direction, span)
        out.append(
            f'<path class="edge" data-from="{_attr(dep)}" data-to="{_attr(dependant)}" '
            f'd="{path}" stroke="currentColor" fill="none" marker-end="url(#{arrow})"/>'
        )
    out.append("</g>")
    out.append('<g class="steps">')
    for name in specs:
        box, state, caption = boxes[name], resolved[name], captions[name]
        fill, stroke = _LIGHT[state]  # attributes: a fallback where CSS is not applied
        kind = _kind(specs[name])
        tooltip = f"{name}{f' ({kind})' if kind else ''}: {state}"
        name_y = box.cy + (-3 if caption else 4.5)
        out += [
            f'<g class="step step-{state}" data-step="{_attr(name)}" data-state="{state}">',
            f"<title>{escape(tooltip)}</title>",
            f'<rect x="{_num(box.x)}" y="{_num(box.y)}" width="{_num(box.width)}" '
            f'height="{_num(box.height)}" rx="9" ry="9" fill="{fill}" stroke="{stroke}"/>',
            f'<text class="step-name" x="{_num(box.cx)}" y="{_num(name_y)}" '
            f'text-anchor="middle">{escape(name)}</text>',
        ]
        if caption:
            out.append(
                f'<text class="step-caption" x="{_num(box.cx)}" y="{_num(box.cy + 13)}" '
                f'text-anchor="middle">{escape(caption)}</text>'
            )
        out.append("</g>")
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------- stored runs


def step_states(
    execution: Any, records: Iterable[Any], shape: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """Each step's drawing state for a stored run, from its ``Execution`` and ``StepRecord`` rows.

    Steps the run knew when it started (``shape``, see ``store.stored_shape``) and has no record of
    are ``pending``, except the execution's ``current_step``: ``running`` while the execution
    runs, ``parked`` while it is pending with a ``wake_at`` (a retry waiting for its time).
    """
    result: dict[str, str] = {str(name): PENDING for name in shape or {}}
    for record in records:
        result[record.step] = _record_state(record)
    current = getattr(execution, "current_step", "") or ""
    if current and result.get(current, PENDING) == PENDING:
        status = str(getattr(execution, "status", ""))
        if status == "running":
            result[current] = "running"
        elif status == "pending" and getattr(execution, "wake_at", None) is not None:
            result[current] = "parked"
        else:
            result[current] = PENDING
    return result


def _record_state(record: Any) -> str:
    status = str(record.status)
    rollback = str(getattr(record, "rollback", "") or "")
    if status == "completed":
        if rollback in ("undone", "compensated"):
            return rollback
        return "rollback_failed" if rollback == "failed" else "completed"
    if status == "failed":
        return "compensated" if rollback == "compensated" else "failed"
    if status in ("skipped", "halted"):
        return status
    if status in ("waiting", "resumed"):
        return "waiting"
    if status == "dispatched":
        return "running"
    return PENDING
