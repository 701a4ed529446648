"""The list of runs in narrow cells, large values folded behind an expander, and lists of
moving runs that read themselves again."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_reactor.admin.display import breakable, json_block, moment, pretty_json
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.admin.reactors import Booking
from tests.shapes import keep_shape

CHANGELIST = reverse("admin:django_reactor_execution_changelist")


def make_row(status: str, **fields: Any) -> Execution:
    keep_shape(Booking.definition)
    return Execution.objects.create(
        reactor=Booking.definition.name,
        definition_hash=Booking.definition.definition_hash,
        status=status,
        **fields,
    )


@pytest.mark.django_db
def test_a_large_input_is_folded_and_a_small_one_is_not(client_operator: Client) -> None:
    lines = [{"sku": f"SKU-{n}", "qty": n} for n in range(300)]
    big = make_row(ExecutionStatus.COMPLETED, inputs={"order": "B-1", "lines": lines})
    small = make_row(ExecutionStatus.COMPLETED, inputs={"order": "S-1"}, result={"ok": True})

    html = client_operator.get(
        reverse("admin:django_reactor_execution_change", args=[big.pk])
    ).content.decode()
    inputs = html.split("field-redacted_inputs")[1].split("field-result_json")[0]
    assert '<details class="reactor-json reactor-fold">' in inputs
    assert "<details open" not in inputs
    assert re.search(r"305 lines, [\d.]+ kB: show all", inputs)
    assert "SKU-299" in inputs  # all there, behind the summary

    html = client_operator.get(
        reverse("admin:django_reactor_execution_change", args=[small.pk])
    ).content.decode()
    inputs = html.split("field-redacted_inputs")[1].split("field-result_json")[0]
    assert "<details" not in inputs
    assert '<pre class="reactor-json">{&quot;order&quot;: &quot;S-1&quot;}</pre>' in inputs


def test_pretty_json_keeps_what_fits_on_a_line_and_packs_scalars() -> None:
    value = {
        "order": "B-1",
        "lines": [{"sku": f"SKU-{n}", "qty": n} for n in range(6)],
        "numbers": list(range(40)),
        "empty": [],
    }
    text = pretty_json(value)
    assert json.loads(text) == value
    assert '    {"sku": "SKU-0", "qty": 0},' in text.splitlines()
    assert len(text.splitlines()) == 16  # not one line per number
    assert pretty_json({"a": 1}) == '{"a": 1}'
    assert pretty_json(None) == "null"


def test_a_folded_value_says_how_large_it_is() -> None:
    html = str(json_block(list(range(2000))))
    assert html.startswith('<details class="reactor-json reactor-fold"><summary><code>[0, 1, 2')
    assert "kB: show all" in html


def test_names_wrap_at_word_boundaries_and_times_take_two_lines() -> None:
    assert str(breakable("RenewDueSubscriptions")) == "Renew<wbr>Due<wbr>Subscriptions"
    assert str(breakable("charge_card")) == "charge_<wbr>card"
    import datetime as dt
    from zoneinfo import ZoneInfo

    html = str(moment(dt.datetime(2026, 12, 3, 10, 4, 5, 123456, tzinfo=dt.UTC)))
    assert "<span>2026-12-03</span> <span>10:04:05</span>" in html
    assert 'title="2026-12-03 10:04:05.123 UTC"' in html
    assert str(moment(None)) == "-"
    # In a zone of its own (a schedule's), the zone is named after the time.
    berlin = str(
        moment(dt.datetime(2026, 12, 3, 10, 4, 5, tzinfo=dt.UTC), ZoneInfo("Europe/Berlin"))
    )
    assert "<span>2026-12-03</span> <span>11:04:05 CET</span>" in berlin


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "refreshes"),
    [
        ("?status__exact=running", True),
        ("?status__exact=pending", True),
        ("?status__exact=rolling_back", True),
        ("?status__exact=completed", False),
        ("?status__exact=paused", False),
        ("", False),
    ],
)
def test_a_list_of_moving_runs_reads_itself_again(
    client_operator: Client, query: str, refreshes: bool
) -> None:
    make_row(ExecutionStatus.RUNNING)
    html = client_operator.get(CHANGELIST + query).content.decode()
    assert ('id="reactor-refresh"' in html) is refreshes
