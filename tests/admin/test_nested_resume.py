"""The admin and interrupts of composed children: the root's page lists them by path and its
resume form delivers to them; the child's page points at the root."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from django_reactor.models import Execution, Interrupt
from django_reactor.states import ExecutionStatus, InterruptStatus
from tests.integration.nested_reactors import NestedOrder, NestedSubscribe
from tests.integration.reactors import ledger

pytestmark = pytest.mark.django_db(transaction=True)


def url(name: str, *args: Any) -> str:
    return reverse(f"admin:django_reactor_execution_{name}", args=[str(a) for a in args])


def texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_the_roots_page_lists_the_nested_interrupt_by_path_with_a_resume_link(
    client_operator: Client,
) -> None:
    root = NestedOrder.run({"order": "A1"}).execution_id

    html = client_operator.get(url("change", root)).content.decode()

    assert "<td>checkout.approval</td>" in html
    assert "checkout-A1" in html
    assert url("resume", root, "checkout.approval") in html


def test_the_childs_page_points_at_the_root_instead_of_offering_a_resume(
    client_operator: Client,
) -> None:
    root = NestedOrder.run({"order": "A2"}).execution_id
    child = Execution.objects.get(parent_id=root).pk

    html = client_operator.get(url("change", child)).content.decode()

    assert url("resume", child, "approval") not in html
    assert "reactor-resume-through" in html
    assert str(root)[:8] in html
    assert "<code>checkout.approval</code>" in html

    response = client_operator.get(url("resume", child, "approval"))
    assert response.status_code == 302
    assert any(f"resumed through execution {root}" in text for text in texts(response))


def test_the_resume_form_of_a_nested_interrupt_uses_the_childs_serializer(
    client_operator: Client,
) -> None:
    root = NestedOrder.run({"order": "A3"}).execution_id
    resume = url("resume", root, "checkout.approval")

    page = client_operator.get(resume).content.decode()
    assert "checkout-A3" in page
    assert "checkout.approval" in page
    assert 'type="checkbox" name="payload-approved"' in page  # the child's Approval

    invalid = client_operator.post(resume, {"payload-note": "x" * 21})
    assert invalid.status_code == 200
    assert "Ensure this field has no more than 20 characters." in invalid.content.decode()

    response = client_operator.post(resume, {"payload-approved": "on"})

    assert response.status_code == 302
    assert "Payload accepted for checkout.approval; the run is now completed." in texts(response)
    assert Execution.objects.get(pk=root).status == ExecutionStatus.COMPLETED
    assert Interrupt.objects.get(execution__parent_id=root).status == InterruptStatus.RESUMED
    assert ledger.calls[-2:] == [("run", "ship"), ("run", "receipt")]


def test_the_resume_form_two_levels_down(client_operator: Client) -> None:
    root = NestedSubscribe.run({"order": "A4"}).execution_id

    html = client_operator.get(url("change", root)).content.decode()
    assert url("resume", root, "fulfil.checkout.approval") in html

    response = client_operator.post(
        url("resume", root, "fulfil.checkout.approval"), {"payload-approved": "on"}
    )

    assert response.status_code == 302
    assert Execution.objects.get(pk=root).status == ExecutionStatus.COMPLETED


def test_a_path_that_does_not_exist_is_not_found(client_operator: Client) -> None:
    root = NestedOrder.run({"order": "A5"}).execution_id

    assert client_operator.get(url("resume", root, "checkout.nope")).status_code == 404
    assert client_operator.get(url("resume", root, "nope.approval")).status_code == 404
