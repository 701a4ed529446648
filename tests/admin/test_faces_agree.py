"""The admin, the API and the commands show one run the same way: its duration (from
``started_at`` to ``finished_at``, one format) and its outcome as JSON (one ``outcome_data``)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from django_reactor import Reactor, arg, step
from django_reactor.display import duration_seconds, format_duration
from django_reactor.engine.outcomes import (
    Aborted,
    Cancelled,
    Completed,
    Dispatched,
    ErrorInfo,
    Failed,
    Halted,
    InProgress,
    Outcome,
    Paused,
    PendingInterrupt,
    Rescheduled,
    outcome_data,
)
from django_reactor.engine.validation import error_messages, summarise_errors
from django_reactor.models import Execution, StepRecord
from django_reactor.states import ExecutionStatus
from tests.commands.tables import read_table, section
from tests.helpers import FAIL_AT, ledger
from tests.integration.reactors import Transfer

RUN_ID = uuid.UUID("6f1c2d3e-0000-4000-8000-000000000001")
WHEN = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
PRICE = {"total": decimal.Decimal("19.90"), "due": dt.date(2024, 5, 31), "order": 42}


# ---------------------------------------------------------------------------- the formatter


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0.0, "0.0 ms"),
        (0.0004, "0.4 ms"),
        (0.0052, "5.2 ms"),
        (0.012, "12 ms"),
        (0.2214, "221 ms"),
        (0.99949, "999 ms"),
        (0.9996, "1.0 s"),
        (1.3, "1.3 s"),
        (59.94, "59.9 s"),
        (59.96, "1 min 00 s"),
        (65, "1 min 05 s"),
        (3599.6, "1 h 00 min"),
        (7500, "2 h 05 min"),
        (2 * 86400 + 4 * 3600, "2 d 04 h"),
        (-0.5, "0.0 ms"),
    ],
)
def test_one_duration_format_with_millisecond_precision(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_a_duration_runs_from_started_at_to_finished_at() -> None:
    assert duration_seconds(WHEN, WHEN + dt.timedelta(milliseconds=221.4)) == pytest.approx(0.2214)
    assert duration_seconds(None, WHEN) is None  # never started (a pending run cancelled)
    assert duration_seconds(WHEN, None) is None  # still going
    assert duration_seconds(WHEN, WHEN - dt.timedelta(seconds=1)) == 0.0  # two machines' clocks


# ---------------------------------------------------------------------------- error messages


def test_serializer_errors_flatten_to_dotted_paths_once() -> None:
    errors = {
        "non_field_errors": ["Pick a date or a slot."],
        "amount": ["Required.", "Must be positive."],
        "items": [{}, {"sku": ["Unknown SKU."]}],
        "address": {"non_field_errors": ["Incomplete."], "zip": ["Too short."]},
    }
    assert error_messages(errors) == [
        ("", "Pick a date or a slot."),
        ("amount", "Required."),
        ("amount", "Must be positive."),
        ("items.1.sku", "Unknown SKU."),
        ("address", "Incomplete."),
        ("address.zip", "Too short."),
    ]
    # The one-line summary keeps each field's first message.
    assert summarise_errors(errors) == (
        "Pick a date or a slot.; amount: Required.; items.1.sku: Unknown SKU.; "
        "address: Incomplete.; address.zip: Too short."
    )
    assert error_messages({"amount": []}) == []


# ---------------------------------------------------------------------------- outcome shapes


ERROR = ErrorInfo(kind="step", message="boom", step="charge")
SHAPES: list[tuple[Outcome, dict[str, Any]]] = [
    (
        Completed(execution_id=RUN_ID, value=PRICE),
        {
            "value": {
                "total": {"__reactor_type__": "decimal", "v": "19.90"},
                "due": {"__reactor_type__": "date", "v": "2024-05-31"},
                "order": 42,
            }
        },
    ),
    (Failed(execution_id=RUN_ID, error=ERROR), {"error": ERROR.to_dict()}),
    (Aborted(execution_id=RUN_ID, error=ERROR), {"error": ERROR.to_dict()}),
    (Aborted(execution_id=RUN_ID), {}),
    (
        Halted(execution_id=RUN_ID, step="check", reason=("out", "of stock")),
        {"step": "check", "reason": {"__reactor_type__": "tuple", "v": ["out", "of stock"]}},
    ),
    (Cancelled(execution_id=RUN_ID, reason="customer left"), {"reason": "customer left"}),
    (
        Paused(
            execution_id=RUN_ID,
            interrupts=(PendingInterrupt("approval", "refund-7", WHEN, token="secret"),),
        ),
        {
            "interrupts": [
                {
                    "step": "approval",
                    "correlation_id": "refund-7",
                    "expires_at": "2024-05-01T12:30:00+00:00",
                }
            ]
        },
    ),
    (Rescheduled(execution_id=RUN_ID, step="charge", delay=2.0), {"step": "charge"}),
    (Dispatched(execution_id=RUN_ID, results={"a": 1}), {}),
    (InProgress(execution_id=RUN_ID, status=ExecutionStatus.RUNNING), {}),
]


@pytest.mark.parametrize(("outcome", "carried"), SHAPES, ids=lambda v: type(v).__name__)
def test_outcome_data_writes_every_outcome_one_way(
    outcome: Outcome, carried: dict[str, Any]
) -> None:
    data = outcome_data(outcome)
    assert data == {
        "execution_id": str(RUN_ID),
        "status": str(outcome.status),
        "idempotent_replay": False,
        **carried,
    }
    json.dumps(data)  # plain JSON: no default= needed
    assert "secret" not in json.dumps(data)  # a resume token is never written out


def test_outcome_data_of_a_replay_and_of_a_run_not_yet_known() -> None:
    data = outcome_data(InProgress(execution_id=None, status="pending", idempotent_replay=True))
    assert data == {"execution_id": None, "status": "pending", "idempotent_replay": True}


# ---------------------------------------------------------------------------- one run, three faces


def command(name: str, *args: Any, **options: Any) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out, no_color=True, **options)
    return out.getvalue()


@pytest.fixture
def api(operator: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(operator)
    return client


@pytest.mark.django_db(transaction=True)
def test_admin_api_and_commands_show_the_same_durations_for_one_run_and_its_steps(
    client_operator: Client, api: APIClient
) -> None:
    outcome = Transfer.run({"account": "acc-1", "amount": 5, "pin": "1234"})
    run_id = outcome.execution_id
    started = timezone.now() - dt.timedelta(minutes=5)
    # Created 80 ms before it started (a worker's queue): the queue is not part of the run's
    # duration. The faces used to disagree here (created_at against started_at).
    Execution.objects.filter(pk=run_id).update(
        created_at=started - dt.timedelta(milliseconds=80),
        started_at=started,
        finished_at=started + dt.timedelta(milliseconds=221.4),
    )
    # A completed step's trace entry is its step record (store.trace): its duration_ms is the
    # time the body took. The step's own duration runs from its started_at to its finished_at.
    StepRecord.objects.filter(execution_id=run_id, step="debit").update(
        duration_ms=0.4,
        started_at=started + dt.timedelta(milliseconds=1),
        finished_at=started + dt.timedelta(milliseconds=13.5),
    )
    StepRecord.objects.filter(execution_id=run_id, step="credit").update(
        started_at=started + dt.timedelta(milliseconds=14),
        finished_at=started + dt.timedelta(milliseconds=14.4),
    )

    detail = api.get(f"/reactor/executions/{run_id}/").json()
    assert detail["duration_ms"] == 221.4
    listed = api.get("/reactor/executions/").json()["results"]
    assert [row["duration_ms"] for row in listed] == [221.4]
    assert format_duration(detail["duration_ms"] / 1000) == "221 ms"
    debit = next(e for e in detail["trace"] if e["step"] == "debit" and e["kind"] == "run")
    assert debit["duration_ms"] == 0.4
    api_steps = {s["name"]: s["duration_ms"] for s in detail["steps"]}
    assert (api_steps["debit"], api_steps["credit"]) == (12.5, 0.4)
    assert format_duration(api_steps["debit"] / 1000) == "12 ms"

    listing = command("reactor_list")
    assert listing.splitlines()[1].endswith("221 ms")
    assert json.loads(command("reactor_list", json=True))[0]["duration_seconds"] == 0.2214

    shown = command("reactor_show", str(run_id))
    assert "(took 221 ms)" in shown
    debit_line = next(line for line in shown.splitlines() if "debit          ran" in line)
    assert debit_line.endswith("[0.4 ms]")
    steps = {row["STEP"]: row["DURATION"] for row in read_table(section(shown, "steps:"))}
    assert (steps["debit"], steps["credit"]) == ("12 ms", "0.4 ms")  # not "0.0 s"
    data = json.loads(command("reactor_show", str(run_id), json=True))
    assert data["duration_seconds"] == 0.2214
    shown_steps = {s["name"]: s["duration_seconds"] for s in data["steps"]}
    assert shown_steps["debit"] == pytest.approx(0.0125)
    assert shown_steps["credit"] == pytest.approx(0.0004)
    assert dt.datetime.fromisoformat(data["started_at"]) == started

    changelist = client_operator.get(reverse("admin:django_reactor_execution_changelist"))
    assert '<td class="field-duration">221 ms</td>' in changelist.content.decode()
    page = client_operator.get(
        reverse("admin:django_reactor_execution_change", args=[str(run_id)])
    ).content.decode()
    assert "221 ms" in page
    steps_table = page[page.index('id="reactor-steps"') : page.index('id="reactor-trace"')]
    debit_row = steps_table[steps_table.index('data-step="debit"') :]
    assert "<td>12 ms</td>" in debit_row[: debit_row.index("</tr>")]
    credit_row = steps_table[steps_table.index('data-step="credit"') :]
    assert "<td>0.4 ms</td>" in credit_row[: credit_row.index("</tr>")]
    trace_table = page[page.index('id="reactor-trace"') :]
    assert "<td>0.4 ms</td>" in trace_table  # debit's trace entry, not "0.0 s"


def price_list(order: int) -> dict[str, Any]:
    ledger("run", "price")
    if "price" in FAIL_AT:
        raise RuntimeError("the price list is down")
    return {**PRICE, "order": order}


class PricedQuote(Reactor):
    """Fails at ``price`` while FAIL_AT holds it; returns a date and a decimal otherwise."""

    price = step(price_list, order=arg.input("order"))

    class Meta:
        returns = "price"


SHARED_ERROR_FIELDS = ("kind", "step", "reactor", "exception_class", "message", "retryable")


@pytest.mark.django_db(transaction=True)
def test_the_api_and_reactor_run_json_write_an_outcome_alike(api: APIClient) -> None:
    FAIL_AT.add("price")
    failed_cmd = json.loads(
        command("reactor_run", "PricedQuote", "order=42", json=True, exit_zero=True)
    )
    failed_api = api.post(f"/reactor/executions/{failed_cmd['execution_id']}/retry/").json()
    assert failed_cmd["status"] == failed_api["status"] == "failed"
    assert set(failed_cmd) == set(failed_api)
    assert failed_cmd["idempotent_replay"] is failed_api["idempotent_replay"] is False
    for field in SHARED_ERROR_FIELDS:
        assert failed_cmd["error"][field] == failed_api["error"][field], field
    assert failed_cmd["error"]["message"] == "the price list is down"

    FAIL_AT.clear()
    done_api = api.post(f"/reactor/executions/{failed_api['execution_id']}/retry/").json()
    done_cmd = json.loads(command("reactor_run", "PricedQuote", "order=42", json=True))
    assert done_api.pop("execution_id") != done_cmd.pop("execution_id")
    assert (
        done_api
        == done_cmd
        == {
            "status": "completed",
            "idempotent_replay": False,
            "value": {
                "total": {"__reactor_type__": "decimal", "v": "19.90"},
                "due": {"__reactor_type__": "date", "v": "2024-05-31"},
                "order": 42,
            },
        }
    )
