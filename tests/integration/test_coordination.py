"""Coordination declared on reactors and steps, held by real runs on both backends."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import (
    Completed,
    Failed,
    Halted,
    Lock,
    OrderedLock,
    Period,
    RateLimit,
    Reactor,
    Semaphore,
    Step,
    arg,
    services,
    step,
    step_context,
)
from django_reactor.exceptions import DefinitionError
from tests.integration.reactors import FAIL_AT, ledger

pytestmark = pytest.mark.django_db(transaction=True)


class Orders(serializers.Serializer):
    order_id = serializers.IntegerField()


class LockedOrder(Reactor):
    Inputs = Orders

    @step(order_id=arg.input("order_id"))
    def charge(order_id: int) -> Any:
        ledger("run", f"charge-{order_id}")
        if "charge" in FAIL_AT:
            raise RuntimeError("declined")
        return dict(step_context().fences)

    @charge.undo
    def refund(result: Any, order_id: int) -> None:
        ledger("undo", f"charge-{order_id}")

    class Meta:
        coordination = [Lock("order-{order_id}", ttl=30)]
        returns = "charge"


def kinds(execution_id: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(e.kind, e.data) for e in services.find(execution_id).trace]


def test_a_run_holds_its_lock_while_it_runs_and_gives_it_back(backend: Any) -> None:
    outcome = LockedOrder.run({"order_id": 1})
    assert isinstance(outcome, Completed), outcome
    fence = outcome.value["order-1"]
    assert fence >= 1
    assert ("acquire", {"lock": "order-1", "fence": fence}) in kinds(outcome.execution_id)
    assert backend.lock_holder("lock:order-1") is None
    again = LockedOrder.run({"order_id": 1})
    assert again.value["order-1"] > fence  # every grant gets a larger fence


def test_an_inline_run_that_cannot_take_its_lock_fails_with_a_contention_error(
    backend: Any,
) -> None:
    assert backend.acquire_lock("lock:order-2", "run:someone-else", 30) is not None
    outcome = LockedOrder.run({"order_id": 2})
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.kind == "contention"
    assert outcome.error.retryable is True
    assert "lock 'order-2' is held by execution someone-else" in outcome.error.message
    assert ledger.calls == []  # no step ran


def test_a_failed_run_keeps_its_lock_through_rollback_then_releases_it(backend: Any) -> None:
    FAIL_AT.add("charge")
    outcome = LockedOrder.run({"order_id": 3})
    assert isinstance(outcome, Failed)
    assert backend.lock_holder("lock:order-3") is None


def test_a_key_that_cannot_be_computed_fails_before_anything_is_acquired(backend: Any) -> None:
    class BadKey(Reactor):
        Inputs = Orders

        @step(order_id=arg.input("order_id"))
        def noop(order_id: int) -> None:
            ledger("run", "noop")

        class Meta:
            coordination = [Lock("order-{customer}")]

    outcome = BadKey.run({"order_id": 1})
    assert isinstance(outcome, Failed)
    assert outcome.error.kind == "coordination"
    assert "{customer}" in outcome.error.message
    assert ledger.calls == []


class Limited(Reactor):
    Inputs = Orders

    @step(order_id=arg.input("order_id"))
    def call(order_id: int) -> int:
        ledger("run", f"call-{order_id}")
        return order_id

    class Meta:
        coordination = [RateLimit(name="partner")]


def test_a_named_rate_limit_is_shared_and_a_denied_run_holds_nothing(backend: Any) -> None:
    assert isinstance(Limited.run({"order_id": 1}), Completed)
    assert isinstance(Limited.run({"order_id": 2}), Completed)
    denied = Limited.run({"order_id": 3})
    assert isinstance(denied, Failed)
    assert denied.error.kind == "contention"
    assert "rate limit 'partner' reached" in denied.error.message
    assert [c for c in ledger.calls] == [("run", "call-1"), ("run", "call-2")]


def test_an_unknown_named_rate_limit_fails_the_run_permanently(backend: Any) -> None:
    class Unknown(Reactor):
        @step()
        def noop() -> None:
            return None

        class Meta:
            coordination = [RateLimit(name="nobody")]

    outcome = Unknown.run({})
    assert isinstance(outcome, Failed)
    assert outcome.error.retryable is False
    assert "nobody" in outcome.error.message


class Daily(Reactor):
    Inputs = Orders

    @step(order_id=arg.input("order_id"))
    def report(order_id: int) -> int:
        ledger("run", "report")
        if "report" in FAIL_AT:
            raise RuntimeError("no data yet")
        return order_id

    class Meta:
        coordination = [Period("report-{order_id}", every="day")]


def test_a_period_lets_one_successful_run_per_bucket(backend: Any) -> None:
    FAIL_AT.add("report")
    failed = Daily.run({"order_id": 5})
    assert isinstance(failed, Failed)  # a failure does not claim the day
    FAIL_AT.clear()
    first = Daily.run({"order_id": 5})
    assert isinstance(first, Completed)
    second = Daily.run({"order_id": 5})
    assert isinstance(second, Halted), second
    assert f"was already claimed by execution {first.execution_id}" in second.reason


class Throttled(Step):
    coordination = [Semaphore("partner-{account}", limit=1, wait=0)]

    def run(self, account: str) -> str:
        ledger("run", f"call-{account}")
        return account


class UsesPartner(Reactor):
    class Inputs(serializers.Serializer):
        account = serializers.CharField()

    first = step(Throttled)

    @step(wait_for=["first"])
    def after() -> None:
        ledger("run", "after")


def test_a_step_semaphore_is_held_around_the_body_only(backend: Any) -> None:
    outcome = UsesPartner.run({"account": "a"})
    assert isinstance(outcome, Completed)
    assert backend.semaphore_holders("semaphore:partner-a") == []
    backend.acquire_semaphore("semaphore:partner-b", "run:other", 1, 30)
    blocked = UsesPartner.run({"account": "b"})
    assert isinstance(blocked, Failed)
    assert blocked.error.step == "first"
    assert "semaphore 'partner-b' has no free slot (1 of 1 held)" in blocked.error.message
    assert ("run", "after") not in [c for c in ledger.calls if c[1] == "after"][1:]


class Sequenced(Reactor):
    Inputs = Orders

    @step(order_id=arg.input("order_id"))
    def apply(order_id: int) -> int:
        ledger("run", f"apply-{order_id}")
        return order_id

    class Meta:
        coordination = [OrderedLock("account-1")]


def test_ordered_runs_complete_in_the_order_they_were_started(backend: Any) -> None:
    backend.enqueue_ordered("ordered:account-1", "earlier-run")
    waiting = Sequenced.run({"order_id": 1})
    assert isinstance(waiting, Failed)  # inline: the earlier run has not finished
    assert "waiting for execution earlier-run to finish first" in waiting.error.message
    backend.complete_ordered("ordered:account-1", "earlier-run", False, True)
    backend.complete_ordered("ordered:account-1", str(waiting.execution_id), True, False)
    done = Sequenced.run({"order_id": 2})
    assert isinstance(done, Completed), done


def test_declarations_are_checked_when_the_class_is_defined() -> None:
    with pytest.raises(DefinitionError, match="Semaphore limit must be a positive integer"):
        Semaphore("x", limit=0)
    with pytest.raises(DefinitionError, match="give either name= or limits="):
        RateLimit(name="stripe", limits={"second": 1})
    with pytest.raises(DefinitionError, match="an OrderedLock orders whole runs"):

        class Misplaced(Reactor):
            @step(coordination=[OrderedLock("k")])
            def noop() -> None:
                return None


def test_the_testing_helpers_read_locks_and_rate_counts(backend: Any) -> None:
    from django_reactor import testing

    result = testing.run_reactor(LockedOrder, {"order_id": 9})
    result.assert_completed().assert_acquired("lock", "order-9")
    testing.assert_lock_free("order-9")
    backend.acquire_lock("lock:order-9", f"run:{result.execution_id}", 30)
    testing.assert_lock_held("order-9", by=result)
    with pytest.raises(AssertionError, match="to be free"):
        testing.assert_lock_free("order-9")
    Limited.run({"order_id": 1})
    assert testing.rate_limit_count("partner", 60, name=True) == 1
    assert testing.semaphore_available("nobody", 3) == 3


def test_a_released_lock_wakes_the_run_that_waited_longest_for_it() -> None:
    import datetime as dt

    from django.utils import timezone

    from django_reactor import store
    from django_reactor.models import Dispatch, Execution

    later = timezone.now() + dt.timedelta(seconds=30)
    waiting = [
        Execution.objects.create(
            reactor="r",
            definition_hash="h",
            status="pending",
            wake_at=later,
            coordination={"waiting": "lock:order-1"},
        )
        for _ in range(2)
    ]
    other = Execution.objects.create(
        reactor="r", definition_hash="h", status="pending", wake_at=later,
        coordination={"waiting": "lock:order-2"},
    )  # fmt: skip
    assert store.wake_waiter("lock:order-1") == waiting[0].pk
    assert Execution.objects.get(pk=waiting[0].pk).wake_at is None
    assert Execution.objects.get(pk=waiting[1].pk).wake_at == later  # one run per release
    assert Execution.objects.get(pk=other.pk).wake_at == later
    assert Dispatch.objects.filter(execution_id=waiting[0].pk, reason="wake").count() == 1
    assert store.wake_waiter("lock:nobody") is None


def test_observers_hear_what_a_run_took_after_it_started(backend: Any) -> None:
    from django_reactor import signals

    heard: list[tuple[str, Any]] = []

    def started(sender: Any, event: Any, **kwargs: Any) -> None:
        heard.append(("started", event.execution_id))

    def resumed(sender: Any, event: Any, **kwargs: Any) -> None:
        heard.append(("resumed", event.execution_id))

    def acquired(sender: Any, event: Any, **kwargs: Any) -> None:
        heard.append((f"{event.kind} {event.key} fence={event.fence}", event.execution_id))

    signals.execution_started.connect(started)
    signals.execution_resumed.connect(resumed)
    signals.coordination_acquired.connect(acquired)
    try:
        outcome = LockedOrder.run({"order_id": 11})
    finally:
        signals.execution_started.disconnect(started)
        signals.execution_resumed.disconnect(resumed)
        signals.coordination_acquired.disconnect(acquired)
    fence = outcome.value["order-11"]
    assert heard == [
        ("started", outcome.execution_id),
        (f"lock order-11 fence={fence}", outcome.execution_id),
    ]
