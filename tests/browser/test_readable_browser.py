"""The admin reads well in a real browser: the maps and interrupts lists fit a 1400 px screen
without scrolling sideways, rollback has colours of its own (never the green of work done), and
the timeline's axis labels neither repeat nor get cut off.

Drives Debian's Chromium (``/usr/bin/chromium``) with Playwright against pytest-django's
``live_server``. Skipped when either is missing, a failure under ``REACTOR_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from typing import Any

import pytest

from tests.browser.conftest import TIMEOUT_MS, log_in, require_browser

require_browser()

from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from django_reactor import services  # noqa: E402
from django_reactor.models import Execution, ExecutionEvent, Interrupt, MapRun  # noqa: E402
from django_reactor.states import EventKind, ExecutionStatus  # noqa: E402
from tests.admin.reactors import TRIGGERS, Booking, Payment  # noqa: E402
from tests.browser.test_admin_browser import reddish, rgb  # noqa: E402
from tests.shapes import keep_shape  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

WIDE = {"width": 1400, "height": 900}


def detail(execution_id: Any) -> str:
    return reverse("admin:django_reactor_execution_change", args=[str(execution_id)])


def greenish(css: str, margin: int = 12) -> bool:
    r, g, b = rgb(css)
    return g - max(r, b) >= margin


REACTOR = "shop.reactors.RenewDueSubscriptionsForEveryCustomer"


def widest_run() -> Execution:
    now = timezone.now()
    return Execution.objects.create(
        reactor=REACTOR,
        definition_hash="x",
        status="rolling_back",
        current_step="charge_the_customers_default_card",
        created_at=now,
        started_at=now - dt.timedelta(hours=2),
    )


def widest_maps() -> None:
    run = widest_run()
    for status in ("materialising", "rolling_back", "rolled_back", "settled"):
        MapRun.objects.create(
            id=uuid.uuid4(),
            execution=run,
            step=f"charge_every_customers_default_card_{status}",
            status=status,
            fan_out=True,
            atomic=False,
            size=1_250_000,
            settled=1_249_999,
            succeeded=1_249_000,
            failed=999,
            batch_size=100,
            chunk_size=10,
        )


def widest_interrupts() -> None:
    run = widest_run()
    now = timezone.now()
    for n, status in enumerate(("waiting", "resumed", "expired", "cancelled", "failed")):
        Interrupt.objects.create(
            execution=run,
            reactor=REACTOR,
            step=f"approval_of_the_finance_department_{n}",
            status=status,
            correlation_id=f"customer-4711-subscription-2026-12-renewal-{n}",
            expires_at=now + dt.timedelta(days=14),
            invalid_attempts=2,
            max_attempts=3,
            closed_at=now,
        )


def assert_fits(browser: Any, live_server: Any, path: str) -> None:
    """Nothing of the list at ``path`` scrolls sideways at 1400 px: not the page, not the
    table, and every column header ends inside the table's box."""
    context = browser.new_context(viewport=WIDE, locale="en-US")
    context.set_default_timeout(TIMEOUT_MS)
    try:
        page = context.new_page()
        log_in(page, live_server.url)
        page.goto(live_server.url + path)
        widths = page.evaluate(
            """() => {
                const results = document.querySelector('.results');
                const box = results.getBoundingClientRect();
                const headers = [...document.querySelectorAll('#result_list thead th')];
                return {
                    page: document.documentElement.scrollWidth,
                    table: results.scrollWidth,
                    shown: results.clientWidth,
                    right: box.right,
                    headers: headers.map(th => [th.className, th.getBoundingClientRect().right]),
                };
            }"""
        )
        assert widths["page"] <= WIDE["width"], widths
        assert widths["table"] <= widths["shown"], widths
        for name, right in widths["headers"]:
            assert right <= widths["right"] + 0.5, (name, right, widths)
    finally:
        context.close()


def test_the_maps_list_fits_a_1400_px_screen(browser: Any, live_server: Any, operator: Any) -> None:
    widest_maps()
    assert_fits(browser, live_server, reverse("admin:django_reactor_maprun_changelist"))


def test_the_interrupts_list_fits_a_1400_px_screen(
    browser: Any, live_server: Any, operator: Any
) -> None:
    widest_interrupts()
    assert_fits(browser, live_server, reverse("admin:django_reactor_interrupt_changelist"))


def test_rollback_has_colours_of_its_own(admin_page: Any, live_server: Any) -> None:
    TRIGGERS.add("charge")
    failed = Booking.run({"guest": "ann", "card": "4111"})  # reserve undone
    TRIGGERS.clear()
    TRIGGERS.add("undo-fails")
    stuck = Booking.run({"guest": "bob", "card": "4111"})
    services.undo(stuck.execution_id)  # reserve and confirm: their undo fails
    TRIGGERS.clear()
    done = Booking.run({"guest": "cy", "card": "4111"})

    def badge(execution_id: Any, css: str) -> dict[str, str]:
        admin_page.goto(live_server.url + detail(execution_id))
        found = admin_page.locator(f"#reactor-steps .reactor-badge-{css}").first
        expect(found).to_be_visible()
        colours: dict[str, str] = found.evaluate(
            "el => { const s = getComputedStyle(el);"
            " return {bg: s.backgroundColor, fg: s.color, border: s.borderTopColor}; }"
        )
        return colours

    completed = badge(done.execution_id, "completed")
    undone = badge(failed.execution_id, "undone")
    rollback_failed = badge(stuck.execution_id, "rollback_failed")
    failed_step = badge(failed.execution_id, "failed")
    assert undone["bg"] != completed["bg"], (undone, completed)
    assert not greenish(undone["bg"]), undone
    assert rollback_failed["bg"] not in (completed["bg"], failed_step["bg"]), rollback_failed
    assert reddish(rollback_failed["border"], margin=60), rollback_failed
    # Undone and a rollback that failed share the rollback's hue: only the red tells them apart.
    assert rollback_failed["bg"] == undone["bg"]


def a_run_paused_for_two_days() -> Execution:
    """A run whose step took milliseconds before and after a pause of two days and four hours
    (its timeline cuts the pause): written as its worker would have written it."""
    keep_shape(Payment.definition)
    t0 = timezone.now() - dt.timedelta(days=3)
    row = Execution.objects.create(
        reactor=Payment.definition.name,
        definition_hash=Payment.definition.definition_hash,
        status=ExecutionStatus.COMPLETED,
        inputs={},
        current_step="ship",
        started_at=t0,
        finished_at=t0 + dt.timedelta(days=2, hours=4, seconds=1),
    )
    pause = 2 * 86400 + 4 * 3600
    trace = [
        (EventKind.START, "", 0.0, None, 0),
        (EventKind.RUN, "hold", 0.004, 3.1, 1),
        (EventKind.RUN, "pay", 0.012, 6.5, 1),
        (EventKind.PARK, "", 0.013, None, 0),
        (EventKind.RESUME, "", pause, None, 0),
        (EventKind.RUN, "ship", pause + 0.009, 8.2, 1),
        (EventKind.COMPLETE, "", pause + 0.010, None, 0),
    ]
    for seq, (kind, step, at, duration, attempt) in enumerate(trace, start=1):
        ExecutionEvent.objects.create(
            execution=row,
            seq=seq,
            kind=kind,
            step=step,
            attempt=attempt,
            at=t0 + dt.timedelta(seconds=at),
            duration_ms=duration,
            data={},
        )
    return row


@pytest.mark.parametrize("width", [1280, 900])
def test_the_timeline_axis_labels_neither_repeat_nor_get_cut_off(
    browser: Any, live_server: Any, operator: Any, width: int
) -> None:
    run = a_run_paused_for_two_days()
    context = browser.new_context(viewport={"width": width, "height": 900}, locale="en-US")
    context.set_default_timeout(TIMEOUT_MS)
    try:
        page = context.new_page()
        log_in(page, live_server.url)
        page.goto(live_server.url + detail(run.pk))
        svg = page.locator("#reactor-timeline svg.reactor-timeline")
        expect(svg).to_be_visible()
        labels = svg.evaluate(
            """svg => {
                const box = svg.viewBox.baseVal;
                const selector = 'text.reactor-tl-tick, .reactor-tl-cut text';
                const texts = [...svg.querySelectorAll(selector)];
                return {
                    width: box.width,
                    labels: texts.map(t => {
                        const b = t.getBBox();
                        return {text: t.textContent, left: b.x, right: b.x + b.width};
                    }),
                };
            }"""
        )
        texts = [label["text"] for label in labels["labels"]]
        assert "2 d 04 h" in texts, texts  # the cut pause, with its length
        assert len(texts) >= 3, texts
        assert len(set(texts)) == len(texts), texts
        ordered = sorted(labels["labels"], key=lambda label: label["left"])
        for label in ordered:
            assert label["left"] >= 0, label
            assert label["right"] <= labels["width"], (label, labels["width"])
        for before, after in itertools.pairwise(ordered):
            assert before["right"] <= after["left"], (before, after)
    finally:
        context.close()
