"""Take the admin screenshots of the docs (``docs/img/admin-*.png``); run by hand, not in CI.

Run it with pytest (it needs the test database and ``live_server``; the file is not collected by
a plain ``pytest`` run because its name does not start with ``test_``)::

    .venv/bin/pytest -q -p no:cacheprovider tests/browser/screenshots.py

It writes, at 1280 px wide, light mode unless said otherwise:

- ``docs/img/admin-execution-failed.png``: a failed run's page, down to its step graph
  (the failed step in red);
- ``docs/img/admin-execution-dark.png``: the same in dark mode;
- ``docs/img/admin-parked.png``: the parked view;
- ``docs/img/admin-resume.png``: the resume form of a paused run, an input for each field of
  its payload, after a refused payload (its error under its field);
- ``docs/img/admin-map-summary.png``: the map section of a run whose parcels are being
  labelled on workers (some done, a few refused, the rest pending), one traceback open;
- ``docs/img/admin-list.png``: the list of runs at 1400 px, every column on screen;
- ``docs/img/admin-overview.png``: the overview, an hour of checkouts that ended (a few
  failed), runs in flight, a stuck run, a run needing attention, waiting reviews, the outbox;
- ``docs/img/admin-timeline.png`` (and ``admin-timeline-dark.png``): the timeline of a
  checkout handed to a worker whose charge timed out, was retried after its backoff, and
  whose failed shipping rolled it back;
- ``docs/img/admin-coordination.png``: the coordination panel with a lock, semaphore slots,
  a rate limit, a period bucket and an ordered lock held by runs;
- ``docs/img/admin-maps.png`` and ``docs/img/admin-interrupts.png``: the maps and interrupts
  lists at 1400 px, the widest names an operator meets, nothing scrolling sideways;
- ``docs/img/admin-schedule.png``: a schedule's page, its next fires in its time zone and its
  Run now button; ``docs/img/admin-schedule-run-now.png``: what Run now asks first.

- ``docs/img/admin-paused-banner.png``: the overview while a reactor is paused, its banner
  on top;
- ``docs/img/admin-fork.png``: the fork page of a completed checkout, forked from its charge
  (the plan: carried, undone first, run again);
- ``docs/img/admin-bulk-preview.png``: acting on every failed run of a filtered list, its
  preview; ``docs/img/admin-bulk-operation.png``: that operation's page once a worker has
  worked through it;
- ``docs/img/admin-steering-history.png``: the steering history (who paused, forked,
  retried, and why).

The tutorial's screenshot of its run (``docs/img/tutorial-identity-run.png``) is taken by the
tutorial's own test, ``REACTOR_SCREENSHOTS=docs/img pytest tests/docs/test_tutorials.py``.

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

from django_reactor.coordination import Window, get_backend  # noqa: E402
from django_reactor.models import Dispatch, Execution, ExecutionEvent, StepRecord  # noqa: E402
from django_reactor.states import EventKind, ExecutionStatus  # noqa: E402
from tests.admin.reactors import Payment, Payout  # noqa: E402
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
            # A refused payload: the note above the form, the error under its field.
            page.locator("input#id_payload-note").evaluate("el => el.removeAttribute('maxlength')")
            page.fill("input#id_payload-note", "Called the customer: the parcel arrived " * 2)
            page.locator("input#id_background").uncheck()
            page.click("input[type=submit][value='Deliver payload']")
            page.locator("#reactor-refusal").wait_for()
            shoot_down_to(page, "#content", OUT / "admin-resume.png")
            page.goto(live_server.url + detail(shipping.execution_id))
            page.locator("#reactor-maps details").first.locator("summary").click()
            shoot_map(page, OUT / "admin-map-summary.png")
        finally:
            context.close()


# ---------------------------------------------------------------------------- the console


def shoot_section(page: Any, selector: str, path: Path, margin: int = 12) -> None:
    """One section of a page, the full width."""
    box = page.locator(selector).bounding_box()
    assert box, selector
    page.screenshot(
        path=str(path),
        full_page=True,
        clip={
            "x": 0,
            "y": max(box["y"] - margin, 0),
            "width": page.viewport_size["width"],
            "height": box["height"] + 2 * margin,
        },
    )


def an_hour_of_checkouts() -> None:
    """Checkouts that ended over the last hour (one in twelve failed), some still in flight, a
    run whose worker died (its lease expired), one needing attention, the outbox's head."""
    keep_shape(Checkout.definition)
    now = timezone.now()
    statuses = ["completed"] * 10 + ["failed", "cancelled"]
    rows = []
    for n in range(150):
        ended = now - dt.timedelta(seconds=23 * n + 7)
        rows.append(
            Execution(
                reactor=Checkout.definition.name,
                definition_hash=Checkout.definition.definition_hash,
                status=statuses[(n * 7) % len(statuses)],
                inputs={"order": f"A-{2000 + n}"},
                current_step="email_receipt",
                started_at=ended - dt.timedelta(milliseconds=180 + n % 40),
                finished_at=ended,
            )
        )
    for n, status in enumerate(["pending"] * 4 + ["running"] * 3 + ["rolling_back"]):
        rows.append(
            Execution(
                reactor=Checkout.definition.name,
                definition_hash=Checkout.definition.definition_hash,
                status=status,
                inputs={"order": f"A-{2200 + n}"},
                current_step="charge_card",
                started_at=now - dt.timedelta(seconds=2 + n),
                lease_owner="celery@worker-2:1187" if status != "pending" else None,
                lease_expires_at=now + dt.timedelta(seconds=40) if status != "pending" else None,
            )
        )
    Execution.objects.bulk_create(rows)
    Execution.objects.create(
        reactor=Checkout.definition.name,
        definition_hash=Checkout.definition.definition_hash,
        status=ExecutionStatus.RUNNING,
        inputs={"order": "A-2186"},
        current_step="charge_card",
        started_at=now - dt.timedelta(minutes=4),
        lease_owner="celery@worker-1:904",
        lease_expires_at=now - dt.timedelta(minutes=3, seconds=12),
        recovery_attempts=1,
    )
    Execution.objects.create(
        reactor=Checkout.definition.name,
        definition_hash=Checkout.definition.definition_hash,
        status=ExecutionStatus.RUNNING,
        inputs={"order": "A-2191"},
        current_step="charge_card",
        started_at=now - dt.timedelta(minutes=6, seconds=40),
        lease_owner="celery@worker-2:1187",
        lease_expires_at=now + dt.timedelta(seconds=40),
    )
    Execution.objects.create(
        reactor=Checkout.definition.name,
        definition_hash=Checkout.definition.definition_hash,
        status=ExecutionStatus.NEEDS_ATTENTION,
        inputs={"order": "A-2150"},
        current_step="reserve_stock",
        started_at=now - dt.timedelta(minutes=18),
        finished_at=now - dt.timedelta(minutes=17),
        failure={
            "kind": "rollback",
            "message": "could not undo reserve_stock: the warehouse API answered 503",
        },
    )
    pending = Execution.objects.filter(status=ExecutionStatus.PENDING).order_by("created_at")
    for n, row in enumerate(pending):
        Dispatch.objects.create(
            execution=row,
            reason=Dispatch.Reason.RETRY if n % 2 else Dispatch.Reason.START,
            not_before=now + dt.timedelta(seconds=40) if n % 2 else None,
        )


def a_checkout_that_retried_and_rolled_back() -> Any:
    """A payment handed to a worker: its charge timed out, was retried after a 2 s backoff and
    went through; shipping then failed, so the charge and the hold were undone (newest first).
    Its trace is written as a worker would have written it, with the times it would take."""
    keep_shape(Payment.definition)
    t0 = timezone.now() - dt.timedelta(seconds=5)
    row = Execution.objects.create(
        reactor=Payment.definition.name,
        definition_hash=Payment.definition.definition_hash,
        status=ExecutionStatus.FAILED,
        inputs={},
        current_step="ship",
        started_at=t0,
        finished_at=t0 + dt.timedelta(seconds=3.9),
        failure={"kind": "step", "step": "ship", "message": "no courier for this postcode"},
    )
    trace = [
        (EventKind.START, "", 0.000, None, 0, {}),
        (EventKind.RUN, "hold", 0.024, 18.2, 1, {}),
        (EventKind.HANDOFF, "", 0.027, None, 0, {"next_step": "pay"}),
        (EventKind.RESUME, "", 0.640, None, 0, {}),
        (
            EventKind.RETRY,
            "pay",
            0.955,
            301.4,
            1,
            {"error": "the card gateway timed out", "exception_class": "TimeoutError", "delay": 2},
        ),
        (EventKind.RESUME, "", 3.010, None, 0, {}),
        (EventKind.RUN, "pay", 3.201, 186.9, 2, {}),
        (
            EventKind.FAIL,
            "ship",
            3.262,
            None,
            1,
            {"error": "no courier for this postcode", "exception_class": "RuntimeError"},
        ),
        (EventKind.COMPENSATE_SKIPPED, "ship", 3.264, None, 0, {}),
        (EventKind.UNDO, "pay", 3.620, 352.0, 0, {}),
        (EventKind.UNDO, "hold", 3.651, 24.5, 0, {}),
        (EventKind.FAIL, "", 3.655, None, 0, {"status": "failed"}),
    ]
    for seq, (kind, step, at, duration, attempt, data) in enumerate(trace, start=1):
        ExecutionEvent.objects.create(
            execution=row,
            seq=seq,
            kind=kind,
            step=step,
            attempt=attempt,
            at=t0 + dt.timedelta(seconds=at),
            duration_ms=duration,
            data=data,
        )
    StepRecord.objects.create(
        execution=row,
        step="ship",
        status="failed",
        seq=8,
        attempts=1,
        started_at=t0 + dt.timedelta(seconds=3.221),
        finished_at=t0 + dt.timedelta(seconds=3.262),
        error={"kind": "step", "message": "no courier for this postcode"},
    )
    return row


def coordination_held() -> list[tuple[str, str]]:
    """What runs of Payout hold: an account's lock, bank API slots, the account's rate limit,
    its statement's day, its payouts' turn. Returns what to give back."""
    backend = get_backend()
    owners = [str(Payout.run({"account": n}).execution_id) for n in (7, 8, 9)]
    backend.acquire_lock("lock:account-7", owners[0], ttl=60)
    backend.acquire_lock("lock:account-8", owners[1], ttl=60)
    for owner in owners:
        backend.acquire_semaphore("semaphore:bank-api", owner, limit=4, ttl=60)
    for _ in range(4):
        backend.check_rate("rate:payouts-7", [Window(5, 1), Window(100, 60)])
    backend.reserve_period(
        "period:statement-7", timezone.now().strftime("%Y-%m-%d"), owners[0], 120
    )
    for owner in owners:
        backend.enqueue_ordered("ordered:payouts-7", owner)
    return [("lock:account-7", owners[0]), ("lock:account-8", owners[1])] + [
        ("semaphore:bank-api", owner) for owner in owners
    ]


def give_back(held: list[tuple[str, str]]) -> None:
    backend = get_backend()
    for key, owner in held:
        if key.startswith("lock:"):
            backend.release_lock(key, owner)
        else:
            backend.release_semaphore(key, owner)
    backend.reset_ordered("ordered:payouts-7")


def test_take_the_console_screenshots(browser: Any, live_server: Any, operator: Any) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    an_hour_of_checkouts()
    for order in ("A-1041", "A-1042"):
        RefundReview.run({"order": order})
    timeline_run = a_checkout_that_retried_and_rolled_back()
    held = coordination_held()
    try:
        context = browser.new_context(
            viewport={"width": 1400, "height": 900}, color_scheme="light", locale="en-US"
        )
        page = context.new_page()
        log_in(page, live_server.url)
        page.goto(live_server.url + reverse("admin:django_reactor_execution_changelist"))
        shoot_down_to(page, "#changelist", OUT / "admin-list.png")
        context.close()
        for scheme in ("light", "dark"):
            context, page = open_page(browser, color_scheme=scheme)
            try:
                log_in(page, live_server.url)
                page.goto(live_server.url + detail(timeline_run.pk))
                name = "admin-timeline.png" if scheme == "light" else "admin-timeline-dark.png"
                shoot_section(page, "#reactor-timeline", OUT / name)
                if scheme == "dark":
                    continue
                page.goto(live_server.url + reverse("admin:django_reactor_execution_overview"))
                shoot_down_to(page, "#reactor-stuck", OUT / "admin-overview.png")
                page.goto(live_server.url + reverse("admin:django_reactor_execution_coordination"))
                shoot_down_to(page, "#reactor-ordered", OUT / "admin-coordination.png")
            finally:
                context.close()
    finally:
        give_back(held)


# ---------------------------------------------------------------------------- lists and schedules


def test_take_the_list_and_schedule_screenshots(
    browser: Any, live_server: Any, operator: Any
) -> None:
    from django_reactor import services
    from tests.browser.test_readable_browser import widest_interrupts, widest_maps
    from tests.schedules.reactors import NightlyReport

    OUT.mkdir(parents=True, exist_ok=True)
    map_in_flight()
    widest_maps()
    for order in ("A-1041", "A-1042"):
        RefundReview.run({"order": order})
    widest_interrupts()
    nightly = services.schedules.create(
        NightlyReport,
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        inputs={"region": "eu"},
        name="nightly-report-eu",
        overlap="queue",
    )
    services.schedules.run_now(nightly)
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, color_scheme="light", locale="en-US"
    )
    try:
        page = context.new_page()
        log_in(page, live_server.url)
        page.goto(live_server.url + reverse("admin:django_reactor_maprun_changelist"))
        shoot_down_to(page, "#changelist", OUT / "admin-maps.png")
        page.goto(live_server.url + reverse("admin:django_reactor_interrupt_changelist"))
        shoot_down_to(page, "#changelist", OUT / "admin-interrupts.png")
        page.goto(
            live_server.url + reverse("admin:django_reactor_schedule_change", args=[nightly.id])
        )
        shoot_down_to(page, ".field-recent_fires", OUT / "admin-schedule.png")
        page.locator("#reactor-run-now").click()
        page.wait_for_url(f"**/{nightly.id}/run-now/")
        shoot_down_to(page, "#content", OUT / "admin-schedule-run-now.png")
    finally:
        context.close()


def test_take_the_fleet_screenshots(browser: Any, live_server: Any, operator: Any) -> None:
    import json as json_module

    from django_reactor import acting_as, services

    OUT.mkdir(parents=True, exist_ok=True)
    completed = Checkout.run({"order": "A-2001"}).execution_id
    FAIL.add("charge_card")
    failed = [Checkout.run({"order": f"A-20{n}"}).execution_id for n in range(10, 16)]
    FAIL.discard("charge_card")
    with acting_as("operator (user 1)", via="admin"):
        services.retry(failed[0], reason="card gateway fixed")
        services.pause_reactor(RefundReview, reason="refund provider down until 14:00")
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, color_scheme="light", locale="en-US"
    )
    try:
        page = context.new_page()
        log_in(page, live_server.url)
        page.goto(live_server.url + reverse("admin:django_reactor_execution_overview"))
        shoot_down_to(page, "#reactor-health", OUT / "admin-paused-banner.png")
        fork = reverse("admin:django_reactor_execution_fork", args=[str(completed)])
        page.goto(live_server.url + fork + "?step=charge_card")
        shoot_down_to(page, "#content", OUT / "admin-fork.png")
        bulk = reverse("admin:django_reactor_bulkoperation_new")
        pairs = json_module.dumps({"reactor": Checkout.definition.name, "status": "failed"})
        page.goto(live_server.url + bulk + f"?action=retry&filter={pairs}")
        shoot_down_to(page, "#content", OUT / "admin-bulk-preview.png")
        page.fill("#id_reason", "card gateway fixed")
        page.locator("#reactor-bulk-preview input[type=submit]").click()
        page.wait_for_url("**/bulkoperation/**/change/")
        operation = page.url.rstrip("/").split("/")[-2]
        services.run_bulk(operation)  # what the worker does
        page.reload()
        shoot_down_to(page, "#content", OUT / "admin-bulk-operation.png")
        page.goto(live_server.url + reverse("admin:django_reactor_auditentry_changelist"))
        shoot_down_to(page, "#changelist", OUT / "admin-steering-history.png")
    finally:
        context.close()
