"""The executions API: reading (permissions, filters, pagination, redaction, query counts),
the cancel, undo and retry actions, and REACTOR["API_SCOPE"] (tenants)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from django_reactor import Failed, Paused, services
from django_reactor.models import Execution, Interrupt
from django_reactor.store.interrupts import token_hash
from tests.api.conftest import (
    ALL_PERMISSIONS,
    TENANT_SCOPE,
    client_for,
    make_user,
    user_with,
)
from tests.api.reactors import ApiRefund, ApiRefundInBackground
from tests.integration.reactors import FAIL_AT, ledger

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/reactor/executions/"
CARD = "4111-1111-SECRET-7731"
INTERRUPT_FIELDS = {
    "step",
    "status",
    "correlation_id",
    "expires_at",
    "invalid_attempts",
    "max_attempts",
    "resume_mode",
    "created_at",
    "closed_at",
}


def detail(execution_id: Any) -> str:
    return f"{LIST}{execution_id}/"


def action(execution_id: Any, name: str) -> str:
    return f"{LIST}{execution_id}/{name}/"


def paused_run(order: str = "A1") -> uuid.UUID:
    outcome = ApiRefund.run({"order": order, "card": CARD})
    assert isinstance(outcome, Paused), outcome
    assert outcome.execution_id is not None
    return outcome.execution_id


def completed_run(order: str = "B2") -> uuid.UUID:
    execution_id = paused_run(order)
    outcome = services.resume_interrupt(
        execution_id, step="approval", payload={"approved": True, "note": "ok"}
    )
    assert outcome.status == "completed", outcome
    return execution_id


def failed_run(order: str = "F1", *, at: str = "request") -> uuid.UUID:
    FAIL_AT.add(at)
    try:
        outcome = ApiRefund.run({"order": order, "card": CARD})
    finally:
        FAIL_AT.discard(at)
    assert isinstance(outcome, Failed), outcome
    assert outcome.execution_id is not None
    return outcome.execution_id


def bare_rows(count: int, **fields: Any) -> list[Execution]:
    """``count`` stored executions without steps (fast to make in bulk)."""
    values = {"reactor": ApiRefund.definition.name, "definition_hash": "x", **fields}
    if "parent_id" in fields:  # children of one parent need steps of their own
        return Execution.objects.bulk_create(
            Execution(**values, parent_step=f"child-{uuid.uuid4()}") for _ in range(count)
        )
    return Execution.objects.bulk_create(Execution(**values) for _ in range(count))


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


# ---------------------------------------------------------------------------- permissions


def test_reading_needs_the_view_execution_permission(anonymous: APIClient) -> None:
    execution_id = paused_run()
    without = client_for(user_with("resume_interrupt", "cancel_execution"))
    for path in (LIST, detail(execution_id)):
        refused = anonymous.get(path)
        # No credential is 401 whatever the first authentication class (DRF alone would
        # answer 403 under SessionAuthentication, the test project's first), with a challenge.
        assert refused.status_code == 401
        assert refused["WWW-Authenticate"]
        assert refused.json() == {
            "detail": "Authentication credentials were not provided.",
            "code": "not_authenticated",
        }
        forbidden = without.get(path)
        assert forbidden.status_code == 403
        assert "django_reactor.view_execution" in forbidden.json()["detail"]
        assert str(execution_id) not in forbidden.content.decode()
    allowed = client_for(make_user("reader", "view_execution"))
    assert ids(allowed.get(LIST)) == [str(execution_id)]
    assert allowed.get(detail(execution_id)).status_code == 200


def test_anonymous_reads_are_401_when_basic_authentication_comes_first(
    anonymous: APIClient, settings: Any
) -> None:
    # DRF answers 401 only when its first authentication class sends a WWW-Authenticate
    # header; the test project's defaults start with SessionAuthentication (403 above).
    settings.REACTOR = {
        **settings.REACTOR,
        "API_AUTHENTICATION_CLASSES": [
            "rest_framework.authentication.BasicAuthentication",
            "rest_framework.authentication.SessionAuthentication",
        ],
    }
    execution_id = paused_run()
    for path in (LIST, detail(execution_id)):
        response = anonymous.get(path)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"].startswith("Basic")
    make_user("basic-reader", "view_execution")
    for password, code in (("pw", 200), ("wrong", 401)):
        secret = base64.b64encode(f"basic-reader:{password}".encode()).decode()
        anonymous.credentials(HTTP_AUTHORIZATION=f"Basic {secret}")
        assert anonymous.get(LIST).status_code == code


# ---------------------------------------------------------------------------- filters


def test_filters_by_reactor_status_and_correlation_id(operator: APIClient) -> None:
    paused = paused_run("A1")
    done = completed_run("B2")
    other = ApiRefundInBackground.run({}).execution_id

    def found(query: str) -> set[str]:
        return set(ids(operator.get(f"{LIST}?{query}")))

    assert found("") == {str(paused), str(done), str(other)}
    assert found("reactor=tests.ApiRefund") == {str(paused), str(done)}
    assert found("reactor=tests.ApiRefundInBackground") == {str(other)}
    assert found("reactor=tests.Nope") == set()
    assert found("status=paused") == {str(paused), str(other)}
    assert found("status=completed") == {str(done)}
    assert found("status=paused,completed") == {str(paused), str(done), str(other)}
    assert found("status= paused , completed ") == {str(paused), str(done), str(other)}
    assert found("status=failed") == set()
    assert found("reactor=tests.ApiRefund&status=paused") == {str(paused)}
    assert found("correlation_id=api-refund-A1") == {str(paused)}
    # The interrupt of a finished run keeps its correlation id.
    assert found("correlation_id=api-refund-B2&status=completed") == {str(done)}
    assert found("correlation_id=api-refund-nope") == set()


def test_an_unknown_status_is_400_naming_it(operator: APIClient) -> None:
    paused_run()
    response = operator.get(f"{LIST}?status=paused,bogus,Weird")
    assert response.status_code == 400
    body = response.json()
    assert (body["code"], body["detail"]) == ("invalid", "the request is invalid")
    message = body["errors"]["status"][0]
    assert message.startswith("unknown status Weird, bogus;")
    assert "paused" in message  # the valid statuses are listed after the unknown ones


def test_created_after_and_before(operator: APIClient) -> None:
    old, middle, new = bare_rows(3)
    base = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    for row, days in ((old, 0), (middle, 10), (new, 20)):
        Execution.objects.filter(pk=row.pk).update(created_at=base + dt.timedelta(days=days))

    def found(query: str) -> list[str]:
        return ids(operator.get(f"{LIST}?{query}"))

    assert found("created_after=2024-05-11T12:00:00Z") == [str(new.pk), str(middle.pk)]
    assert found("created_before=2024-05-11T12:00:00Z") == [str(old.pk)]
    assert found("created_after=2024-05-01T12:00:01Z&created_before=2024-05-21T12:00:00Z") == [
        str(middle.pk)
    ]
    # An offset is honoured: 14:00+02:00 is 12:00 UTC.
    assert found("created_after=2024-05-11T14:00:00%2B02:00") == [str(new.pk), str(middle.pk)]
    for name in ("created_after", "created_before"):
        for bad in ("yesterday", "2024-13-45T00:00:00Z", "2024-05-01T25:00:00Z", "1"):
            response = operator.get(f"{LIST}?{name}={bad}")
            assert response.status_code == 400, (name, bad, response.content)
            assert list(response.json()["errors"]) == [name]
            assert "ISO 8601" in response.json()["errors"][name][0]


@pytest.mark.parametrize("value", ["2024-01-01T00:00:00%2B16:00", "2024-01-01T00:00:00-23:59"])
def test_a_date_with_a_large_offset_is_not_a_server_error(value: str) -> None:
    client = client_for(user_with("view_execution"), raise_request_exception=False)
    response = client.get(f"{LIST}?created_after={value}")
    assert response.status_code < 500


def test_a_date_without_an_offset_is_read_as_utc(operator: APIClient) -> None:
    (row,) = bare_rows(1)
    Execution.objects.filter(pk=row.pk).update(
        created_at=dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    )
    assert ids(operator.get(f"{LIST}?created_after=2024-05-01T11:00:00")) == [str(row.pk)]


@pytest.mark.parametrize("name", ["reactor", "correlation_id"])
def test_a_nul_character_in_a_filter_is_not_a_server_error(name: str) -> None:
    client = client_for(user_with("view_execution"), raise_request_exception=False)
    response = client.get(f"{LIST}?{name}=a%00b")
    assert response.status_code < 500


# ---------------------------------------------------------------------------- pagination


def test_cursor_pagination_walks_every_row_once_newest_first(operator: APIClient) -> None:
    rows = bare_rows(7)
    base = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
    for minutes, row in enumerate(rows):  # distinct creation times: one order only
        Execution.objects.filter(pk=row.pk).update(created_at=base + dt.timedelta(minutes=minutes))
    expected = [str(row.pk) for row in reversed(rows)]
    seen: list[str] = []
    sizes: list[int] = []
    page = operator.get(f"{LIST}?page_size=3").json()
    while True:
        sizes.append(len(page["results"]))
        seen += [row["id"] for row in page["results"]]
        if page["next"] is None:
            break
        page = operator.get(page["next"]).json()
    assert sizes == [3, 3, 1]
    assert seen == expected
    back = operator.get(page["previous"]).json()
    assert [row["id"] for row in back["results"]] == expected[3:6]
    # More than 500 asks for 500; no page_size, the default (50).
    assert len(operator.get(f"{LIST}?page_size=9999").json()["results"]) == 7
    assert len(operator.get(LIST).json()["results"]) == 7
    assert operator.get(f"{LIST}?cursor=not-a-cursor").status_code == 404


@pytest.mark.parametrize("value", ["0", "-1", "abc", "null", "", "1.5", " 3", "\u0663"])
def test_a_page_size_that_is_not_a_positive_whole_number_is_400(
    operator: APIClient, value: str
) -> None:
    bare_rows(2)
    response = operator.get(LIST, {"page_size": value})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid"
    (message,) = body["errors"]["page_size"]
    assert message.startswith("must be a whole number from 1"), message


def test_list_rows_carry_no_inputs_steps_or_trace(operator: APIClient) -> None:
    paused_run()
    (row,) = operator.get(LIST).json()["results"]
    assert set(row) == {
        "id",
        "reactor",
        "status",
        "current_step",
        "parent",
        "retry_of",
        "fork_step",
        "continued_from",
        "generation",
        "concurrency_key",
        "throttle_key",
        "debounce_key",
        "batch_key",
        "batch_size",
        "queue",
        "priority",
        "created_at",
        "started_at",
        "updated_at",
        "finished_at",
        "duration_ms",
    }
    assert CARD not in json.dumps(row)


def test_a_forged_cursor_is_not_a_server_error() -> None:
    client = client_for(user_with("view_execution"), raise_request_exception=False)
    bare_rows(2)
    forged = base64.b64encode(b"p=garbage").decode()
    response = client.get(f"{LIST}?cursor={forged}")
    assert response.status_code in (400, 404)


# ---------------------------------------------------------------------------- detail


def test_detail_redacts_the_card_everywhere(operator: APIClient) -> None:
    execution_id = paused_run()
    token = services.issue_resume_token(execution_id, "approval")
    response = operator.get(detail(execution_id))
    assert response.status_code == 200
    text = response.content.decode()
    data = response.json()
    assert data["inputs"] == {"order": "A1", "card": "[REDACTED]"}
    assert CARD not in text
    assert token not in text
    assert token_hash(token) not in text
    assert data["status"] == "paused"
    assert data["current_step"] == "approval"
    (request,) = [s for s in data["steps"] if s["name"] == "request"]
    assert request["arguments"] == {"order": "A1", "card": "[REDACTED]"}
    assert request["status"] == "completed"
    assert [e["kind"] for e in data["trace"]] == ["start", "run", "interrupt", "pause"]
    assert [e["seq"] for e in data["trace"]] == [1, 2, 3, 4]
    (pending,) = data["interrupts"]
    assert set(pending) == INTERRUPT_FIELDS  # never token_hash nor payload
    assert pending["step"] == "approval"
    assert pending["status"] == "waiting"
    assert pending["correlation_id"] == "api-refund-A1"
    assert pending["max_attempts"] == 3


def test_detail_of_a_resumed_run_shows_the_interrupt_without_its_payload(
    operator: APIClient,
) -> None:
    execution_id = completed_run()
    data = operator.get(detail(execution_id)).json()
    assert CARD not in json.dumps(data)
    (closed,) = data["interrupts"]
    assert set(closed) == INTERRUPT_FIELDS
    assert closed["status"] == "resumed"
    assert closed["closed_at"] is not None
    assert data["status"] == "completed"
    assert [s["name"] for s in data["steps"]] == ["request", "approval", "refund"]
    assert data["duration_ms"] is not None


def test_detail_of_a_failed_run_keeps_the_card_out_of_the_failure(operator: APIClient) -> None:
    execution_id = failed_run()
    response = operator.get(detail(execution_id))
    assert response.status_code == 200
    data = response.json()
    assert data["status"] == "failed"
    assert data["failure"]["step"] == "request"
    assert data["failure"]["inputs"]["card"] == "[REDACTED]"
    assert data["failure"]["arguments"]["card"] == "[REDACTED]"
    assert CARD not in response.content.decode()


def test_unknown_and_malformed_ids_are_404(operator: APIClient) -> None:
    execution_id = paused_run()
    assert operator.get(detail(uuid.uuid4())).status_code == 404
    assert operator.get(detail(str(execution_id).upper())).status_code == 200
    for malformed in ("-" * 36, "0" * 36, "g" * 36, "not-an-id", "1", f"{execution_id}0"):
        assert operator.get(detail(malformed)).status_code == 404, malformed
        for name in ("cancel", "undo", "retry"):
            assert operator.post(action(malformed, name)).status_code == 404, (malformed, name)
    assert Execution.objects.get(pk=execution_id).status == "paused"


# ---------------------------------------------------------------------------- query counts


def _count(client: APIClient, path: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    assert response.status_code == 200, response.content
    return len(queries)


def test_the_list_uses_the_same_queries_for_5_and_50_rows(
    operator: APIClient, django_assert_max_num_queries: Any
) -> None:
    done = completed_run()
    failed = failed_run()
    Execution.objects.filter(pk=done).update(retry_of=failed)
    operator.get(LIST)  # the user's permissions are cached from here on
    queries = {}
    for total in (5, 50):
        # Rows with a parent: the related ids are read without a query per row.
        bare_rows(total - Execution.objects.count(), status="paused", parent_id=done)
        with django_assert_max_num_queries(2):
            response = operator.get(f"{LIST}?page_size=100")
        assert len(response.json()["results"]) == total
        queries[total] = (
            _count(operator, f"{LIST}?page_size=100&status=paused,completed"),
            _count(operator, f"{LIST}?page_size=100&correlation_id=api-refund-B2"),
            _count(operator, f"{LIST}?page_size=20"),
        )
    assert queries[5] == queries[50]
    assert max(queries[50]) <= 2


def test_the_detail_uses_a_bounded_number_of_queries(
    operator: APIClient, django_assert_max_num_queries: Any
) -> None:
    small = paused_run("S1")
    big = completed_run("B1")
    operator.get(detail(small))  # permissions cached
    counts = []
    for execution_id in (small, big):
        # The run, its attributes, its interrupts, its messages, its steps, its trace, its
        # maps, the pause that holds it: whatever their number.
        with django_assert_max_num_queries(8):
            operator.get(detail(execution_id))
        counts.append(_count(operator, detail(execution_id)))
    assert counts[0] == counts[1]


# ---------------------------------------------------------------------------- actions


def test_cancel_stores_the_reason_and_closes_the_interrupt(operator: APIClient) -> None:
    execution_id = paused_run()
    response = operator.post(
        action(execution_id, "cancel"), {"reason": "the customer called"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["id"] == str(execution_id)
    assert response.json()["status"] == "cancelled"
    assert response.json()["interrupts"][0]["status"] == "cancelled"
    row = Execution.objects.get(pk=execution_id)
    assert row.cancel_reason == "the customer called"
    assert ledger.calls == [("run", "request")]  # nothing rolled back
    again = operator.post(action(execution_id, "cancel"), {"reason": "twice"}, format="json")
    assert again.status_code == 409
    assert again.json()["code"] == "invalid_transition"
    assert again.json()["status"] == "cancelled"
    assert Execution.objects.get(pk=execution_id).cancel_reason == "the customer called"


def test_cancel_without_a_body_and_a_long_reason(operator: APIClient) -> None:
    first, second = paused_run("C1"), paused_run("C2")
    assert operator.post(action(first, "cancel")).status_code == 200
    assert Execution.objects.get(pk=first).cancel_reason == "cancelled"
    long = operator.post(action(second, "cancel"), {"reason": "x" * 5000}, format="json")
    assert long.status_code == 200
    assert Execution.objects.get(pk=second).cancel_reason == "x" * 1000


def test_cancel_refuses_a_finished_run(operator: APIClient) -> None:
    for execution_id, status in ((completed_run(), "completed"), (failed_run(), "failed")):
        response = operator.post(action(execution_id, "cancel"), {"reason": "late"}, format="json")
        assert response.status_code == 409
        assert response.json()["code"] == "invalid_transition"
        assert response.json()["status"] == status
        assert Execution.objects.get(pk=execution_id).status == status


def test_a_nul_character_in_the_cancel_reason_is_a_400_naming_the_reason() -> None:
    execution_id = paused_run()
    client = client_for(user_with("cancel_execution"), raise_request_exception=False)
    response = client.post(action(execution_id, "cancel"), {"reason": "a\x00b"}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "parse_error"
    assert "NUL character" in response.json()["errors"]["reason"][0]
    assert Execution.objects.get(pk=execution_id).status == "paused"


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (b"[1, 2]", "invalid", None),
        (b'"stop"', "invalid", None),
        (b"5", "invalid", None),
        (b"null", "invalid", None),
        (b'{"reason": 5}', "invalid", "reason"),
        (b'{"reason": null}', "invalid", "reason"),
        (b'{"reason": ["a"]}', "invalid", "reason"),
    ],
)
def test_a_cancel_body_that_is_not_an_object_with_a_text_reason_is_400(
    operator: APIClient, body: bytes, code: str, field: str | None
) -> None:
    execution_id = paused_run()
    response = operator.post(action(execution_id, "cancel"), body, content_type="application/json")
    assert response.status_code == 400, response.content
    answer = response.json()
    assert answer["code"] == code
    if field is None:
        assert "must be a JSON object" in answer["detail"]
    else:
        assert list(answer["errors"]) == [field]
    assert Execution.objects.get(pk=execution_id).status == "paused"
    empty = operator.post(action(execution_id, "cancel"), b"{}", content_type="application/json")
    assert empty.status_code == 200, empty.content
    assert Execution.objects.get(pk=execution_id).status == "cancelled"


def test_undo_rolls_a_completed_run_back(operator: APIClient) -> None:
    execution_id = completed_run()
    ledger.clear()
    response = operator.post(action(execution_id, "undo"))
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["status"] == "cancelled"
    assert {s["name"]: s["rollback"] for s in data["steps"]} == {
        "request": "undone",
        "approval": "no_handler",
        "refund": "undone",
    }
    assert ledger.calls == [("undo", "refund"), ("undo", "request")]  # newest first
    assert CARD not in response.content.decode()
    # Undoing again finds nothing left to undo and changes nothing.
    again = operator.post(action(execution_id, "undo"))
    assert again.status_code == 200
    assert ledger.calls == [("undo", "refund"), ("undo", "request")]


def test_undo_refuses_a_failed_or_pending_run(operator: APIClient) -> None:
    failed = failed_run()
    (pending,) = bare_rows(1, status="pending")
    for execution_id, status in ((failed, "failed"), (pending.pk, "pending")):
        ledger.clear()
        response = operator.post(action(execution_id, "undo"))
        assert response.status_code == 409, response.content
        assert response.json()["code"] == "invalid_transition"
        assert response.json()["status"] == status
        assert ledger.calls == []


def test_retry_runs_a_failed_run_again_as_a_new_execution(operator: APIClient) -> None:
    failed = failed_run()
    ledger.clear()
    response = operator.post(action(failed, "retry"))
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["status"] == "paused"  # the new run reached its interrupt
    assert data["interrupts"] == [
        {"step": "approval", "correlation_id": "api-refund-F1", "expires_at": None}
    ]
    new_id = uuid.UUID(data["execution_id"])
    assert new_id != failed
    assert Execution.objects.get(pk=new_id).retry_of_id == failed
    assert Execution.objects.get(pk=failed).status == "failed"
    assert ledger.calls == [("run", "request")]
    assert operator.get(detail(new_id)).json()["retry_of"] == str(failed)
    # A failed run is retried once; a run that did not fail is never retried.
    again = operator.post(action(failed, "retry"))
    assert again.status_code == 409
    assert str(new_id) in again.json()["detail"]
    for execution_id, status in ((new_id, "paused"), (completed_run(), "completed")):
        refused = operator.post(action(execution_id, "retry"))
        assert refused.status_code == 409
        assert refused.json() == {
            "detail": refused.json()["detail"],
            "code": "invalid_transition",
            "status": status,
        }
    assert Execution.objects.filter(retry_of__isnull=False).count() == 1


@pytest.mark.parametrize("name", ["cancel", "undo", "retry"])
def test_each_action_needs_its_own_permission(name: str) -> None:
    others = [p for p in ALL_PERMISSIONS if p != f"{name}_execution"]
    client = client_for(user_with(*others))
    targets = {"cancel": paused_run(), "undo": completed_run(), "retry": failed_run()}
    before = {pk: Execution.objects.get(pk=pk).status for pk in targets.values()}
    ledger.clear()
    response = client.post(action(targets[name], name), {"reason": "no"}, format="json")
    assert response.status_code == 403
    assert f"django_reactor.{name}_execution" in response.json()["detail"]
    # Refused before the run is looked up: an unknown id is 403 as well.
    assert client.post(action(uuid.uuid4(), name)).status_code == 403
    assert {pk: Execution.objects.get(pk=pk).status for pk in targets.values()} == before
    assert Execution.objects.count() == 3
    assert ledger.calls == []


# ---------------------------------------------------------------------------- scoping


@pytest.fixture
def tenants(settings: Any) -> dict[str, Any]:
    """Two tenants with a paused run each, and acme's operator (API_SCOPE on)."""
    settings.REACTOR = {**settings.REACTOR, "API_SCOPE": TENANT_SCOPE}
    return {
        "mine": paused_run("acme-1"),
        "theirs": paused_run("globex-1"),
        "acme": client_for(make_user("acme-operator", *ALL_PERMISSIONS, tenant="acme")),
    }


def test_another_tenants_run_is_absent_from_the_list(tenants: dict[str, Any]) -> None:
    client = tenants["acme"]
    assert ids(client.get(LIST)) == [str(tenants["mine"])]
    assert ids(client.get(f"{LIST}?correlation_id=api-refund-globex-1")) == []
    assert ids(client.get(f"{LIST}?reactor=tests.ApiRefund&status=paused")) == [
        str(tenants["mine"])
    ]
    nobody = client_for(make_user("no-tenant", *ALL_PERMISSIONS))
    assert ids(nobody.get(LIST)) == []


def test_another_tenants_run_is_404_on_detail_actions_and_resume(
    tenants: dict[str, Any],
) -> None:
    client, theirs = tenants["acme"], tenants["theirs"]
    assert client.get(detail(tenants["mine"])).status_code == 200
    assert client.get(detail(theirs)).status_code == 404
    for name in ("cancel", "undo", "retry"):
        response = client.post(action(theirs, name), {"reason": "mine now"}, format="json")
        assert response.status_code == 404, (name, response.content)
    by_id = client.post(
        f"{LIST}{theirs}/resume/",
        {"step": "approval", "payload": {"approved": True}},
        format="json",
    )
    by_correlation = client.post(
        "/reactor/correlations/api-refund-globex-1/resume/",
        {"payload": {"approved": True}},
        format="json",
    )
    invalid = client.post(f"{LIST}{theirs}/resume/", {"payload": {"approved": "?"}}, format="json")
    for response in (by_id, by_correlation, invalid):
        assert response.status_code == 404, response.content
        assert "globex" not in response.content.decode()
    row = Execution.objects.get(pk=theirs)
    assert row.status == "paused"
    assert row.cancel_reason == ""
    assert Interrupt.objects.get(execution_id=theirs).invalid_attempts == 0
    assert ("run", "refund") not in ledger.calls
    # The tenant's own run is still steerable.
    mine = client.post(
        f"{LIST}{tenants['mine']}/resume/", {"payload": {"approved": True}}, format="json"
    )
    assert mine.status_code == 200
    assert mine.json()["status"] == "completed"


def test_another_tenants_run_is_404_even_when_not_waiting(tenants: dict[str, Any]) -> None:
    # Not 409 not_waiting, which would reveal that the run exists.
    client, theirs = tenants["acme"], tenants["theirs"]
    wrong_step = client.post(
        f"{LIST}{theirs}/resume/", {"step": "refund", "payload": {"approved": True}}, format="json"
    )
    (running,) = bare_rows(1, status="running", inputs={"order": "globex-2", "card": "x"})
    not_yet = client.post(f"{LIST}{running.pk}/resume/", {"payload": {}}, format="json")
    assert (wrong_step.status_code, not_yet.status_code) == (404, 404)
