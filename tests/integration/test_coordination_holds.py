"""Coordination that must hold where it used to leak: an async step's own lock, an undo under
its step's lock, and a lock ``wait=`` that covers an unreachable backend too."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings
from rest_framework import serializers

from django_reactor import Completed, Failed, Lock, Reactor, Step, arg, async_step, services, step
from django_reactor.coordination import get_backend
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import FAIL_AT, ledger
from tests.private_redis import PrivateRedis
from tests.workers.harness import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class Orders(serializers.Serializer):
    order_id = serializers.IntegerField()


class LockedCharge(Step):
    """Takes the order's lock around its own body."""

    coordination = [Lock("order-{order_id}", ttl=30)]

    def run(self, order_id: int) -> str:
        ledger("run", "charge")
        return "charged"

    def undo(self, result: Any, order_id: int) -> None:
        ledger("undo", "charge")


class DiesInItsStep(LockedCharge):
    """Its process dies (``SystemExit``) inside the locked body while ``"die"`` is in FAIL_AT."""

    def run(self, order_id: int) -> str:
        ledger("run", "charge")
        if "die" in FAIL_AT:
            FAIL_AT.discard("die")
            raise SystemExit("the worker was stopped")
        return "charged"


class ChargesAsync(Reactor):
    """Holds the order's lock for the whole run and hands a step that needs it to a worker."""

    Inputs = Orders
    charge = async_step(LockedCharge, order_id=arg.input("order_id"))

    class Meta:
        coordination = [Lock("order-{order_id}", ttl=30)]


def test_an_async_step_needing_a_lock_its_run_holds_is_not_dispatched(backend: Any) -> None:
    outcome = ChargesAsync.run({"order_id": 11})
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.step == "charge"
    assert outcome.error.kind == "coordination"
    assert "it needs lock 'order-11', which this run holds" in outcome.error.message
    assert not Execution.objects.filter(parent_id=outcome.execution_id).exists()
    assert ledger.calls == []


class Books(Reactor):
    Inputs = Orders
    charge = step(LockedCharge, order_id=arg.input("order_id"))

    @step(wait_for=["charge"])
    def notify() -> None:
        if "notify" in FAIL_AT:
            raise RuntimeError("mailer down")


@pytest.fixture
def short_rollback_wait() -> Iterator[None]:
    with override_settings(REACTOR={**settings.REACTOR, "ROLLBACK_WAIT": 0.3}):
        yield


def test_an_undo_never_runs_while_another_owner_holds_its_steps_lock(
    backend: Any, short_rollback_wait: Any
) -> None:
    outcome = Books.run({"order_id": 12})
    assert isinstance(outcome, Completed)
    assert backend.acquire_lock("lock:order-12", "run:someone-else", 30) is not None
    handle = services.undo(outcome.execution_id)
    assert handle.status == ExecutionStatus.NEEDS_ATTENTION
    assert ("undo", "charge") not in ledger.calls
    (failure,) = Execution.objects.get(pk=outcome.execution_id).failure["rollback_failures"]
    assert failure["kind"] == "coordination_unavailable"
    assert "lock 'order-12' is held by execution someone-else" in failure["message"]
    # Once the other owner lets go, undoing again runs the undo, once.
    backend.release_lock("lock:order-12", "run:someone-else")
    assert services.undo(outcome.execution_id).status == ExecutionStatus.CANCELLED
    assert ledger.calls.count(("undo", "charge")) == 1
    assert backend.lock_holder("lock:order-12") is None


def test_an_undo_waits_for_its_steps_lock_and_then_runs(backend: Any) -> None:
    outcome = Books.run({"order_id": 13})
    assert backend.acquire_lock("lock:order-13", "run:someone-else", 30) is not None

    def let_go_once_undo_started() -> None:
        wait_until(
            lambda: Execution.objects.filter(
                pk=outcome.execution_id, status=ExecutionStatus.ROLLING_BACK
            ).exists(),
            timeout=20,
            what="the undo to start",
        )
        backend.release_lock("lock:order-13", "run:someone-else")
        connections.close_all()  # this thread's own connections

    releaser = threading.Thread(target=let_go_once_undo_started)
    releaser.start()
    try:
        handle = services.undo(outcome.execution_id)
    finally:
        releaser.join(timeout=30)
    assert handle.status == ExecutionStatus.CANCELLED
    assert ledger.calls == [("run", "charge"), ("undo", "charge")]


class WaitsForItsLock(Reactor):
    """Waits up to ``wait`` seconds for the order's lock (the test sets the wait)."""

    Inputs = Orders

    @step(order_id=arg.input("order_id"))
    def charge(order_id: int) -> str:
        ledger("run", "charge")
        return "charged"

    class Meta:
        coordination = [Lock("order-{order_id}", ttl=30, wait=15)]


def waiting(seconds: float) -> type[Reactor]:
    """``WaitsForItsLock`` waiting ``seconds`` for its lock."""

    class Waits(WaitsForItsLock):
        class Meta:
            coordination = [Lock("order-{order_id}", ttl=30, wait=seconds)]

    return Waits


def private_coordination(server: PrivateRedis) -> dict[str, Any]:
    """The suite's settings with coordination on ``server`` (keys die with it)."""
    return {
        **settings.REACTOR,
        "COORDINATION_BACKEND": "django_reactor.coordination.backends.redis.RedisBackend",
        "COORDINATION_REDIS": server.url,
        "COORDINATION_KEY_PREFIX": f"reactor-outage-{uuid.uuid4().hex}",
    }


@pytest.mark.redis
def test_a_lock_wait_covers_a_coordination_redis_that_is_briefly_down(tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path).start()
    restarted = threading.Event()
    try:
        with override_settings(REACTOR=private_coordination(server)):
            get_backend().server_time()  # connected once, then the server goes away
            server.kill()
            timer = threading.Timer(1.5, lambda: (server.start(), restarted.set()))
            timer.start()
            try:
                outcome = waiting(15).run({"order_id": 14})
            finally:
                timer.join(timeout=30)
            assert restarted.is_set()
            assert isinstance(outcome, Completed), outcome
            assert ledger.calls == [("run", "charge")]
            assert get_backend().lock_holder("lock:order-14") is None
    finally:
        server.kill()  # its keys go with it: it keeps nothing on disk


@pytest.mark.redis
def test_a_lock_wait_gives_up_on_a_backend_that_stays_down(tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path)  # never started
    with override_settings(REACTOR=private_coordination(server)):
        outcome = waiting(0.5).run({"order_id": 15})
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.kind == "coordination_unavailable"
    assert ledger.calls == []


class ChargesInTheBackground(Reactor):
    Inputs = Orders
    charge = step(DiesInItsStep, order_id=arg.input("order_id"))

    class Meta:
        background = "all"


def test_a_step_lock_taken_again_after_its_process_died_is_given_back(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_reactor.coordination.coordinator import StepHoldings

    outcome = ChargesInTheBackground.run({"order_id": 16})
    # The first worker dies inside the step: no cleanup runs, its lock stays taken.
    monkeypatch.setattr(StepHoldings, "release", lambda self, succeeded=True: None)
    FAIL_AT.add("die")
    with pytest.raises(SystemExit):
        services.resume(outcome.execution_id)
    monkeypatch.undo()
    assert backend.lock_holder("lock:order-16") == f"run:{outcome.execution_id}"
    # The next worker takes the run (the lease ended at the hand-back) and the lock again.
    assert services.resume(outcome.execution_id).ok
    assert ledger.calls == [("run", "charge"), ("run", "charge")]
    assert backend.lock_holder("lock:order-16") is None
