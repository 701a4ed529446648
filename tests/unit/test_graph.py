"""django_reactor.graph: layering, Mermaid, DOT, SVG and the states of a stored run."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from django_reactor import Reactor, async_reactor, async_step, compose, interrupt, step
from django_reactor.graph import STATES, layers, render_svg, step_states, to_dot, to_mermaid
from tests.integration.reactors import Tracked

SVG = "{http://www.w3.org/2000/svg}"


class GraphChain(Reactor):
    first = step(Tracked)
    second = step(Tracked, wait_for=["first"])
    third = step(Tracked, wait_for=["second"])


class GraphDiamond(Reactor):
    top = step(Tracked)
    left = step(Tracked, wait_for=["top"])
    right = step(Tracked, wait_for=["top"])
    bottom = step(Tracked, wait_for=["left", "right"])


class GraphChild(Reactor):
    only = step(Tracked)


class GraphKinds(Reactor):
    start = step(Tracked)
    approval = interrupt(after=["start"])
    sub = compose(GraphChild, wait_for=["approval"])
    unit = async_step(Tracked, wait_for=["start"])
    spawn = async_reactor(GraphChild, wait_for=["start"])
    # A long edge (start -> finish skips two layers) and a name Mermaid reads as syntax.
    end = step(Tracked, wait_for=["sub", "start"])


DIAMOND_EDGES = [("top", "left"), ("top", "right"), ("left", "bottom"), ("right", "bottom")]


def svg_steps(svg: str) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    return {g.attrib["data-step"]: g for g in root.iter(f"{SVG}g") if "data-step" in g.attrib}


# ---------------------------------------------------------------------- layers


def test_a_chain_has_one_step_per_layer() -> None:
    assert layers(GraphChain.definition) == [["first"], ["second"], ["third"]]


def test_a_diamond_has_its_branches_side_by_side_in_declaration_order() -> None:
    assert layers(GraphDiamond.definition) == [["top"], ["left", "right"], ["bottom"]]


def test_a_step_sits_below_its_deepest_dependency() -> None:
    assert layers(GraphKinds.definition) == [
        ["start"],
        ["approval", "unit", "spawn"],
        ["sub"],
        ["end"],
    ]


# ---------------------------------------------------------------------- Mermaid and DOT


def test_mermaid_has_every_step_and_edge() -> None:
    text = to_mermaid(GraphDiamond.definition)
    assert text.startswith("flowchart TD\n")
    for name in ("top", "left", "right", "bottom"):
        assert f'{name}["{name}"]' in text
    for dep, dependant in DIAMOND_EDGES:
        assert f"{dep} --> {dependant}" in text
    assert text.count("-->") == 4
    assert "classDef" not in text


def test_mermaid_marks_special_steps_and_colours_by_state() -> None:
    text = to_mermaid(GraphKinds.definition, {"start": "completed", "approval": "waiting"})
    assert 'approval{{"approval (interrupt)"}}' in text
    assert 'sub[["sub (compose: GraphChild)"]]' in text
    assert 'unit[/"unit (async step)"/]' in text
    assert "async reactor: GraphChild" in text
    # "end" closes subgraphs in Mermaid: the node gets another id, the label stays.
    assert 'step_end["end"]' in text
    assert "sub --> step_end" in text
    assert "classDef completed fill:" in text
    assert "class start completed" in text
    assert "class approval waiting" in text
    assert "class sub,unit,spawn,step_end pending" in text


def test_dot_has_every_step_and_edge_quoted() -> None:
    text = to_dot(GraphDiamond.definition)
    assert text.startswith(f'digraph "{GraphDiamond.definition.name}" {{')
    for name in ("top", "left", "right", "bottom"):
        assert f'"{name}" [label="{name}"];' in text
    for dep, dependant in DIAMOND_EDGES:
        assert f'"{dep}" -> "{dependant}";' in text
    assert text.rstrip().endswith("}")


def test_dot_colours_by_state_and_marks_interrupts() -> None:
    text = to_dot(GraphKinds.definition, {"start": "failed"})
    assert 'label="approval (interrupt)", shape=hexagon' in text
    start = next(line for line in text.splitlines() if line.strip().startswith('"start" ['))
    assert 'fillcolor="#fee2e2"' in start
    assert 'tooltip="start: failed"' in start


def test_unknown_states_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown step state"):
        to_mermaid(GraphChain.definition, {"first": "exploded"})


# ---------------------------------------------------------------------- SVG


def test_svg_is_xml_with_one_group_per_step_carrying_its_state() -> None:
    states = {"top": "completed", "left": "failed", "right": "undone"}
    svg = render_svg(GraphDiamond.definition, states)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    assert root.attrib["role"] == "img"
    assert root.attrib["aria-label"] == f"Steps of {GraphDiamond.definition.name}"
    assert root.attrib["viewBox"] == f"0 0 {root.attrib['width']} {root.attrib['height']}"
    groups = svg_steps(svg)
    assert list(groups) == ["top", "left", "right", "bottom"]
    expected = {**states, "bottom": "pending"}
    for name, group in groups.items():
        assert group.attrib["data-state"] == expected[name]
        assert group.attrib["class"] == f"step step-{expected[name]}"
        assert group.find(f"{SVG}title").text == f"{name}: {expected[name]}"
        assert group.find(f"{SVG}rect") is not None
        assert group.find(f"{SVG}text").text == name
    edges = [p for p in root.iter(f"{SVG}path") if "edge" in p.attrib.get("class", "")]
    assert sorted((p.attrib["data-from"], p.attrib["data-to"]) for p in edges) == sorted(
        DIAMOND_EDGES
    )
    assert all(p.attrib["marker-end"].startswith("url(#") for p in edges)


def test_a_failed_box_is_red_and_a_completed_one_green() -> None:
    svg = render_svg(GraphChain.definition, {"first": "completed", "second": "failed"})
    groups = svg_steps(svg)
    assert groups["second"].find(f"{SVG}rect").attrib["stroke"] == "#dc2626"
    assert groups["first"].find(f"{SVG}rect").attrib["stroke"] == "#16a34a"
    style = ET.fromstring(svg).find(f"{SVG}style").text
    assert "prefers-color-scheme: dark" in style
    assert '[data-theme="dark"]' in style
    for state in STATES:
        assert f".step-{state} rect" in style


def test_svg_is_self_contained() -> None:
    svg = render_svg(GraphKinds.definition, title="Kinds")
    assert "<script" not in svg
    assert "href" not in svg
    assert "http://" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "@import" not in svg


def test_svg_escapes_the_title() -> None:
    title = 'Refund <b>"42"</b> & co'
    svg = render_svg(GraphChain.definition, {"first": "running"}, title=title)
    root = ET.fromstring(svg)
    assert root.attrib["aria-label"] == title
    assert root.find(f"{SVG}title").text == title
    assert "<b>" not in svg


def test_svg_lays_layers_out_left_to_right_or_top_to_bottom() -> None:
    def corners(svg: str) -> dict[str, tuple[float, float]]:
        return {
            name: (float(g.find(f"{SVG}rect").attrib["x"]), float(g.find(f"{SVG}rect").attrib["y"]))
            for name, g in svg_steps(svg).items()
        }

    across = corners(render_svg(GraphDiamond.definition))
    assert across["top"][0] < across["left"][0] == across["right"][0] < across["bottom"][0]
    assert across["left"][1] < across["right"][1]
    down = corners(render_svg(GraphDiamond.definition, direction="TB"))
    assert down["top"][1] < down["left"][1] == down["right"][1] < down["bottom"][1]
    assert down["left"][0] < down["right"][0]
    with pytest.raises(ValueError):
        render_svg(GraphDiamond.definition, direction="RL")


def test_svg_boxes_fit_in_the_drawing() -> None:
    for direction in ("LR", "TB"):
        svg = render_svg(GraphKinds.definition, title="Kinds", direction=direction)
        root = ET.fromstring(svg)
        width, height = float(root.attrib["width"]), float(root.attrib["height"])
        for group in svg_steps(svg).values():
            rect = group.find(f"{SVG}rect").attrib
            assert float(rect["x"]) >= 0
            assert float(rect["y"]) >= 0
            assert float(rect["x"]) + float(rect["width"]) <= width
            assert float(rect["y"]) + float(rect["height"]) <= height


def test_svg_marks_special_steps_in_their_boxes_and_tooltips() -> None:
    groups = svg_steps(render_svg(GraphKinds.definition, {"approval": "waiting"}))
    texts = [t.text for t in groups["approval"].iter(f"{SVG}text")]
    assert texts == ["approval", "interrupt · waiting"]
    assert groups["approval"].find(f"{SVG}title").text == "approval (interrupt): waiting"
    assert [t.text for t in groups["sub"].iter(f"{SVG}text")][1] == "compose: GraphChild · pending"


# ---------------------------------------------------------------------- stored runs


def record(step: str, status: str, rollback: str = "") -> SimpleNamespace:
    return SimpleNamespace(step=step, status=status, rollback=rollback)


SHAPE = {name: {} for name in ("a", "b", "c", "d", "e", "f", "g", "h", "i")}


def execution(status: str, current_step: str = "", wake_at: object = None) -> SimpleNamespace:
    return SimpleNamespace(status=status, current_step=current_step, wake_at=wake_at)


def test_step_states_from_records() -> None:
    records = [
        record("a", "completed"),
        record("b", "completed", "undone"),
        record("c", "failed"),
        record("d", "failed", "compensated"),
        record("e", "skipped"),
        record("f", "halted"),
        record("g", "waiting"),
        record("h", "resumed"),
        record("i", "dispatched"),
    ]
    assert step_states(execution("failed"), records, SHAPE) == {
        "a": "completed",
        "b": "undone",
        "c": "failed",
        "d": "compensated",
        "e": "skipped",
        "f": "halted",
        "g": "waiting",
        "h": "waiting",
        "i": "running",
    }


def test_a_failed_step_whose_rollback_failed_stays_failed() -> None:
    states = step_states(execution("needs_attention"), [record("c", "failed", "failed")], SHAPE)
    assert states["c"] == "failed"
    assert states["a"] == "pending"


def test_a_completed_step_whose_undo_failed_is_drawn_as_such_not_as_completed() -> None:
    states = step_states(execution("needs_attention"), [record("a", "completed", "failed")], SHAPE)
    assert states["a"] == "rollback_failed"


def test_the_current_step_without_a_record_is_running_or_parked() -> None:
    done = [record("a", "completed")]
    assert step_states(execution("running", "b"), done, SHAPE)["b"] == "running"
    parked = execution("pending", "b", wake_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert step_states(parked, done, SHAPE)["b"] == "parked"
    assert step_states(execution("pending", "b"), done, SHAPE)["b"] == "pending"
    states = step_states(execution("running", "a"), done, SHAPE)
    assert states["a"] == "completed"
    assert set(states.values()) == {"completed", "pending"}


def test_step_states_without_a_stored_shape_covers_the_recorded_steps() -> None:
    bare = SimpleNamespace(status="running", current_step="b", wake_at=None)
    assert step_states(bare, [record("a", "completed")]) == {"a": "completed", "b": "running"}


def test_stored_states_draw_straight_into_the_svg() -> None:
    run = SimpleNamespace(status="failed", current_step="", wake_at=None)
    states = step_states(
        run,
        [record("first", "completed", "undone"), record("second", "failed")],
        {"first": {}, "second": {}, "third": {}},
    )
    groups = svg_steps(render_svg(GraphChain.definition, states))
    assert {n: g.attrib["data-state"] for n, g in groups.items()} == {
        "first": "undone",
        "second": "failed",
        "third": "pending",
    }
