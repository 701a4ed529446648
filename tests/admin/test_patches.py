"""The admin's patches page (unfinished runs on each branch of each patch, linked to them), the
run list's filter by branch, and a run's decisions on its page."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from django_reactor.models import Execution, PatchDecision
from django_reactor.states import ExecutionStatus

pytestmark = pytest.mark.django_db

PAGE = reverse("admin:django_reactor_execution_patches")
LIST = reverse("admin:django_reactor_execution_changelist")


def a_run(status: str) -> Execution:
    return Execution.objects.create(reactor="shop.Checkout", status=status)


def decided(run: Execution, name: str, taken: bool) -> None:
    PatchDecision.objects.create(execution=run, name=name, taken=taken, step="charge")


def figure(html: str, patch: str, which: str) -> str:
    row = re.search(rf'<tr data-patch="{re.escape(patch)}">(.*?)</tr>', html, re.S)
    assert row is not None, f"no row for {patch}"
    cell = re.search(rf'data-figure="{which}">(?:<a href="([^"]*)">)?(\d+)', row.group(1))
    assert cell is not None
    return cell.group(2)


def test_the_page_counts_the_unfinished_runs_on_each_branch(client_viewer: Client) -> None:
    new_running, old_running, old_parked = (
        a_run(ExecutionStatus.RUNNING),
        a_run(ExecutionStatus.PENDING),
        a_run(ExecutionStatus.NEEDS_ATTENTION),
    )
    done = a_run(ExecutionStatus.COMPLETED)
    decided(new_running, "tax-v2", True)
    decided(old_running, "tax-v2", False)
    decided(old_parked, "tax-v2", False)
    decided(done, "tax-v2", False)
    decided(done, "eu-vat", True)

    html = client_viewer.get(PAGE).content.decode()

    assert (figure(html, "tax-v2", "new"), figure(html, "tax-v2", "old")) == ("1", "2")
    assert figure(html, "tax-v2", "runs") == "4"
    assert (figure(html, "eu-vat", "new"), figure(html, "eu-vat", "old")) == ("0", "0")
    assert "?patch=tax-v2%3Aold&amp;unfinished=1" in html


def test_the_link_lists_the_unfinished_runs_on_that_branch(client_viewer: Client) -> None:
    old_running, done = a_run(ExecutionStatus.RUNNING), a_run(ExecutionStatus.COMPLETED)
    new_running = a_run(ExecutionStatus.RUNNING)
    decided(old_running, "tax-v2", False)
    decided(done, "tax-v2", False)
    decided(new_running, "tax-v2", True)

    response = client_viewer.get(LIST, {"patch": "tax-v2:old", "unfinished": "1"})

    assert response.status_code == 200
    shown = {str(run.pk) for run in response.context["cl"].result_list}
    assert shown == {str(old_running.pk)}
    everything = client_viewer.get(LIST, {"patch": "tax-v2:old"}).context["cl"].result_list
    assert {str(run.pk) for run in everything} == {str(old_running.pk), str(done.pk)}


def test_a_page_without_patches_says_so_and_the_list_links_to_it(client_viewer: Client) -> None:
    assert "No run has asked patched() yet." in client_viewer.get(PAGE).content.decode()
    assert PAGE in client_viewer.get(LIST).content.decode()


def test_a_runs_page_shows_its_decisions(client_viewer: Client) -> None:
    run = a_run(ExecutionStatus.RUNNING)
    decided(run, "tax-v2", False)

    html = client_viewer.get(reverse("admin:django_reactor_execution_change", args=[run.pk]))

    text = html.content.decode()
    assert "<code>tax-v2</code>: old branch" in text
    assert "decided in charge" in text
