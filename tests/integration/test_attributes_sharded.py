"""Business attributes in a fleet sharded by reactor (``REACTOR["DATABASE"]``): a run's attributes
live in its database, where the API, the admin and reactor_list find the run by them."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from django_reactor import services
from django_reactor.models import ExecutionAttribute
from tests.integration.attribute_reactors import ROUTED, Order, RoutedOrder

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "shard"]),
]


@pytest.fixture(autouse=True)
def routed(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "DATABASE": ROUTED}


def test_a_routed_runs_attributes_live_in_its_database_and_find_it_there(client: Client) -> None:
    routed = str(RoutedOrder.run({"customer_id": 42}).execution_id)
    home = str(Order.run({"customer_id": 42}).execution_id)

    keys = ExecutionAttribute.objects.using("shard").filter(execution_id=routed)
    assert dict(keys.values_list("key", "value")) == {
        "customer_id": "42",
        "attempt": "1",
        "payment_id": "pay-1",
    }
    assert not ExecutionAttribute.objects.using("default").filter(execution_id=routed).exists()
    assert services.find(routed).attributes["payment_id"] == "pay-1"

    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    api = client.get("/reactor/executions/?database=shard&attr.customer_id=42")
    assert [run["id"] for run in api.json()["results"]] == [routed]
    api = client.get("/reactor/executions/?attr.customer_id=42")
    assert [run["id"] for run in api.json()["results"]] == [home]
    assert client.get(f"/reactor/executions/{routed}/").json()["attributes"]["customer_id"] == "42"
    admin = client.get("/admin/django_reactor/execution/?database=shard&attr=customer_id%3D42")
    assert routed[:8] in admin.content.decode()
    assert home[:8] not in admin.content.decode()

    out = StringIO()
    call_command("reactor_list", "--database", "shard", "--attr", "customer_id=42", "--json",
                 stdout=out)  # fmt: skip
    assert [run["id"] for run in json.loads(out.getvalue())] == [routed]
