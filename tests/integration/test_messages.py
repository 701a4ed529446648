"""A run's mailbox: send() keeps messages until a receive() takes them, each exactly once."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings
from rest_framework import serializers

import django_reactor
from django_reactor import (
    Completed,
    Dispatched,
    InProgress,
    Paused,
    Reactor,
    arg,
    compose,
    interrupt,
    receive,
    services,
    step,
    store,
)
from django_reactor.exceptions import (
    AlreadyResumed,
    DefinitionError,
    ExecutionNotFound,
    IdempotencyKeyReused,
    InvalidMessage,
    InvalidTransition,
    UnknownTopic,
)
from django_reactor.models import Execution, Interrupt, Message
from django_reactor.states import ExecutionStatus, InterruptStatus, MessageStatus
from tests.api.reactors import GATE, Held
from tests.integration.nested_reactors import ApprovedCheckout
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)


class Payment(serializers.Serializer):
    amount = serializers.IntegerField(min_value=1)
    card = serializers.CharField(write_only=True, required=False, default="")


class Checkout(Reactor):
    """Waits for an operator's go, then for a payment message."""

    order = step(Tracked)
    go = interrupt(after="order")
    paid = receive("payment", after="go", serializer=Payment)
    ship = step(Tracked, amount=arg.result("paid", "amount"))


class TwoPayments(Reactor):
    order = step(Tracked)
    first = receive("payment", after="order")
    second = receive("payment", after="first")
    ship = step(Tracked, first=arg.result("first"), second=arg.result("second"))


class TwoApprovals(Reactor):
    order = step(Tracked)
    finance = interrupt(after="order")
    legal = interrupt(after="finance")
    ship = step(Tracked, legal=arg.result("legal", "ok"))


class WaitsWhileBusy(Reactor):
    """Reaches its interrupt and its receive, then keeps running ``busy`` until the test lets
    it go: deliveries made meanwhile find the run moving, past both."""

    order = step(Tracked)
    legal = interrupt(after="order")
    paid = receive("payment", after="order")
    busy = step(Held, wait_for=["order"])
    ship = step(Tracked, legal=arg.result("legal", "ok"), paid=arg.result("paid"))


def trace(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in store.event_rows(execution_id)]


def mailbox(execution_id: Any) -> list[tuple[str, str, Any]]:
    return [
        (m.topic, m.status, m.consumed_by_step)
        for m in Message.objects.filter(execution_id=execution_id).order_by("id")
    ]


def test_a_message_sent_to_a_run_paused_at_its_receive_resumes_it_inline() -> None:
    paused = TwoPayments.run({})
    assert isinstance(paused, Paused)
    assert paused.step == "first"

    kept = django_reactor.send(paused.execution_id, "payment", {"n": 1})
    assert isinstance(kept, Paused)  # it went on inline, to the second receive
    assert kept.step == "second"
    done = django_reactor.send(paused.execution_id, "payment", [2, "two"])

    assert isinstance(done, Completed)
    assert done.value["ship"] == {"step": "ship", "first": {"n": 1}, "second": [2, "two"]}
    assert mailbox(paused.execution_id) == [
        ("payment", MessageStatus.CONSUMED, "first"),
        ("payment", MessageStatus.CONSUMED, "second"),
    ]
    assert trace(paused.execution_id) == [
        ("start", ""),
        ("run", "order"),
        ("interrupt", "first"),
        ("pause", ""),
        ("payload", "first"),
        ("interrupt", "second"),
        ("pause", ""),
        ("payload", "second"),
        ("run", "ship"),
        ("complete", ""),
    ]


def test_messages_sent_before_the_run_waits_are_kept_and_taken_in_send_order() -> None:
    paused = Checkout.run({})
    assert paused.step == "go"
    first = django_reactor.send(paused.execution_id, "payment", {"amount": 5})
    second = django_reactor.send(paused.execution_id, "payment", {"amount": 7})
    assert isinstance(first, InProgress)
    assert first.status == ExecutionStatus.PAUSED
    assert isinstance(second, InProgress)
    assert mailbox(paused.execution_id) == [
        ("payment", MessageStatus.UNREAD, ""),
        ("payment", MessageStatus.UNREAD, ""),
    ]

    done = services.resume_interrupt(paused.execution_id, step="go", payload={})

    assert isinstance(done, Completed)
    assert done.value["ship"] == {"step": "ship", "amount": 5}  # the first one sent
    assert mailbox(paused.execution_id) == [
        ("payment", MessageStatus.CONSUMED, "paid"),
        ("payment", MessageStatus.UNREAD, ""),  # shown with the run that ended
    ]
    assert trace(paused.execution_id)[-6:] == [
        ("payload", "go"),
        ("interrupt", "paid"),
        ("pause", ""),
        ("payload", "paid"),
        ("run", "ship"),
        ("complete", ""),
    ]


def test_an_invalid_message_is_recorded_and_skipped_and_the_next_one_taken() -> None:
    paused = Checkout.run({})
    services.resume_interrupt(paused.execution_id, step="go", payload={})
    refused = django_reactor.send(paused.execution_id, "payment", {"amount": -1})
    assert isinstance(refused, InProgress)  # still waiting, nothing crashed
    assert Execution.objects.get(pk=paused.execution_id).status == ExecutionStatus.PAUSED

    done = django_reactor.send(paused.execution_id, "payment", {"amount": 3, "card": "4242"})

    assert isinstance(done, Completed)
    bad, good = Message.objects.filter(execution_id=paused.execution_id).order_by("id")
    assert bad.status == MessageStatus.INVALID
    assert "amount" in bad.errors
    assert good.status == MessageStatus.CONSUMED
    kinds = [kind for kind, _step in trace(paused.execution_id)]
    assert kinds.count("invalid_payload") == 1
    # The write_only field is sealed in the message and in the step's result.
    assert "4242" not in str(good.payload)
    assert "4242" not in str(
        Interrupt.objects.get(execution_id=paused.execution_id, step="paid").payload
    )


def test_a_repeated_idempotency_key_keeps_one_message() -> None:
    paused = Checkout.run({})
    django_reactor.send(paused.execution_id, "payment", {"amount": 5}, idempotency_key="k1")
    again = django_reactor.send(paused.execution_id, "payment", {"amount": 5}, idempotency_key="k1")
    assert again.idempotent_replay
    with pytest.raises(IdempotencyKeyReused, match="another message"):
        django_reactor.send(paused.execution_id, "payment", {"amount": 6}, idempotency_key="k1")
    assert Message.objects.filter(execution_id=paused.execution_id).count() == 1


def test_bad_sends_are_refused_and_write_nothing() -> None:
    paused = Checkout.run({})
    run_id = paused.execution_id
    with pytest.raises(ExecutionNotFound):
        django_reactor.send("00000000-0000-0000-0000-000000000000", "payment", {})
    with pytest.raises(
        UnknownTopic, match=r"receives no messages on 'refund' \(its topics: payment\)"
    ):
        django_reactor.send(run_id, "refund", {})
    for topic in ["", "bad topic", "x" * 256, "-leading", 3]:
        with pytest.raises(InvalidMessage, match="a topic is a name"):
            django_reactor.send(run_id, topic, {})  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage, match="cannot be stored"):
        django_reactor.send(run_id, "payment", {"at": object()})
    small = override_settings(REACTOR={**settings.REACTOR, "API_MAX_BODY_BYTES": 50})
    with small, pytest.raises(InvalidMessage, match="larger than 50 bytes"):
        django_reactor.send(run_id, "payment", {"note": "x" * 100})
    services.cancel(run_id)
    with pytest.raises(InvalidTransition, match="takes no messages any more"):
        django_reactor.send(run_id, "payment", {"amount": 1})
    assert not Message.objects.exists()


def test_receive_is_checked_when_the_reactor_is_defined() -> None:
    with pytest.raises(DefinitionError, match="a topic is a name"):
        receive("no spaces")
    with pytest.raises(DefinitionError, match="give a timeout too"):
        receive("payment", default={})
    with pytest.raises(DefinitionError, match="cannot be stored"):
        receive("payment", timeout=5, default=object())


def test_a_receive_that_times_out_goes_on_with_its_default() -> None:
    class Patient(Reactor):
        order = step(Tracked)
        paid = receive("payment", after="order", timeout=60, default={"amount": 0})
        ship = step(Tracked, paid=arg.result("paid"))

    paused = Patient.run({})
    Interrupt.objects.filter(execution_id=paused.execution_id).update(
        expires_at="2000-01-01T00:00Z"
    )
    assert services.expire_interrupts() == 1
    row = Interrupt.objects.get(execution_id=paused.execution_id)
    assert (row.status, row.payload) == (InterruptStatus.EXPIRED, {"amount": 0})


# ---------------------------------------------------------------------------- early deliveries


def test_a_delivery_before_the_run_reaches_its_interrupt_is_kept_and_applied_once() -> None:
    paused = TwoApprovals.run({})
    assert paused.step == "finance"

    early = services.resume_interrupt(paused.execution_id, step="legal", payload={"ok": True})
    assert isinstance(early, InProgress)
    with pytest.raises(AlreadyResumed, match="already has a payload"):
        services.resume_interrupt(paused.execution_id, step="legal", payload={"ok": False})

    done = services.resume_interrupt(paused.execution_id, step="finance", payload={})

    assert isinstance(done, Completed)
    assert done.value["ship"] == {"step": "ship", "legal": True}  # the first delivery won
    assert mailbox(paused.execution_id) == [("legal", MessageStatus.CONSUMED, "legal")]
    with pytest.raises(AlreadyResumed, match="already accepted"):
        services.resume_interrupt(paused.execution_id, step="legal", payload={"ok": True})


# ---------------------------------------------------------------------------- races


@pytest.mark.parametrize("round_", range(8))
def test_a_send_racing_the_run_reaching_its_receive_is_consumed_exactly_once(round_: int) -> None:
    paused = Checkout.run({})
    run_id = paused.execution_id
    barrier = threading.Barrier(2, timeout=10)
    results: dict[str, Any] = {}

    def arrive() -> None:
        try:
            barrier.wait()
            results["arrive"] = services.resume_interrupt(run_id, step="go", payload={})
        except Exception as exc:  # reported below
            results["arrive"] = exc
        finally:
            connections.close_all()

    def send() -> None:
        try:
            barrier.wait()
            results["send"] = django_reactor.send(run_id, "payment", {"amount": 9})
        except Exception as exc:
            results["send"] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=arrive), threading.Thread(target=send)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not any(isinstance(r, Exception) for r in results.values()), results
    if Execution.objects.get(pk=run_id).status == ExecutionStatus.PENDING:
        # The message came while the run was moving: it paused and handed itself to a worker.
        assert Dispatched in {type(r) for r in results.values()}, results
        services.resume(run_id)
    assert Execution.objects.get(pk=run_id).status == ExecutionStatus.COMPLETED, results
    assert mailbox(run_id) == [("payment", MessageStatus.CONSUMED, "paid")]
    assert [kind for kind, s in trace(run_id) if s == "paid"].count("payload") == 1


def test_concurrent_sends_with_one_key_store_one_message_and_keep_the_order() -> None:
    paused = Checkout.run({})
    run_id = paused.execution_id
    barrier = threading.Barrier(6, timeout=10)
    results: list[Any] = []

    def send(n: int) -> None:
        try:
            barrier.wait()
            key = "same" if n < 3 else f"own-{n}"
            results.append(
                django_reactor.send(run_id, "payment", {"amount": 1}, idempotency_key=key)
            )
        except Exception as exc:
            results.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not any(isinstance(r, Exception) for r in results), results
    keys = list(
        Message.objects.filter(execution_id=run_id)
        .order_by("id")
        .values_list("idempotency_key", flat=True)
    )
    assert sorted(keys) == ["own-3", "own-4", "own-5", "same"]
    assert sum(bool(getattr(r, "idempotent_replay", False)) for r in results) == 2


def test_messages_are_pruned_with_their_run() -> None:
    paused = Checkout.run({})
    django_reactor.send(paused.execution_id, "payment", {"amount": 1})
    services.cancel(paused.execution_id)
    Execution.objects.filter(pk=paused.execution_id).update(finished_at="2000-01-01T00:00Z")
    assert list(store.prune_finished(dt.datetime(2001, 1, 1, tzinfo=dt.UTC), ["cancelled"], 10))
    assert not Message.objects.exists()
    assert not Execution.objects.filter(pk=paused.execution_id).exists()


@pytest.mark.parametrize("round_", range(8))
def test_a_delivery_racing_the_run_reaching_its_interrupt_is_applied_exactly_once(
    round_: int,
) -> None:
    paused = TwoApprovals.run({})
    run_id = paused.execution_id
    barrier = threading.Barrier(2, timeout=10)
    results: dict[str, Any] = {}

    def act(name: str, step_name: str, payload: dict[str, Any]) -> None:
        try:
            barrier.wait()
            results[name] = services.resume_interrupt(run_id, step=step_name, payload=payload)
        except Exception as exc:  # reported below
            results[name] = exc
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=act, args=("arrive", "finance", {})),
        threading.Thread(target=act, args=("deliver", "legal", {"ok": round_ % 2 == 0})),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not any(isinstance(r, Exception) for r in results.values()), results  # no NotWaiting
    if Execution.objects.get(pk=run_id).status == ExecutionStatus.PENDING:
        assert Dispatched in {type(r) for r in results.values()}, results
        services.resume(run_id)
    row = Execution.objects.get(pk=run_id)
    assert row.status == ExecutionStatus.COMPLETED, results
    kinds = [(kind, s) for kind, s in trace(run_id) if s in ("legal", "ship")]
    assert kinds == [("interrupt", "legal"), ("payload", "legal"), ("run", "ship")], kinds
    ship = row.steps.get(step="ship").result
    assert ship["legal"] is (round_ % 2 == 0)


def test_deliveries_while_the_run_moves_past_its_waits_are_taken_when_it_pauses() -> None:
    GATE.reset()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["run"] = WaitsWhileBusy.run({})
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    assert GATE.entered.wait(timeout=20)
    run_id = Execution.objects.get(reactor=WaitsWhileBusy.definition.name).pk
    assert set(Interrupt.objects.filter(execution_id=run_id).values_list("step", flat=True)) == {
        "legal",
        "paid",
    }
    try:
        legal = services.resume_interrupt(run_id, step="legal", payload={"ok": True})
        paid = django_reactor.send(run_id, "payment", {"n": 1})
    finally:
        GATE.release.set()
        runner.join(timeout=30)

    assert legal == InProgress(execution_id=run_id, status=ExecutionStatus.RUNNING)
    assert paid == InProgress(execution_id=run_id, status=ExecutionStatus.RUNNING)
    assert isinstance(outcome["run"], Dispatched)  # it paused, found both, handed itself on
    services.resume(run_id)
    row = Execution.objects.get(pk=run_id)
    assert row.status == ExecutionStatus.COMPLETED
    assert row.steps.get(step="ship").result == {"step": "ship", "legal": True, "paid": {"n": 1}}
    assert mailbox(run_id) == [("payment", MessageStatus.CONSUMED, "paid")]
    assert [k for k, s in trace(run_id) if s in ("legal", "paid")].count("payload") == 2


class GoThenCheckout(Reactor):
    """Waits for an operator's go, then composes a child that waits at its own interrupt."""

    start = step(Tracked)
    go = interrupt(after="start")
    checkout = compose(ApprovedCheckout, wait_for=["go"], order=arg.value("N1"))


def test_an_early_delivery_to_a_composed_childs_interrupt_is_applied_when_it_gets_there() -> None:
    paused = GoThenCheckout.run({})
    kept = services.resume_interrupt(
        paused.execution_id, step="checkout.approval", payload={"approved": True}
    )
    assert isinstance(kept, InProgress)

    done = services.resume_interrupt(paused.execution_id, step="go", payload={})

    assert isinstance(done, Completed), done
    assert mailbox(paused.execution_id) == [
        ("checkout.approval", MessageStatus.CONSUMED, "checkout.approval")
    ]
    child = Execution.objects.get(parent_id=paused.execution_id)
    assert child.steps.get(step="ship").result["approved"] is True


def test_the_sweeper_gives_a_paused_run_the_message_it_did_not_look_at() -> None:
    paused = Checkout.run({})
    services.resume_interrupt(paused.execution_id, step="go", payload={})
    # As if the process had stopped between the pause and its look at the mailbox.
    Message.objects.create(execution_id=paused.execution_id, topic="payment", payload={"amount": 4})

    report = services.sweep()

    assert report.recovered == 1
    row = Execution.objects.get(pk=paused.execution_id)
    assert row.status == ExecutionStatus.PENDING  # handed to a worker
    services.resume(row.pk)
    row = Execution.objects.get(pk=paused.execution_id)
    assert row.status == ExecutionStatus.COMPLETED
    assert row.steps.get(step="ship").result == {"step": "ship", "amount": 4}
    assert services.sweep().recovered == 0


def test_a_handle_sends_to_its_run() -> None:
    paused = TwoPayments.run({})
    handle = TwoPayments.find(paused.execution_id)
    handle.send("payment", 1)
    done = handle.send("payment", 2, idempotency_key="second")
    assert isinstance(done, Completed)
    assert done.value["ship"] == {"step": "ship", "first": 1, "second": 2}
