"""Bulk operations from the admin: the whole filtered list, a preview, the progress page."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_reactor import services
from django_reactor.models import BulkOperation, Execution
from django_reactor.states import ExecutionStatus
from tests.admin.reactors import TRIGGERS, Booking
from tests.admin.test_actions import CHANGELIST, texts

pytestmark = pytest.mark.django_db(transaction=True)

NEW = reverse("admin:django_reactor_bulkoperation_new")


def failed_bookings(count: int) -> list[Any]:
    TRIGGERS.add("charge")
    ids = [Booking.run({"guest": f"g{i}", "card": "4111"}).execution_id for i in range(count)]
    TRIGGERS.discard("charge")
    return ids


def test_the_list_links_to_a_bulk_operation_on_its_filters(client_operator: Client) -> None:
    failed = failed_bookings(3)
    Booking.run({"guest": "ok", "card": "4111"})
    listed = client_operator.get(CHANGELIST, {"status__exact": "failed"}).content.decode()
    assert f"{NEW}?status__exact=failed" in listed

    page = client_operator.get(NEW, {"status__exact": "failed"}).content.decode()
    assert 'id="reactor-bulk-filter"' in page
    preview = client_operator.get(
        NEW, {"filter": json.dumps({"status": "failed"}), "action": "retry"}
    ).content.decode()
    assert 'id="reactor-bulk-preview"' in preview
    assert "Yes, retry 3 runs" in preview
    assert not BulkOperation.objects.exists()  # a preview writes nothing

    response = client_operator.post(
        NEW,
        {"filter": json.dumps({"status": "failed"}), "action": "retry", "post": "yes"},
    )
    operation = BulkOperation.objects.get()
    assert response["Location"] == reverse(
        "admin:django_reactor_bulkoperation_change", args=[operation.pk]
    )
    assert texts(response) == ["Started: retry of 3 run(s) on a worker."]
    assert operation.created_by.startswith("operator (user ")
    services.run_bulk(operation.pk)  # what the worker does
    page = client_operator.get(response["Location"]).content.decode()
    assert "3 runs: 3 done, 0 skipped, 0 failed, 0 left" in page
    assert Execution.objects.filter(retry_of__in=failed).count() == 3


def test_an_unfiltered_or_searched_list_is_refused(client_operator: Client) -> None:
    page = client_operator.get(NEW).content.decode()
    assert "never takes every run" in page
    page = client_operator.get(NEW, {"q": "some-key"}).content.decode()
    assert "clear the search box" in page


def test_a_running_operation_can_be_stopped(client_operator: Client) -> None:
    failed_bookings(2)
    progress = services.start_bulk(
        "cancel",
        services.RunFilter.parse({"status": "failed"}),
        background=False,
    )
    page = client_operator.get(
        reverse("admin:django_reactor_bulkoperation_change", args=[progress.id])
    ).content.decode()
    assert "Stop" in page
    response = client_operator.post(
        reverse("admin:django_reactor_bulkoperation_stop", args=[progress.id])
    )
    assert response.status_code == 302
    assert BulkOperation.objects.get().status == "stopped"
    assert set(Execution.objects.values_list("status", flat=True)) == {ExecutionStatus.FAILED}


def test_a_viewer_sees_operations_but_cannot_start_or_stop_them(client_viewer: Client) -> None:
    failed_bookings(1)
    page = client_viewer.get(NEW, {"filter": json.dumps({"status": "failed"})}).content.decode()
    assert '<option value="retry"' not in page
    assert (
        client_viewer.get(
            NEW, {"filter": json.dumps({"status": "failed"}), "action": "retry"}
        ).status_code
        == 403
    )
    assert not BulkOperation.objects.exists()
