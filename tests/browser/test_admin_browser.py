"""The admin in a real browser: log in, see a failed step in red, resume a paused run, parked runs,
a map's progress bar.

Drives Debian's Chromium (``/usr/bin/chromium``) with Playwright against pytest-django's
``live_server``. Skipped when either is missing, a failure under ``REACTOR_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser.conftest import TIMEOUT_MS, require_browser

require_browser()

from django.urls import reverse  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from django_reactor.models import Execution, Interrupt  # noqa: E402
from django_reactor.states import ExecutionStatus, InterruptStatus  # noqa: E402
from tests.browser.reactors import FAIL, Checkout, RefundReview, ShipParcels  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def detail(execution_id: Any) -> str:
    return reverse("admin:django_reactor_execution_change", args=[str(execution_id)])


def rgb(css: str) -> tuple[int, int, int]:
    """``rgb(220, 38, 38)`` as numbers."""
    match = re.fullmatch(r"rgba?\((\d+),\s*(\d+),\s*(\d+)(?:,\s*[\d.]+)?\)", css.strip())
    assert match, f"not an rgb() colour: {css!r}"
    r, g, b = (int(part) for part in match.groups())
    return r, g, b


def reddish(css: str, margin: int = 20) -> bool:
    r, g, b = rgb(css)
    return r - max(g, b) >= margin


def test_a_failed_run_draws_its_failed_step_in_red(admin_page: Any, live_server: Any) -> None:
    FAIL.add("charge_card")
    outcome = Checkout.run({"order": "A-100"})
    assert outcome.status == ExecutionStatus.FAILED

    admin_page.goto(live_server.url + detail(outcome.execution_id))

    failed = admin_page.locator('#reactor-graph g[data-state="failed"]')
    expect(failed).to_have_count(1)
    expect(failed).to_be_visible()
    expect(failed).to_have_attribute("data-step", "charge_card")
    rect = failed.locator("rect")
    fill = rect.evaluate("el => getComputedStyle(el).fill")
    stroke = rect.evaluate("el => getComputedStyle(el).stroke")
    assert reddish(fill), fill
    assert reddish(stroke, margin=100), stroke
    # The steps that never ran are not red; the failure section names the exception.
    pending = admin_page.locator('#reactor-graph g[data-step="print_label"] rect')
    assert not reddish(pending.evaluate("el => getComputedStyle(el).stroke"))
    expect(admin_page.locator("#reactor-failure")).to_contain_text("RuntimeError")


def test_resume_delivers_a_payload_and_the_run_completes(admin_page: Any, live_server: Any) -> None:
    outcome = RefundReview.run({"order": "R-7"})
    assert outcome.status == ExecutionStatus.PAUSED
    run_url = live_server.url + detail(outcome.execution_id)

    admin_page.goto(run_url)
    expect(admin_page.locator('#reactor-graph g[data-step="review"]')).to_have_attribute(
        "data-state", "waiting"
    )
    admin_page.locator("#reactor-interrupts a.reactor-resume").click()
    admin_page.wait_for_url(re.compile(r"/resume/review/$"), timeout=TIMEOUT_MS)
    expect(admin_page.locator("#reactor-interrupt")).to_contain_text("refund-R-7")

    background = admin_page.locator("input#id_background")
    # The interrupt resumes in the background, so the box starts ticked; no worker runs here.
    expect(background).to_be_checked()
    background.uncheck()
    # One input per field of the payload's serializer; the error of a refused one, once.
    note = admin_page.locator("input#id_payload-note")
    expect(note).to_have_attribute("maxlength", "60")
    note.evaluate("el => el.removeAttribute('maxlength')")  # as a page without its limits
    note.fill("x" * 61)
    admin_page.click("input[type=submit][value='Deliver payload']")
    expect(admin_page.locator("#reactor-refusal")).to_contain_text("invalid payload 1 of 3")
    error = admin_page.get_by_text("Ensure this field has no more than 60 characters.")
    expect(error).to_have_count(1)
    expect(admin_page.locator(".field-payload-note .errorlist")).to_be_visible()
    expect(admin_page.locator("ul.messagelist")).to_have_count(0)

    admin_page.locator("input#id_payload-approved").check()
    admin_page.fill("input#id_payload-note", "checked by phone")
    expect(background).not_to_be_checked()
    admin_page.click("input[type=submit][value='Deliver payload']")

    admin_page.wait_for_url(run_url, timeout=TIMEOUT_MS)
    expect(admin_page.locator("ul.messagelist")).to_contain_text(
        "Payload accepted for review; the run is now completed."
    )
    expect(admin_page.locator("#reactor-graph g[data-step='notify']")).to_have_attribute(
        "data-state", "completed"
    )
    expect(admin_page.locator(".field-status_badge .reactor-badge-completed")).to_be_visible()

    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.COMPLETED
    interrupt = Interrupt.objects.get(execution_id=outcome.execution_id)
    assert interrupt.status == InterruptStatus.RESUMED


def test_the_parked_view_lists_a_paused_run(admin_page: Any, live_server: Any) -> None:
    outcome = RefundReview.run({"order": "P-3"})
    assert outcome.status == ExecutionStatus.PAUSED

    admin_page.goto(live_server.url + reverse("admin:django_reactor_execution_changelist"))
    admin_page.get_by_role("link", name=re.compile("Parked executions", re.I)).click()
    admin_page.wait_for_url(re.compile(r"/parked/$"), timeout=TIMEOUT_MS)

    section = admin_page.locator("#reactor-parked-interrupts")
    expect(section.locator("h2")).to_contain_text("Paused at an interrupt (1)")
    row = section.locator("tr", has_text="refund-P-3")
    expect(row).to_be_visible()
    expect(row.locator(f'a[href="{detail(outcome.execution_id)}"]')).to_be_visible()
    expect(row).to_contain_text("review")


def test_a_map_shows_its_progress_bar(admin_page: Any, live_server: Any) -> None:
    from django_reactor.testing import run_reactor

    FAIL.add("parcel-3")
    result = run_reactor(ShipParcels, {"parcels": list(range(1, 11))})
    assert result.status == ExecutionStatus.COMPLETED

    admin_page.goto(live_server.url + detail(result.execution_id))

    bar = admin_page.locator('#reactor-maps [data-step="label_parcels"] .reactor-progress')
    expect(bar).to_be_visible()
    expect(bar).to_have_attribute("aria-valuenow", "10")
    succeeded = bar.locator(".reactor-progress-succeeded").bounding_box()
    whole = bar.bounding_box()
    assert succeeded is not None
    assert whole is not None
    # Nine parcels labelled, one refused: the segments share the bar nine to one.
    assert abs(succeeded["width"] / (whole["width"] - 2) - 0.9) < 0.02
    assert reddish(
        bar.locator(".reactor-progress-failed").evaluate(
            "el => getComputedStyle(el).backgroundColor"
        )
    )
    traceback = admin_page.locator('#reactor-maps tr[data-index="2"] details')
    expect(traceback.locator("pre")).not_to_be_visible()
    traceback.locator("summary").click()
    expect(traceback.locator("pre")).to_contain_text("the address has no postcode")


def test_undo_asks_first_and_says_which_steps_it_will_roll_back(
    admin_page: Any, live_server: Any
) -> None:
    outcome = Checkout.run({"order": "U-1"})
    assert outcome.status == ExecutionStatus.COMPLETED
    admin_page.goto(live_server.url + detail(outcome.execution_id))

    admin_page.locator(".reactor-action-undo button").click()

    expect(admin_page.locator("h1")).to_contain_text("Undo this execution?")
    steps = admin_page.locator("#reactor-confirm-steps li")
    expect(steps.first).to_be_visible()
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.COMPLETED
    admin_page.click("input[type=submit][value='Yes, undo it']")

    expect(admin_page.locator("ul.messagelist")).to_contain_text("Undone")
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.CANCELLED


def test_the_page_of_a_run_still_moving_follows_it_until_it_ends(
    admin_page: Any, live_server: Any
) -> None:
    outcome = Checkout.run({"order": "M-1"})
    Execution.objects.filter(pk=outcome.execution_id).update(status=ExecutionStatus.PENDING)
    admin_page.goto(live_server.url + detail(outcome.execution_id))
    expect(admin_page.locator("#reactor-refresh")).to_be_visible()

    # What a worker would do meanwhile: the page shows it without anyone reloading it.
    Execution.objects.filter(pk=outcome.execution_id).update(status=ExecutionStatus.COMPLETED)
    expect(admin_page.locator("#reactor-refresh")).to_have_count(0, timeout=15_000)
