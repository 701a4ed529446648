"""The overview's health strip in a real browser: green while the sweeper reports, red (with
what to do next) once it has been silent for three intervals.

Drives Debian's Chromium (``/usr/bin/chromium``) with Playwright against ``live_server``;
skipped when either is missing, a failure under ``REACTOR_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.browser.conftest import require_browser

require_browser()

from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from django_reactor import services  # noqa: E402
from django_reactor.conf import reactor_settings  # noqa: E402
from django_reactor.models import ProcessHeartbeat  # noqa: E402
from django_reactor.services.health import beat_worker  # noqa: E402
from tests.browser.test_admin_browser import reddish  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _css(locator: Any) -> str:
    """The item's left border colour, as the browser computed it."""
    return str(locator.evaluate("el => getComputedStyle(el).borderLeftColor"))


def test_the_strip_turns_red_when_the_sweeper_stops(admin_page: Any, live_server: Any) -> None:
    beat_worker(
        name="w1@box", queues=["reactor"], concurrency=2, tasks_done=0, started_at=timezone.now()
    )
    services.sweep()
    overview = live_server.url + reverse("admin:django_reactor_execution_overview")

    admin_page.goto(overview)
    strip = admin_page.locator("#reactor-health")
    expect(strip).to_be_visible()
    expect(strip).to_have_attribute("data-healthy", "yes")
    sweeper = strip.locator('li[data-health="sweeper"]')
    expect(sweeper).to_have_attribute("data-bad", "no")
    expect(sweeper).to_contain_text("Sweeper last seen")
    assert not reddish(_css(sweeper)), _css(sweeper)
    expect(admin_page.locator("#reactor-health-problems")).to_have_count(0)

    late = timezone.now() - dt.timedelta(seconds=3 * reactor_settings.SWEEP_INTERVAL + 5)
    ProcessHeartbeat.objects.filter(role="sweeper").update(last_seen_at=late)
    admin_page.goto(overview)
    expect(strip).to_have_attribute("data-healthy", "no")
    expect(sweeper).to_have_attribute("data-bad", "yes")
    assert reddish(_css(sweeper)), _css(sweeper)
    figure = sweeper.locator(".reactor-figure")
    assert reddish(figure.evaluate("el => getComputedStyle(el).color"))
    problems = admin_page.locator("#reactor-health-problems")
    expect(problems).to_be_visible()
    expect(problems).to_contain_text("no sweeper has run for")
    expect(problems).to_contain_text("python manage.py reactor_sweep --loop")
    # The other items stay green: the worker still reports.
    expect(strip.locator('li[data-health="workers"]')).to_have_attribute("data-bad", "no")
    box = strip.bounding_box()
    assert box is not None
    assert box["width"] <= 1280
