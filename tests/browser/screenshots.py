"""Take the admin screenshots of the docs (``docs/img/admin-*.png``); run by hand, not in CI.

Run it with pytest (it needs the test database and ``live_server``; the file is not collected by
a plain ``pytest`` run because its name does not start with ``test_``)::

    .venv/bin/pytest -q -p no:cacheprovider tests/browser/screenshots.py

It writes, at 1280 px wide, light mode unless said otherwise:

- ``docs/img/admin-execution-failed.png``: a failed run's page, down to its step graph
  (the failed step in red);
- ``docs/img/admin-execution-dark.png``: the same in dark mode;
- ``docs/img/admin-parked.png``: the parked view;
- ``docs/img/admin-resume.png``: the resume form of a paused run;
- ``docs/img/admin-map-summary.png``: the map section of a run whose parcels are being
  labelled on workers (some done, a few refused, the rest pending), one traceback open.

Set ``REACTOR_SCREENSHOTS=/some/dir`` to write them elsewhere (to compare before replacing).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import open_page, require_browser

require_browser()

from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from django_reactor.models import Execution, ExecutionEvent  # noqa: E402
from django_reactor.states import EventKind, ExecutionStatus  # noqa: E402
from tests.browser.conftest import log_in  # noqa: E402
from tests.browser.reactors import FAIL, Checkout, RefundReview, ShipParcels  # noqa: E402
from tests.shapes import keep_shape  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

OUT = Path(os.environ.get("REACTOR_SCREENSHOTS") or Path(__file__).parents[2] / "docs" / "img")


def detail(execution_id: Any) -> str:
    return reverse("admin:django_reactor_execution_change", args=[str(execution_id)])


def shoot_down_to(page: Any, selector: str, path: Path, extra: int = 16) -> None:
    """The page from its top down to the bottom of ``selector``, the full width."""
    box = page.locator(selector).bounding_box()
    assert box, selector
    width = page.viewport_size["width"]
    page.screenshot(
        path=str(path),
        full_page=True,
        clip={"x": 0, "y": 0, "width": width, "height": box["y"] + box["height"] + extra},
    )


def shoot_map(page: Any, path: Path, margin: int = 12) -> None:
    """The Maps section only, the full width."""
    box = page.locator("#reactor-maps").bounding_box()
    assert box
    width = page.viewport_size["width"]
    page.screenshot(
        path=str(path),
        full_page=True,
        clip={
            "x": 0,
            "y": max(box["y"] - margin, 0),
            "width": width,
            "height": box["height"] + 2 * margin,
        },
    )


def parked_rows() -> None:
    """Three runs paused for a review, and one pending run waiting out a retry's backoff."""
    for order in ("A-1041", "A-1042", "A-1057"):
        RefundReview.run({"order": order})
    keep_shape(Checkout.definition)
    row = Execution.objects.create(
        reactor=Checkout.definition.name,
        definition_hash=Checkout.definition.definition_hash,
        status=ExecutionStatus.PENDING,
        inputs={"order": "A-1060"},
        current_step="charge_card",
        started_at=timezone.now() - dt.timedelta(minutes=2),
        wake_at=timezone.now() + dt.timedelta(minutes=3),
    )
    ExecutionEvent.objects.create(
        execution=row,
        seq=1,
        kind=EventKind.RETRY,
        step="charge_card",
        at=timezone.now() - dt.timedelta(seconds=30),
        data={"attempt": 1, "delay": 210},
    )


def map_in_flight() -> Any:
    """A run labelling 240 parcels on workers, halfway: three element tasks ran one chunk each
    (60 parcels, four refused); the run is parked until the rest settle."""
    from django_reactor.runtime import maps
    from django_reactor.testing import run_reactor

    FAIL.update({"parcel-1007", "parcel-1019", "parcel-1030", "parcel-1052"})
    result = run_reactor(ShipParcels, {"parcels": list(range(1000, 1240))}, background="none")
    with pytest.MonkeyPatch.context() as patch:
        # Each task hands over after its first chunk, as a worker out of time would.
        patch.setattr(maps, "TASK_BUDGET", 0.0)
        for _ in range(3):
            assert result.step_once()
    FAIL.clear()
    assert result.status == ExecutionStatus.PENDING
    return result


def test_take_the_admin_screenshots(browser: Any, live_server: Any, operator: Any) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    FAIL.add("charge_card")
    failed = Checkout.run({"order": "A-1038"})
    FAIL.clear()
    assert failed.status == ExecutionStatus.FAILED
    parked_rows()
    paused = RefundReview.run({"order": "A-1063"})
    shipping = map_in_flight()

    for scheme in ("light", "dark"):
        context, page = open_page(browser, color_scheme=scheme)
        try:
            log_in(page, live_server.url)
            page.goto(live_server.url + detail(failed.execution_id))
            name = "admin-execution-failed.png" if scheme == "light" else "admin-execution-dark.png"
            shoot_down_to(page, "#reactor-graph .reactor-graph-box", OUT / name)
            if scheme == "dark":
                continue
            page.goto(live_server.url + reverse("admin:django_reactor_execution_parked"))
            shoot_down_to(page, "#content", OUT / "admin-parked.png")
            page.goto(
                live_server.url
                + reverse(
                    "admin:django_reactor_execution_resume",
                    args=[str(paused.execution_id), "review"],
                )
            )
            shoot_down_to(page, "#content", OUT / "admin-resume.png")
            page.goto(live_server.url + detail(shipping.execution_id))
            page.locator("#reactor-maps details").first.locator("summary").click()
            shoot_map(page, OUT / "admin-map-summary.png")
        finally:
            context.close()
