"""Fixtures of the browser tests: Debian's Chromium driven by Playwright against ``live_server``.

Playwright never downloads a browser here: it launches ``/usr/bin/chromium``. Without Chromium or
the ``playwright`` package the browser modules are skipped, unless ``REACTOR_REQUIRE_SERVICES=1``,
which makes that a failure (see :func:`require_browser`).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
# Every wait is bounded (milliseconds): a page of the local test server answers well within it.
TIMEOUT_MS = 10_000
LAUNCH_TIMEOUT_MS = 60_000
USERNAME = "operator"
PASSWORD = "browser-pw"


def browser_problems() -> list[str]:
    """What is missing to drive a browser, as install hints (empty when nothing is)."""
    problems = []
    if not (CHROMIUM.exists() and os.access(CHROMIUM, os.X_OK)):
        problems.append(f"{CHROMIUM} is missing (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        problems.append("the playwright package is missing (pip install playwright)")
    return problems


def require_browser() -> None:
    """Skip the calling module when the browser is missing, or fail under REQUIRE_SERVICES."""
    problems = browser_problems()
    if not problems:
        return
    missing = "; ".join(problems)
    if os.environ.get("REACTOR_REQUIRE_SERVICES") == "1":
        pytest.fail(
            f"REACTOR_REQUIRE_SERVICES=1 but the admin's browser test cannot run: {missing}. "
            "Install them with `apt-get install chromium` and `pip install playwright` "
            "(never `playwright install`: the test launches /usr/bin/chromium).",
            pytrace=False,
        )
    pytest.skip(f"needs a browser: {missing}", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def _orm_beside_playwright() -> Iterator[None]:
    """Playwright's sync API keeps an asyncio loop running in this thread; Django's ORM refuses
    to run where a loop runs unless told it is safe (it is: the ORM calls here are sequential)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module, always closed."""
    from playwright.sync_api import sync_playwright

    manager = sync_playwright()
    playwright = manager.start()
    try:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=LAUNCH_ARGS,
            # A cold start (a first run builds Chromium's font cache) on a busy machine can take
            # longer than a page wait.
            timeout=LAUNCH_TIMEOUT_MS,
        )
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        manager.__exit__(None, None, None)


def open_page(browser: Any, color_scheme: str = "light") -> tuple[Any, Any]:
    """A fresh context (no cookies) and its page, 1280x800, every wait bounded."""
    context = browser.new_context(viewport=VIEWPORT, color_scheme=color_scheme, locale="en-US")
    context.set_default_timeout(TIMEOUT_MS)
    context.set_default_navigation_timeout(TIMEOUT_MS)
    return context, context.new_page()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context, page = open_page(browser)
    try:
        yield page
    finally:
        context.close()


@pytest.fixture
def operator(transactional_db: None) -> Any:
    """A superuser: every permission of django_reactor."""
    from django.contrib.auth.models import User

    return User.objects.create_superuser(USERNAME, "operator@example.com", PASSWORD)


def log_in(page: Any, base_url: str) -> None:
    """Through the admin's login form, as a person would."""
    from playwright.sync_api import expect

    page.goto(f"{base_url}/admin/login/?next=/admin/", timeout=TIMEOUT_MS)
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}/admin/", timeout=TIMEOUT_MS)
    expect(page.locator("#user-tools")).to_contain_text(USERNAME)


@pytest.fixture
def admin_page(page: Any, live_server: Any, operator: Any) -> Any:
    """A page logged in to the admin of the live test server."""
    log_in(page, live_server.url)
    return page


@pytest.fixture(autouse=True)
def _reset_failures() -> Iterator[None]:
    from tests.browser.reactors import FAIL

    FAIL.clear()
    yield
    FAIL.clear()
