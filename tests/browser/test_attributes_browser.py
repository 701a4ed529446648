"""The runs list's "By attribute" box in a real browser: type a filter, the list narrows to the
runs that have it, and a run's attribute links back to them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import require_browser

require_browser()

from django.urls import reverse  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from tests.integration.attribute_reactors import Order  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_the_attribute_box_narrows_the_list_and_a_runs_attribute_links_back(
    admin_page: Any, live_server: Any
) -> None:
    wanted = [Order.run({"customer_id": 42, "tenant": "Acme Corp"}) for _ in range(2)]
    other = Order.run({"customer_id": 7, "tenant": "Acme Corp"})
    changelist = live_server.url + reverse("admin:django_reactor_execution_changelist")
    admin_page.goto(changelist + "?status__exact=completed")

    box = admin_page.locator('form.reactor-attribute-filter input[name="attr"]')
    expect(box).to_be_visible()
    box.fill('customer_id=42 tenant="Acme Corp"')
    box.press("Enter")

    rows = admin_page.locator("#result_list tbody tr th.field-run a")
    expect(rows).to_have_count(2)
    shown = rows.all_inner_texts()
    assert shown == [str(o.execution_id)[:8] for o in reversed(wanted)]
    assert str(other.execution_id)[:8] not in shown
    assert "status__exact=completed" in admin_page.url  # the other filter kept
    expect(box).to_have_value('customer_id=42 tenant="Acme Corp"')

    rows.first.click()
    admin_page.locator(".field-attributes a", has_text="42").click()
    expect(admin_page.locator("#result_list tbody tr")).to_have_count(2)
    expect(box).to_have_value("customer_id=42")
