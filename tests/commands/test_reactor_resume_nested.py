"""reactor_resume and reactor_show with interrupts of composed children: by path, by
correlation id; a child's own id and paths that do not exist are refused."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_reactor import Paused
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.integration.nested_reactors import NestedOrder, NestedSubscribe
from tests.integration.reactors import ledger

pytestmark = pytest.mark.django_db(transaction=True)


def command(name: str, *args: Any, **options: Any) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out, no_color=True, **options)
    return out.getvalue()


def paused_order(order: str) -> Paused:
    outcome = NestedOrder.run({"order": order})
    assert isinstance(outcome, Paused)
    return outcome


def test_reactor_show_lists_the_nested_interrupt_by_path() -> None:
    paused = paused_order("C1")

    shown = json.loads(command("reactor_show", str(paused.execution_id), json=True))

    assert [(i["step"], i["correlation_id"]) for i in shown["interrupts"]] == [
        ("checkout.approval", "checkout-C1")
    ]


def test_resume_by_path_completes_the_root() -> None:
    paused = paused_order("C2")

    out = command(
        "reactor_resume", str(paused.execution_id), "approved=true", step="checkout.approval"
    )

    assert f"execution {paused.execution_id}: completed" in out
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.COMPLETED
    assert ledger.calls[-2:] == [("run", "ship"), ("run", "receipt")]


def test_resume_two_levels_down_by_correlation_id() -> None:
    paused = NestedSubscribe.run({"order": "C3"})

    out = command(
        "reactor_resume",
        correlation_id="checkout-C3",
        reactor="tests.nested.NestedSubscribe",
        payload='{"approved": true}',
        json=True,
    )

    assert json.loads(out)["execution_id"] == str(paused.execution_id)
    assert json.loads(out)["status"] == "completed"


def test_a_path_that_does_not_exist_is_refused_with_the_valid_paths() -> None:
    paused = paused_order("C4")

    with pytest.raises(CommandError) as refused:
        command(
            "reactor_resume", str(paused.execution_id), "approved=true", step="checkout.aproval"
        )

    assert str(refused.value) == (
        f"cannot resume execution {paused.execution_id}: 'checkout.aproval' is not an "
        "interrupt of tests.nested.NestedOrder (its interrupts: checkout.approval)."
    )
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.PAUSED


def test_resuming_the_child_execution_is_refused_naming_the_root() -> None:
    paused = paused_order("C5")
    child = Execution.objects.get(parent_id=paused.execution_id)

    with pytest.raises(CommandError) as refused:
        command("reactor_resume", str(child.pk), "approved=true")

    message = str(refused.value)
    assert f"cannot resume execution {child.pk}" in message
    assert f"resumed through execution {paused.execution_id}" in message
    assert "step='checkout.approval'" in message
