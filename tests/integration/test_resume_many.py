"""services.resume_many (the body of the sweeper's batched wake-ups): runs claimed ahead in one
round trip, their leases kept while they wait their turn."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_reactor import Reactor, Step, services, step, store
from django_reactor.models import Execution
from django_reactor.services import workers
from django_reactor.states import EventKind, ExecutionStatus
from tests.integration.reactors import Tracked, ledger

pytestmark = pytest.mark.django_db(transaction=True)

ON_POSTGRESQL = connection.vendor == "postgresql"


class Woken(Reactor):
    one = step(Tracked)

    class Meta:
        background = "all"


def _kinds(execution_id: uuid.UUID) -> list[str]:
    return [entry.kind for entry in services.find(execution_id).trace]


@pytest.fixture
def claims_alone(monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    """The runs claimed one at a time (``store.claim_for_worker``), in order."""
    alone: list[uuid.UUID] = []
    claim = store.claim_for_worker

    def counted(execution_id: uuid.UUID, owner: str) -> Any:
        alone.append(execution_id)
        return claim(execution_id, owner)

    monkeypatch.setattr(store, "claim_for_worker", counted)
    return alone


def test_a_batch_is_claimed_ahead_and_each_run_resumed_once(
    claims_alone: list[uuid.UUID],
) -> None:
    ids = [Woken.run({}).execution_id for _ in range(workers.CLAIM_AHEAD + 3)]
    services.resume_many([str(execution_id) for execution_id in ids])
    rows = Execution.objects.in_bulk(ids)
    assert {rows[i].status for i in ids} == {ExecutionStatus.COMPLETED}
    assert {rows[i].recovery_attempts for i in ids} == {0}
    assert {rows[i].lease_owner for i in ids} == {None}
    assert ledger.calls == [("run", "one")] * len(ids)
    for execution_id in ids:
        assert _kinds(execution_id) == [EventKind.START, EventKind.RESUME, "run", "complete"]
    # On PostgreSQL two statements claimed them all; elsewhere each run's turn claims it.
    assert claims_alone == ([] if ON_POSTGRESQL else ids)
    # A second delivery of the same message runs nothing again.
    services.resume_many(ids)
    assert ledger.calls == [("run", "one")] * len(ids)


def test_runs_not_claimable_are_left_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="django_reactor")
    owned, finished, fresh = (Woken.run({}).execution_id for _ in range(3))
    Execution.objects.filter(pk=owned).update(
        status=ExecutionStatus.RUNNING,
        lease_owner="elsewhere:1:live",
        lease_expires_at=timezone.now() + dt.timedelta(minutes=5),
    )
    services.resume(finished)
    ledger.calls.clear()
    missing = uuid.uuid4()
    services.resume_many([str(owned), str(finished), "not-a-uuid", str(missing), str(fresh)])
    assert ledger.calls == [("run", "one")]  # the fresh run only
    assert Execution.objects.get(pk=owned).lease_owner == "elsewhere:1:live"
    assert Execution.objects.get(pk=fresh).status == ExecutionStatus.COMPLETED
    assert "'not-a-uuid', which is not an execution id" in caplog.text
    assert f"unknown execution {missing}" in caplog.text


def test_a_run_that_raises_is_logged_and_the_batch_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = (Woken.run({}).execution_id for _ in range(2))
    resume_here = workers._resume_here

    def broken(execution_id: uuid.UUID, **options: Any) -> Any:
        if execution_id == first:
            raise RuntimeError("the engine broke")
        return resume_here(execution_id, **options)

    monkeypatch.setattr(workers, "_resume_here", broken)
    services.resume_many([first, second])
    assert "resuming execution" in caplog.text
    assert "the engine broke" in caplog.text
    assert Execution.objects.get(pk=second).status == ExecutionStatus.COMPLETED


@pytest.mark.skipif(not ON_POSTGRESQL, reason="only PostgreSQL claims ahead")
def test_held_leases_are_extended_and_a_run_taken_over_is_let_go() -> None:
    kept, taken = (Woken.run({}).execution_id for _ in range(2))
    claims = store.claim_ahead([kept, taken], "worker:1:batch")
    assert set(claims) == {kept, taken}
    before = Execution.objects.get(pk=kept).lease_expires_at
    held = store.HeldLeases(claim.owned for claim in claims.values())
    # Another process took one over (its fence moved on).
    Execution.objects.filter(pk=taken).update(fence=claims[taken].owned.fence + 1)
    assert held.extend() is True
    assert Execution.objects.get(pk=kept).lease_expires_at > before
    assert held.take(taken) is None
    assert held.take(kept) == claims[kept].owned
    assert held.take(kept) is None  # its turn took it: no longer held


class WaitsForTheLease(Step):
    """Holds its run until the runs waiting behind it have outlived the lease they were
    claimed with, then checks that nobody else can take them."""

    behind: list[uuid.UUID] = []
    checked = threading.Event()
    refused: list[Any] = []

    def run(self) -> str:
        claimed_until = {
            pk: at
            for pk, at in Execution.objects.filter(pk__in=self.behind).values_list(
                "pk", "lease_expires_at"
            )
        }
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if timezone.now() > max(claimed_until.values()) + dt.timedelta(seconds=0.5):
                break
            threading.Event().wait(0.05)  # bounded: the condition is the clock passing
        self.refused.extend(store.claim_for_worker(pk, "intruder:2:late") for pk in self.behind)
        self.checked.set()
        return "done"


class Slow(Reactor):
    hold = step(WaitsForTheLease)

    class Meta:
        background = "all"


@pytest.fixture
def short_lease() -> Iterator[None]:
    with override_settings(REACTOR={**settings.REACTOR, "LEASE_SECONDS": 1.5}):
        yield


@pytest.mark.skipif(not ON_POSTGRESQL, reason="only PostgreSQL claims ahead")
@pytest.mark.usefixtures("short_lease")
def test_runs_waiting_their_turn_keep_their_leases_past_the_first() -> None:
    slow = Slow.run({}).execution_id
    behind = [Woken.run({}).execution_id for _ in range(2)]
    WaitsForTheLease.behind = behind
    WaitsForTheLease.refused.clear()
    WaitsForTheLease.checked.clear()
    services.resume_many([slow, *behind])
    assert WaitsForTheLease.checked.is_set()
    assert WaitsForTheLease.refused == [None, None]  # still this worker's: nobody took them
    rows = Execution.objects.in_bulk([slow, *behind])
    assert {row.status for row in rows.values()} == {ExecutionStatus.COMPLETED}
    assert {row.recovery_attempts for row in rows.values()} == {0}
    assert ledger.calls == [("run", "one"), ("run", "one")]
