"""Bulk operations over the API: preview, start, progress, stop, permissions, scope."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from django_reactor import services
from django_reactor.models import BulkOperation, Execution
from tests.api.conftest import ALL_PERMISSIONS, client_for, user_with
from tests.integration.test_bulk import failed_orders

pytestmark = pytest.mark.django_db

BULK = "/reactor/bulk/"
FILTER = {"reactor": "tests.bulk.Order", "status": ["failed"]}


def test_a_dry_run_answers_the_preview_and_writes_nothing(operator: APIClient) -> None:
    failed_orders(2)
    response = operator.post(
        BULK, {"action": "retry", "filter": FILTER, "dry_run": True}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["count"], body["by_status"], len(body["sample"])) == (2, {"failed": 2}, 2)
    assert not BulkOperation.objects.exists()


def test_an_operation_is_started_read_and_stopped(operator: APIClient) -> None:
    failed = failed_orders(3)
    response = operator.post(
        BULK, {"action": "retry", "filter": FILTER, "reason": "fixed"}, format="json"
    )
    assert response.status_code == 202, response.content
    started: dict[str, Any] = response.json()
    assert (started["status"], started["total"]) == ("pending", 3)
    assert started["created_by"].startswith("user-view_execution-")
    assert response["Location"] == started["url"]
    services.run_bulk(started["id"])  # what the worker does
    progress = operator.get(f"{BULK}{started['id']}/").json()
    assert (progress["status"], progress["done"], progress["left"]) == ("done", 3, 0)
    assert Execution.objects.filter(retry_of__in=failed).count() == 3
    stopped = operator.post(f"{BULK}{started['id']}/stop/")
    assert stopped.status_code == 200
    assert stopped.json()["status"] == "done"  # it had finished


def test_bad_requests_are_400_and_write_nothing(operator: APIClient) -> None:
    for body, code in (
        ({"action": "retry", "filter": {}}, "invalid_filter"),
        ({"action": "retry", "filter": {"colour": "red"}}, "invalid_filter"),
        ({"action": "fork", "filter": FILTER}, "invalid_filter"),
        ({"action": "explode", "filter": FILTER}, "invalid"),
        ({"filter": FILTER}, "invalid"),
    ):
        response = operator.post(BULK, body, format="json")
        assert response.status_code == 400, body
        assert response.json()["code"] == code, response.json()
    assert operator.post(BULK, [1], format="json").status_code == 400
    assert operator.get(f"{BULK}nope/").status_code == 404
    assert not BulkOperation.objects.exists()


def test_each_action_needs_its_own_permission() -> None:
    failed_orders(1)
    client = client_for(user_with(*[p for p in ALL_PERMISSIONS if p != "retry_execution"]))
    response = client.post(BULK, {"action": "retry", "filter": FILTER}, format="json")
    assert response.status_code == 403
    assert "django_reactor.retry_execution" in response.json()["detail"]
    assert APIClient().post(BULK, {}, format="json").status_code == 401
    assert not BulkOperation.objects.exists()


def test_api_scope_narrows_the_runs_a_filter_reaches(settings: Any) -> None:
    from tests.api.conftest import TENANT_SCOPE, make_user

    failed_orders(2)
    settings.REACTOR = {**settings.REACTOR, "API_SCOPE": TENANT_SCOPE}
    client = client_for(make_user("acme-op", *ALL_PERMISSIONS, tenant="acme"))
    response = client.post(
        BULK, {"action": "retry", "filter": FILTER, "dry_run": True}, format="json"
    )
    assert response.json()["count"] == 0  # none of acme's
