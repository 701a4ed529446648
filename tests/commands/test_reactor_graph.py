"""reactor_graph: drawing a reactor, and a stored run of it, from the command line."""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_reactor import Paused, services
from django_reactor.management.commands.reactor_graph import Command
from testproject.example.models import Order, Product
from testproject.example.reactors import ApproveRefund, PlaceOrder

pytestmark = pytest.mark.django_db

SVG = "{http://www.w3.org/2000/svg}"
ORDER = {
    "customer_email": "ada@example.com",
    "items": [{"sku": "MUG", "quantity": 2}],
    "card_token": "tok_visa",
    "country": "DE",
}


def draw(*args: Any, **options: Any) -> str:
    out, err = StringIO(), StringIO()
    call_command("reactor_graph", *args, stdout=out, stderr=err, no_color=True, **options)
    return out.getvalue()


def svg_states(svg: str) -> dict[str, str]:
    root = ET.fromstring(svg)
    return {
        g.attrib["data-step"]: g.attrib["data-state"]
        for g in root.iter(f"{SVG}g")
        if "data-step" in g.attrib
    }


@pytest.fixture
def order() -> Order:
    return Order.objects.create(customer_email="ada@example.com", total=Decimal("38.00"))


@pytest.fixture
def stock() -> None:
    Product.objects.create(sku="MUG", name="Mug", price=Decimal("9.50"), stock=10)


def test_mermaid_is_the_default_format() -> None:
    text = draw("testproject.example.reactors.PlaceOrder")
    assert text.startswith("flowchart TD\n")
    for name in ("create_order", "reserve", "charge", "ship", "confirm"):
        assert f'{name}["{name}"]' in text
    assert "create_order --> reserve" in text
    assert "ship --> confirm" in text


def test_a_unique_class_name_is_enough_and_dot_quotes_every_name() -> None:
    text = draw("ApproveRefund", format="dot")
    assert text.startswith('digraph "testproject.example.reactors.ApproveRefund" {')
    assert '"approval" [label="approval (interrupt)", shape=hexagon];' in text
    assert '"hold" -> "approval";' in text
    assert '"approval" -> "settle";' in text


def test_svg_has_a_box_per_step() -> None:
    svg = draw("ApproveRefund", "--format", "svg")
    assert svg_states(svg) == {"hold": "pending", "approval": "pending", "settle": "pending"}
    root = ET.fromstring(svg)
    assert root.attrib["aria-label"] == "testproject.example.reactors.ApproveRefund"
    assert draw("ApproveRefund", format="svg", direction="TB") != svg


def test_output_writes_the_drawing_to_a_file(tmp_path: Path) -> None:
    target = tmp_path / "place_order.svg"
    out, err = StringIO(), StringIO()
    call_command(
        "reactor_graph", "PlaceOrder", format="svg", output=str(target), stdout=out, stderr=err
    )
    assert out.getvalue() == ""
    assert f"to {target}" in err.getvalue()
    assert set(svg_states(target.read_text())) == {
        "create_order",
        "reserve",
        "charge",
        "ship",
        "confirm",
    }
    mermaid = tmp_path / "graph.mmd"
    draw("PlaceOrder", "-o", str(mermaid))
    assert mermaid.read_text().startswith("flowchart TD")


def test_execution_colours_a_paused_refund(order: Order) -> None:
    paused = ApproveRefund.run({"order_id": order.pk, "amount_cents": 1500})
    assert isinstance(paused, Paused)
    run = str(paused.execution_id)

    svg = draw("ApproveRefund", format="svg", execution=run)
    assert svg_states(svg) == {"hold": "completed", "approval": "waiting", "settle": "pending"}
    assert run in ET.fromstring(svg).attrib["aria-label"]

    mermaid = draw("ApproveRefund", "--execution", run)
    assert "class hold completed" in mermaid
    assert "class approval waiting" in mermaid
    assert "class settle pending" in mermaid

    # Without a reactor name the run's own reactor is drawn.
    assert svg_states(draw(format="svg", execution=run)) == svg_states(svg)


def test_execution_colours_a_declined_refund_and_a_rolled_back_order(
    order: Order, stock: None
) -> None:
    paused = ApproveRefund.run({"order_id": order.pk, "amount_cents": 1500})
    services.resume_interrupt(
        paused.execution_id, payload={"approved": False, "approver": "grace"}, background=False
    )
    declined = svg_states(draw("ApproveRefund", format="svg", execution=str(paused.execution_id)))
    assert declined == {"hold": "completed", "approval": "completed", "settle": "halted"}

    failed = PlaceOrder.run({**ORDER, "country": "XX"})
    assert failed.status == "failed"
    dot = draw("PlaceOrder", format="dot", execution=str(failed.execution_id))
    assert 'tooltip="ship: failed"' in dot
    assert 'tooltip="charge: undone"' in dot
    assert 'tooltip="confirm: pending"' in dot
    assert svg_states(draw("PlaceOrder", format="svg", execution=str(failed.execution_id))) == {
        "create_order": "undone",
        "reserve": "undone",
        "charge": "undone",
        "ship": "failed",
        "confirm": "pending",
    }


def test_an_unknown_reactor_suggests_close_names() -> None:
    with pytest.raises(CommandError, match="reactor 'PlaceOrdr': no reactor of that name") as error:
        draw("PlaceOrdr")
    assert "did you mean testproject.example.reactors.PlaceOrder?" in str(error.value)
    with pytest.raises(CommandError, match=r"\(known: "):
        draw("zzzzzzzz")


def test_execution_errors(order: Order) -> None:
    with pytest.raises(CommandError, match="'nope' is not an execution id"):
        draw("ApproveRefund", execution="nope")
    missing = uuid.uuid4()
    with pytest.raises(CommandError, match=f"--execution {missing}: no such execution"):
        draw("ApproveRefund", execution=str(missing))
    paused = ApproveRefund.run({"order_id": order.pk, "amount_cents": 1500})
    with pytest.raises(
        CommandError, match=r"is a run of testproject\.example\.reactors\.ApproveRefund, not of"
    ):
        draw("PlaceOrder", execution=str(paused.execution_id))
    with pytest.raises(CommandError, match="name the reactor to draw"):
        draw()


def test_a_bad_format_and_an_unwritable_output_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="invalid choice: 'png'"):
        draw("PlaceOrder", "--format", "png")
    with pytest.raises(CommandError, match="cannot write"):
        draw("PlaceOrder", output=str(tmp_path / "missing" / "graph.svg"))


def test_help_explains_every_option() -> None:
    text = Command().create_parser("manage.py", "reactor_graph").format_help()
    for option in ("reactor", "--format", "--output", "--execution", "--direction"):
        assert option in text
    for word in ("mermaid", "dot", "svg", "registered name", "stored run", "standard output"):
        assert word in text
