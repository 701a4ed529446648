"""Pausing from the admin: a run's Pause and Unpause buttons, a reactor's pause page, the
banner every console page shows while a reactor is paused."""

from __future__ import annotations

import pytest
from django.test import Client

from django_reactor import services
from django_reactor.models import Pause
from django_reactor.states import ExecutionStatus
from tests.admin.reactors import Booking, Refund
from tests.admin.test_actions import CHANGELIST, log_messages, status, texts, url

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_is_paused_and_unpaused_from_its_page(client_operator: Client) -> None:
    run = Refund.run({"order": "P1"}).execution_id
    page = client_operator.get(url("change", run)).content.decode()
    assert url("pause", run) in page
    assert url("unpause", run) not in page

    response = client_operator.post(url("pause", run), {"reason": "check the order"})
    assert response.status_code == 302
    assert texts(response) == ["Pause requested: it stops at its next step boundary"]
    assert Pause.objects.get().reason == "check the order"
    page = client_operator.get(url("change", run)).content.decode()
    assert 'id="reactor-run-paused"' in page
    assert "A pause is requested: the run stops at its next step boundary: check the order" in page
    assert url("unpause", run) in page
    assert url("pause", run) not in page

    response = client_operator.post(url("unpause", run))
    assert texts(response) == ["Unpaused: paused"]  # it still waits at its interrupt
    assert not Pause.objects.exists()
    assert log_messages(run) == [
        "Pause requested: it stops at its next step boundary",
        "Unpaused: paused",
    ]


def test_a_viewer_cannot_pause(client_viewer: Client) -> None:
    run = Refund.run({"order": "P2"}).execution_id
    assert client_viewer.post(url("pause", run)).status_code == 403
    assert client_viewer.post(url("unpause", run)).status_code == 403
    name = Refund.definition.name
    assert client_viewer.get(url("pause_reactor", name)).status_code == 403
    assert client_viewer.post(url("unpause_reactor", name)).status_code == 403
    assert not Pause.objects.exists()
    assert url("pause", run) not in client_viewer.get(url("change", run)).content.decode()


def test_a_reactor_is_paused_from_the_overview_and_the_banner_unpauses_it(
    client_operator: Client,
) -> None:
    name = Booking.definition.name
    Booking.run({"guest": "ann", "card": "4111"})
    overview = client_operator.get(url("overview")).content.decode()
    assert url("pause_reactor", name) in overview
    assert 'id="reactor-paused"' not in overview

    page = client_operator.get(url("pause_reactor", name))
    assert page.status_code == 200
    assert "stops every run of it at its next step boundary" in page.content.decode()
    response = client_operator.post(url("pause_reactor", name), {"reason": "card gateway down"})
    assert response.status_code == 302
    assert texts(response) == [
        "Booking is paused: its runs stop at their next step, new ones wait."
    ]
    suspended = Booking.run({"guest": "bob", "card": "4111"}).execution_id
    assert status(suspended) == ExecutionStatus.SUSPENDED

    for page_url in (url("overview"), CHANGELIST, url("change", suspended)):
        page = client_operator.get(page_url).content.decode()
        assert 'id="reactor-paused"' in page, page_url
        assert "Booking is paused" in page
        assert "card gateway down" in page
        assert "1 run suspended" in page
        assert url("unpause_reactor", name) in page

    response = client_operator.post(url("unpause_reactor", name), {"next": CHANGELIST})
    assert response.status_code == 302
    assert response["Location"] == CHANGELIST
    assert texts(response) == ["Booking is unpaused; 1 suspended run(s) released, oldest first."]
    assert status(suspended) == ExecutionStatus.PENDING
    assert services.paused_reactors() == []


def test_the_unpause_redirect_stays_on_the_site(client_operator: Client) -> None:
    services.pause_reactor(Booking)
    response = client_operator.post(
        url("unpause_reactor", Booking.definition.name), {"next": "https://evil.example/"}
    )
    assert response["Location"] == url("overview")


def test_pausing_an_unknown_reactor_says_so(client_operator: Client) -> None:
    response = client_operator.get(url("pause_reactor", "NoSuch"))
    assert response.status_code == 302
    assert "NoSuch" in texts(response)[0]
