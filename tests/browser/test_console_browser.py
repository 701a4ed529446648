"""The admin's operations console in a real browser: the list of runs at 1400 px, a large input
behind an expander, the overview, a run's timeline (light and dark) and the coordination panel.

Drives Debian's Chromium (``/usr/bin/chromium``) with Playwright against pytest-django's
``live_server``. Skipped when either is missing, a failure under ``REACTOR_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

from tests.browser.conftest import TIMEOUT_MS, log_in, open_page, require_browser

require_browser()

from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from django_reactor.coordination import get_backend  # noqa: E402
from django_reactor.models import Execution  # noqa: E402
from django_reactor.states import ExecutionStatus  # noqa: E402
from tests.admin.reactors import TRIGGERS, Payment  # noqa: E402
from tests.browser.reactors import FAIL, Checkout, RefundReview  # noqa: E402
from tests.browser.test_admin_browser import rgb  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

WIDE = {"width": 1400, "height": 900}


def detail(execution_id: Any) -> str:
    return reverse("admin:django_reactor_execution_change", args=[str(execution_id)])


def luminance(css: str) -> float:
    r, g, b = rgb(css)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def widest_rows() -> None:
    """Runs whose every cell is as wide as an operator meets: long reactor, step and
    correlation names, the longest status, durations in hours."""
    now = timezone.now()
    for status in ("needs_attention", "rolling_back", "completed", "cancelled"):
        Execution.objects.create(
            reactor="shop.reactors.RenewDueSubscriptionsForEveryCustomer",
            definition_hash="x",
            status=status,
            current_step="charge_the_customers_default_card",
            correlation_id="customer-4711-subscription-2026-12-renewal",
            created_at=now,
            started_at=now - dt.timedelta(hours=2, minutes=5),
            finished_at=now,
        )


def test_every_column_of_the_list_fits_a_1400_px_screen(
    browser: Any, live_server: Any, operator: Any
) -> None:
    widest_rows()
    Checkout.run({"order": "W-1"})
    context = browser.new_context(viewport=WIDE, locale="en-US")
    context.set_default_timeout(TIMEOUT_MS)
    try:
        page = context.new_page()
        log_in(page, live_server.url)
        page.goto(live_server.url + reverse("admin:django_reactor_execution_changelist"))
        headers = page.locator("#result_list thead th")
        expect(headers).to_have_count(9)  # the selection box and the eight columns
        results = page.locator(".results").bounding_box()
        assert results is not None
        for index in range(9):
            box = headers.nth(index).bounding_box()
            assert box is not None
            right = box["x"] + box["width"]
            name = headers.nth(index).get_attribute("class")
            assert right <= WIDE["width"], (name, right)
            assert right <= results["x"] + results["width"] + 0.5, (name, right, results)
        # Nothing scrolls sideways: not the page, not the table.
        assert page.evaluate("document.documentElement.scrollWidth") <= WIDE["width"]
        assert page.evaluate(
            "(() => { const r = document.querySelector('.results');"
            " return r.scrollWidth <= r.clientWidth; })()"
        )
    finally:
        context.close()


def test_a_large_input_stays_behind_an_expander(admin_page: Any, live_server: Any) -> None:
    outcome = Checkout.run({"order": "L-1"})
    lines = [{"sku": f"SKU-{n}", "qty": n} for n in range(300)]
    Execution.objects.filter(pk=outcome.execution_id).update(
        status=ExecutionStatus.RUNNING, inputs={"order": "L-1", "lines": lines}
    )
    admin_page.goto(live_server.url + detail(outcome.execution_id))

    fold = admin_page.locator(".field-redacted_inputs details.reactor-fold")
    expect(fold).to_be_visible()
    expect(fold.locator("pre")).not_to_be_visible()
    expect(fold.locator("summary")).to_contain_text("305 lines")
    # The run page stays short (one value per line made it 19,000 px tall).
    assert admin_page.evaluate("document.documentElement.scrollHeight") < 4000
    # The run is moving: the page reads itself again, until someone opens the expander.
    expect(admin_page.locator("#reactor-refresh")).to_be_visible()
    assert admin_page.evaluate("window.reactorRefreshHeld()") == ""
    fold.locator("summary").click()
    expect(fold.locator("pre")).to_be_visible()
    expect(fold.locator("pre")).to_contain_text("SKU-299")
    assert admin_page.evaluate("window.reactorRefreshHeld()") == "reading"


def test_the_overview_charts_runs_by_status_and_lists_what_needs_a_look(
    admin_page: Any, live_server: Any
) -> None:
    for order in ("O-1", "O-2", "O-3"):
        Checkout.run({"order": order})
    FAIL.add("charge_card")
    assert Checkout.run({"order": "O-4"}).status == ExecutionStatus.FAILED
    FAIL.clear()
    RefundReview.run({"order": "O-5"})
    stuck = Checkout.run({"order": "O-6"})
    Execution.objects.filter(pk=stuck.execution_id).update(
        status=ExecutionStatus.RUNNING,
        finished_at=None,
        lease_owner="worker-3@host:99",
        lease_expires_at=timezone.now() - dt.timedelta(minutes=2),
    )

    admin_page.goto(live_server.url + reverse("admin:app_list", args=["django_reactor"]))
    admin_page.locator("#reactor-console").get_by_role("link", name="Overview").click()
    admin_page.wait_for_url(re.compile(r"/overview/$"), timeout=TIMEOUT_MS)

    chart = admin_page.locator("#reactor-chart svg.reactor-chart")
    expect(chart).to_be_visible()
    expect(chart.locator("g.reactor-chart-bar")).to_have_count(12)
    completed = chart.locator('rect[data-status="completed"]')
    expect(completed).to_have_count(1)  # all in the bar in progress
    expect(completed).to_have_attribute("data-count", "3")
    red = chart.locator('rect[data-status="failed"]')
    expect(red).to_be_visible()
    r, g, b = rgb(red.evaluate("el => getComputedStyle(el).fill"))
    assert r - max(g, b) >= 40
    expect(admin_page.locator('[data-figure="ended-hour"]')).to_have_text("4")
    expect(admin_page.locator('[data-figure="failure-rate-hour"]')).to_have_text("25.0 %")
    expect(admin_page.locator("#reactor-in-flight tr[data-status=paused] td")).to_have_text("1")
    expired = admin_page.locator("#reactor-expired")
    expect(expired).to_contain_text(str(stuck.execution_id)[:8])
    expect(expired).to_contain_text("worker-3@host:99")
    expect(admin_page.locator("#reactor-waiting")).to_contain_text("refund-O-5")
    expect(admin_page.locator("#reactor-refresh")).to_be_visible()
    assert admin_page.evaluate("window.reactorRefreshHeld()") == ""

    admin_page.get_by_role("link", name="Last day").click()
    admin_page.wait_for_url(re.compile(r"window=day$"), timeout=TIMEOUT_MS)
    expect(admin_page.locator("#reactor-chart g.reactor-chart-bar")).to_have_count(24)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_timeline_draws_the_retry_and_the_undo_readably(
    browser: Any, live_server: Any, operator: Any, scheme: str
) -> None:
    TRIGGERS.update({"flaky", "ship"})
    try:
        outcome = Payment.run({})
    finally:
        TRIGGERS.clear()
    assert outcome.status == ExecutionStatus.FAILED
    context, page = open_page(browser, color_scheme=scheme)
    try:
        log_in(page, live_server.url)
        page.goto(live_server.url + detail(outcome.execution_id))
        timeline = page.locator("#reactor-timeline svg.reactor-timeline")
        expect(timeline).to_be_visible()
        retry = timeline.locator('rect[data-lane="pay"][data-kind="retry"]')
        expect(retry).to_be_visible()
        expect(retry.locator("title")).to_contain_text("the card gateway timed out")
        expect(timeline.locator('rect[data-lane="pay"][data-kind="run"]')).to_have_attribute(
            "data-attempt", "2"
        )
        for lane in ("pay", "hold"):
            undo = timeline.locator(f'rect[data-lane="{lane}"][data-kind="undo"]')
            expect(undo).to_be_visible()
            expect(undo.locator("title")).to_contain_text(" ms")
        expect(timeline.locator('rect[data-lane="ship"][data-kind="fail"]')).to_be_visible()

        background = page.locator("#reactor-timeline .reactor-timeline-box").evaluate(
            "el => getComputedStyle(el).backgroundColor"
        )
        lane_text = timeline.locator("text.reactor-tl-lane").first.evaluate(
            "el => getComputedStyle(el).fill"
        )
        # Lane names stand out from the background in either theme; so do the bars.
        assert abs(luminance(lane_text) - luminance(background)) > 120, (lane_text, background)
        for bar in (retry, timeline.locator('rect[data-lane="pay"][data-kind="undo"]')):
            fill = bar.evaluate("el => getComputedStyle(el).fill")
            assert abs(luminance(fill) - luminance(background)) > 50, (fill, background)
        if scheme == "dark":
            assert luminance(background) < 60
        else:
            assert luminance(background) > 200
    finally:
        context.close()


def test_the_coordination_panel_names_who_holds_a_lock(admin_page: Any, live_server: Any) -> None:
    holder = Checkout.run({"order": "C-1"})
    backend = get_backend()
    owner = str(holder.execution_id)
    grant = backend.acquire_lock("lock:account-7", owner, ttl=60)
    assert grant is not None
    backend.acquire_semaphore("semaphore:bank-api", owner, limit=4, ttl=60)
    try:
        admin_page.goto(live_server.url + reverse("admin:django_reactor_execution_changelist"))
        admin_page.get_by_role("link", name="Coordination", exact=True).click()
        admin_page.wait_for_url(re.compile(r"/coordination/$"), timeout=TIMEOUT_MS)

        lock = admin_page.locator('#reactor-locks tr[data-key="account-7"]')
        expect(lock).to_be_visible()
        expect(lock).to_contain_text(str(grant.fence))
        expect(lock).to_contain_text("Payout (Meta.coordination)")
        slots = admin_page.locator('#reactor-semaphores tr[data-key="bank-api"]')
        expect(slots).to_contain_text("1 of 4")
        lock.get_by_role("link", name=owner[:8]).click()  # its short id
        admin_page.wait_for_url(re.compile(rf"/{owner}/change/$"), timeout=TIMEOUT_MS)
    finally:
        backend.release_lock("lock:account-7", owner)
        backend.release_semaphore("semaphore:bank-api", owner)
