"""The admin's read-only list of events."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

import django_reactor
from django_reactor.models import Event
from tests.integration.test_events import AwaitRefund  # noqa: F401 - registers the waits

pytestmark = pytest.mark.django_db


def test_the_events_list_shows_each_event_and_finds_one_by_its_id_or_key(
    admin_client: Client,
) -> None:
    django_reactor.emit("charge.refunded", {"amount": 5}, key="A1", event_id="re_42")
    django_reactor.emit("charge.refunded", {"amount": 6}, key="B2", event_id="re_43")
    url = reverse("admin:django_reactor_event_changelist")

    page = admin_client.get(url)
    assert page.status_code == 200
    assert b"re_42" in page.content
    assert b"re_43" in page.content

    found = admin_client.get(url, {"q": "B2"})
    assert b"re_43" in found.content
    assert b"re_42" not in found.content
    unhandled = admin_client.get(url, {"handled": "no"})
    assert b"re_42" not in unhandled.content

    detail = admin_client.get(
        reverse("admin:django_reactor_event_change", args=[Event.objects.get(event_id="re_42").pk])
    )
    assert detail.status_code == 200
    assert b"&quot;amount&quot;: 5" in detail.content or b'"amount": 5' in detail.content
