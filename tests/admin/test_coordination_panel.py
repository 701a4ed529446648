"""The coordination panel: who holds which lock, semaphore slots, rate-limit windows, period
buckets and ordered locks, read through the configured backend, on Redis and on the database."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework import serializers

from django_reactor import Batch, Concurrency, Debounce, Reactor, Throttle, services, step
from django_reactor.coordination import Window, get_backend
from django_reactor.coordination.backends.base import CoordinationBackend
from django_reactor.models import Execution
from tests.admin.reactors import Booking
from tests.coordination.conftest import REDIS_URL, drop_redis_keys

PANEL = reverse("admin:django_reactor_execution_coordination")
REDIS = "django_reactor.coordination.backends.redis.RedisBackend"
DATABASE = "django_reactor.coordination.backends.database.DatabaseBackend"


@pytest.fixture(
    params=[
        pytest.param("redis", marks=[pytest.mark.redis, pytest.mark.django_db], id="redis"),
        pytest.param("database", marks=pytest.mark.django_db, id="database"),
    ]
)
def backend(request: pytest.FixtureRequest, settings: Any) -> Iterator[CoordinationBackend]:
    """The configured backend of the panel, each in turn (Redis: a key prefix of its own)."""
    prefix = f"reactor-panel-test-{uuid.uuid4().hex}"
    settings.REACTOR = {
        **settings.REACTOR,
        "COORDINATION_BACKEND": REDIS if request.param == "redis" else DATABASE,
        "COORDINATION_REDIS": REDIS_URL,
        "COORDINATION_KEY_PREFIX": prefix,
    }
    yield get_backend()
    if request.param == "redis":
        drop_redis_keys(prefix)


def section(html: str, name: str) -> str:
    return html.split(f'id="reactor-{name}"')[1].split('<div class="reactor-section"')[0]


def row(html: str, name: str, key: str) -> str:
    match = re.search(rf'<tr data-key="{re.escape(key)}">(.*?)</tr>', section(html, name), re.S)
    assert match, (name, key)
    return match.group(1)


def test_the_panel_shows_what_each_primitive_holds_and_who_declared_it(
    backend: CoordinationBackend, client_operator: Client
) -> None:
    run = Booking.run({"guest": "ann", "card": "4111"})
    owner = str(run.execution_id)
    grant = backend.acquire_lock("lock:account-7", owner, ttl=30)
    assert grant is not None
    backend.acquire_semaphore("semaphore:bank-api", owner, limit=4, ttl=60)
    backend.acquire_semaphore("semaphore:bank-api", "run-b", limit=4, ttl=60)
    windows = [Window(5, 1), Window(100, 60)]
    for _ in range(3):
        assert backend.check_rate("rate:payouts-7", windows).allowed
    backend.reserve_period("period:statement-7", "2026-12-03", owner, ttl=120)
    for queued in (owner, "run-b", "run-c"):
        backend.enqueue_ordered("ordered:payouts-7", queued)
    backend.enqueue_ordered("ordered:payouts-8", "run-x")
    backend.complete_ordered("ordered:payouts-8", "run-x", failed=True, strict=True)

    html = client_operator.get(PANEL).content.decode()

    backend_line = html.split('id="reactor-backend"')[1].split("</p>")[0]
    assert (REDIS if "redis" in type(backend).__module__ else DATABASE) in backend_line
    lock = row(html, "locks", "account-7")
    change = reverse("admin:django_reactor_execution_change", args=[owner])
    assert f'href="{change}"' in lock  # the run holding it, linked
    assert f"<td>{grant.fence}</td>" in lock
    assert "Payout (Meta.coordination)" in lock
    assert re.search(r"\d+(\.\d)? s", lock)  # expires in
    slots = row(html, "semaphores", "bank-api")
    assert "2 of 4" in slots
    assert 'aria-valuenow="2"' in slots
    assert "run-b" in slots
    rate = row(html, "rates", "payouts-7")
    assert "3 of 5 per second" in rate
    assert "3 of 100 per minute" in rate
    period = row(html, "periods", "statement-7")
    assert "2026-12-03" in period
    assert "reserved: a run is in flight" in period
    queue = row(html, "ordered", "payouts-7")
    assert f'href="{change}"' in queue  # its turn
    assert "run-b, run-c" in queue
    assert "<td>3</td>" in queue
    halted = row(html, "ordered", "payouts-8")
    assert "after run-x failed" in halted
    assert 'id="reactor-refresh"' in html


def test_an_idle_backend_says_so_for_each_kind(
    backend: CoordinationBackend, client_operator: Client
) -> None:
    html = client_operator.get(PANEL).content.decode()
    assert "No lock is held." in html
    assert "No semaphore slot is taken." in html
    assert "No rate limit was charged in the last hour" in html
    assert "No period bucket is reserved or claimed." in html
    assert "No ordered lock has runs queued or is halted." in html


@pytest.mark.django_db
def test_an_unreachable_or_unknown_backend_is_named_not_raised(
    client_operator: Client, settings: Any
) -> None:
    settings.REACTOR = {
        **settings.REACTOR,
        "COORDINATION_BACKEND": REDIS,
        "COORDINATION_REDIS": "redis://127.0.0.1:1/0",
    }
    html = client_operator.get(PANEL).content.decode()
    assert "The coordination backend cannot be read: Redis is unreachable" in html
    settings.REACTOR = {**settings.REACTOR, "COORDINATION_BACKEND": "nowhere.Backend"}
    html = client_operator.get(PANEL).content.decode()
    assert "The coordination backend cannot be read:" in html
    assert "nowhere.Backend" in html


class TenantSync(Reactor):
    class Inputs(serializers.Serializer):
        tenant_id = serializers.CharField()

    only = step()(lambda: "synced")

    class Meta:
        background = "all"
        concurrency = Concurrency(key="{tenant_id}", limit=1)


@pytest.mark.django_db
def test_the_panel_lists_concurrency_keys_and_a_queued_run_says_what_it_waits_for(
    client_operator: Client,
) -> None:
    for _ in range(3):
        services.run_in_background(TenantSync, {"tenant_id": "acme"})
    queued = services.run_in_background(TenantSync, {"tenant_id": "zeta"})
    assert queued.status == "pending"
    html = client_operator.get(PANEL).content.decode()
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row(html, "concurrency-keys", "acme"), re.S)
    assert [re.sub(r"<[^>]+>", "", c).strip() for c in cells] == [
        "tests.admin.test_coordination_panel.TenantSync",
        "acme",
        "1 / 1",
        "2",
        "queue",
    ]
    last = Execution.objects.filter(concurrency_key="acme").order_by("created_at").last()
    assert last is not None
    page = client_operator.get(
        reverse("admin:django_reactor_execution_change", args=[last.pk])
    ).content.decode()
    assert (
        "acme (waiting for its concurrency key &#x27;acme&#x27;: 1 of 1 run(s) in flight, 1 "
        "queued ahead of it; it starts when one of them ends)"
    ) in page


class ThrottledExport(Reactor):
    class Inputs(serializers.Serializer):
        tenant_id = serializers.CharField()

    only = step()(lambda: "exported")

    class Meta:
        background = "all"
        throttle = Throttle(key="{tenant_id}", limit=1, period=60)


class DebouncedSync(Reactor):
    class Inputs(serializers.Serializer):
        tenant_id = serializers.CharField()

    only = step()(lambda: "synced")

    class Meta:
        debounce = Debounce(key="{tenant_id}", period=30)


class BatchedImport(Reactor):
    class Inputs(serializers.Serializer):
        tenant_id = serializers.CharField()

    only = step()(lambda: "imported")

    class Meta:
        batch = Batch(key="{tenant_id}", max_size=2, max_wait=60)


@pytest.mark.django_db
def test_the_panel_lists_throttled_debounced_and_batched_keys_with_runs_waiting(
    client_operator: Client,
) -> None:
    for _ in range(3):
        services.run_in_background(ThrottledExport, {"tenant_id": "acme"})
    for _ in range(4):
        services.run_in_background(DebouncedSync, {"tenant_id": "beta"})
    for _ in range(3):
        services.run_in_background(BatchedImport, {"tenant_id": "gamma"})
    html = client_operator.get(PANEL).content.decode()
    section_html = section(html, "delayed-keys")
    rows = re.findall(r'<tr data-key="([^"]+)" data-kind="([^"]+)">(.*?)</tr>', section_html, re.S)
    waiting = {
        (key, kind): re.search(r'data-figure="waiting">(\d+)<', cells).group(1)  # type: ignore[union-attr]
        for key, kind, cells in rows
    }
    # The throttle's first start went at once; the next two wait. The debounce's four starts
    # are one run, waiting; the batch's three starts are two runs (the first full).
    assert waiting == {
        ("acme", "throttle"): "2",
        ("beta", "debounce"): "1",
        ("gamma", "batch"): "2",
    }
