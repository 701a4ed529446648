"""The admin's run page lists the run's messages: unread, consumed, refused (secrets masked)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework import serializers

import django_reactor
from django_reactor import Reactor, receive, services, step
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)


class Card(serializers.Serializer):
    number = serializers.CharField(write_only=True)
    amount = serializers.IntegerField(min_value=1)


class AdminPayment(Reactor):
    order = step(Tracked)
    paid = receive("payment", after="order", serializer=Card)
    again = receive("payment", after="paid", serializer=Card)


def test_the_run_page_lists_its_messages_with_secrets_masked(client_operator: Client) -> None:
    run_id = AdminPayment.run({}).execution_id
    django_reactor.send(run_id, "payment", {"number": "4111", "amount": 0})
    django_reactor.send(run_id, "payment", {"number": "4242", "amount": 5})
    services.cancel(run_id)
    url = reverse("admin:django_reactor_execution_change", args=[str(run_id)])

    html = client_operator.get(url).content.decode()

    section = html[html.index('id="reactor-messages"') :]
    section = section[: section.index("</table>")]
    assert section.count('class="reactor-message-invalid"') == 1
    assert section.count('class="reactor-message-consumed"') == 1
    assert "amount" in section  # the refusal's field errors
    assert "4111" not in html
    assert "4242" not in html
    assert "[REDACTED]" in section
