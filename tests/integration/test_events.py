"""Events across runs: emit() kept once per event id, matched to wait_for_event by key (with a
look back), starting runs (Meta.triggers) and cancelling them (Meta.cancel_on)."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone
from rest_framework import serializers

import django_reactor
from django_reactor import (
    Dispatched,
    Paused,
    Reactor,
    arg,
    compose,
    interrupt,
    on_event,
    services,
    step,
    store,
    wait_for_event,
)
from django_reactor.exceptions import DefinitionError, InvalidEvent, UnknownEvent
from django_reactor.models import CancelSubscription, Event, Execution, Interrupt, Message
from django_reactor.services import events as event_service
from django_reactor.states import ExecutionStatus, MessageKind, MessageStatus
from tests.api.reactors import GATE, Held
from tests.helpers import ledger
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db(transaction=True)


class Refund(serializers.Serializer):
    amount = serializers.IntegerField(min_value=1)


class AwaitRefund(Reactor):
    charge = step(Tracked, order=arg.input("order"))
    refunded = wait_for_event(
        "charge.refunded", match=arg.input("order"), serializer=Refund, resume="inline"
    )
    close = step(Tracked, amount=arg.result("refunded", "amount"))


class AwaitAnyRefund(Reactor):
    """Waits for the next refund, whatever its key, and looks back a minute."""

    charge = step(Tracked)
    refunded = wait_for_event("charge.refunded", lookback=dt.timedelta(minutes=1))
    close = step(Tracked, refund=arg.result("refunded"))


class AwaitShipment(Reactor):
    """Waits in the background for a shipment matched on a step's result, looking back."""

    order = step(Tracked, number=arg.input("order"))
    shipped = wait_for_event(
        "order.shipped",
        match=arg.result("order", "number"),
        lookback=dt.timedelta(minutes=5),
        timeout=dt.timedelta(hours=1),
        default={"carrier": "none"},
    )
    notify = step(Tracked, carrier=arg.result("shipped", "carrier"))


def invoice_inputs(event: django_reactor.EmittedEvent) -> dict[str, Any]:
    return {"invoice": event.payload["invoice"], "event": event.event_id}


class Invoiced(Reactor):
    """Started by each invoice.paid event; cancelled and rolled back by order.cancelled."""

    class Inputs(serializers.Serializer):
        invoice = serializers.CharField()
        event = serializers.CharField()

    book = step(Tracked, invoice=arg.input("invoice"))
    approve = interrupt(after="book")
    ship = step(Tracked, wait_for=["approve"])

    class Meta:
        triggers = [on_event("invoice.paid", inputs=invoice_inputs)]
        cancel_on = [on_event("order.cancelled", match=arg.input("invoice"))]


class HeldOrder(Reactor):
    """Cancelled by order.voided while it runs a step the test holds."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    book = step(Tracked)
    hold = step(Held, wait_for=["book"])
    ship = step(Tracked, wait_for=["hold"])

    class Meta:
        cancel_on = [on_event("order.voided", match=arg.input("order"))]


class ChildWaits(Reactor):
    ready = step(Tracked)
    parcel = wait_for_event("parcel.delivered", match=arg.input("parcel"), resume="inline")


class ParentOfWaiter(Reactor):
    start = step(Tracked)
    child = compose(ChildWaits, wait_for=["start"], parcel=arg.input("parcel"))
    done = step(Tracked, wait_for=["child"])


def trace(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in store.event_rows(execution_id)]


def status(execution_id: Any) -> str:
    return str(Execution.objects.get(pk=execution_id).status)


def event_messages(execution_id: Any) -> list[tuple[str, str]]:
    return [
        (m.topic, m.status)
        for m in Message.objects.filter(execution_id=execution_id, kind=MessageKind.EVENT)
    ]


def test_an_event_resumes_the_run_waiting_for_its_key_and_no_other() -> None:
    first = AwaitRefund.run({"order": "A1"})
    second = AwaitRefund.run({"order": "B2"})
    assert isinstance(first, Paused)
    assert isinstance(second, Paused)

    emitted = django_reactor.emit("charge.refunded", {"amount": 5}, key="A1", event_id="re_1")

    assert emitted.resumed == (first.execution_id,)
    assert status(first.execution_id) == ExecutionStatus.COMPLETED
    assert status(second.execution_id) == ExecutionStatus.PAUSED
    assert Execution.objects.get(pk=first.execution_id).steps.get(step="close").result == {
        "step": "close",
        "amount": 5,
    }
    assert trace(first.execution_id)[-4:] == [
        ("pause", ""),
        ("payload", "refunded"),
        ("run", "close"),
        ("complete", ""),
    ]
    assert event_messages(first.execution_id) == [("refunded", MessageStatus.CONSUMED)]
    assert event_messages(second.execution_id) == []
    assert Event.objects.get(event_id="re_1").handled_at is not None


def test_one_event_resumes_every_run_waiting_for_it() -> None:
    runs = [AwaitRefund.run({"order": "SAME"}).execution_id for _ in range(3)]
    other = AwaitAnyRefund.run({}).execution_id

    emitted = django_reactor.emit("charge.refunded", {"amount": 9}, key="SAME")

    assert set(emitted.resumed) == {*runs, other}
    assert {status(run) for run in runs} == {ExecutionStatus.COMPLETED}  # inline
    assert status(other) == ExecutionStatus.PENDING  # handed to a worker
    services.resume(other)
    assert status(other) == ExecutionStatus.COMPLETED


def test_emitting_an_event_id_again_does_nothing_new() -> None:
    paused = AwaitRefund.run({"order": "A1"})
    first = django_reactor.emit("charge.refunded", {"amount": 5}, key="A1", event_id="re_1")
    again = django_reactor.emit("charge.refunded", {"amount": 5}, key="A1", event_id="re_1")

    assert not first.replay
    assert again.replay
    assert again.resumed == ()
    assert Event.objects.count() == 1
    assert event_messages(paused.execution_id) == [("refunded", MessageStatus.CONSUMED)]
    with pytest.raises(InvalidEvent, match="first emitted with another key or payload"):
        django_reactor.emit("charge.refunded", {"amount": 6}, key="A1", event_id="re_1")
    assert Event.objects.count() == 1


def test_an_event_the_serializer_refuses_is_kept_invalid_and_the_wait_takes_the_next() -> None:
    paused = AwaitRefund.run({"order": "A1"})

    refused = django_reactor.emit("charge.refunded", {"amount": 0}, key="A1")
    assert refused.resumed == ()
    assert status(paused.execution_id) == ExecutionStatus.PAUSED
    taken = django_reactor.emit("charge.refunded", {"amount": 3}, key="A1")

    assert taken.resumed == (paused.execution_id,)
    assert event_messages(paused.execution_id) == [
        ("refunded", MessageStatus.INVALID),
        ("refunded", MessageStatus.CONSUMED),
    ]
    invalid = Message.objects.get(execution_id=paused.execution_id, status=MessageStatus.INVALID)
    assert "amount" in invalid.errors
    assert ("invalid_payload", "refunded") in trace(paused.execution_id)


def test_a_wait_looks_back_over_the_events_emitted_before_it_began_and_no_further() -> None:
    django_reactor.emit("order.shipped", {"carrier": "old"}, key="N1", event_id="too-old")
    Event.objects.filter(event_id="too-old").update(
        created_at=timezone.now() - dt.timedelta(minutes=6)
    )
    django_reactor.emit("order.shipped", {"carrier": "ups"}, key="N1", event_id="recent")
    django_reactor.emit("order.shipped", {"carrier": "dhl"}, key="N2", event_id="other-key")

    outcome = AwaitShipment.run({"order": "N1"})

    # The recent event was given to the wait as it began, and a worker takes it on.
    assert isinstance(outcome, Dispatched), outcome
    services.resume(outcome.execution_id)
    assert status(outcome.execution_id) == ExecutionStatus.COMPLETED
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.steps.get(step="notify").result == {"step": "notify", "carrier": "ups"}
    assert event_messages(outcome.execution_id) == [("shipped", MessageStatus.CONSUMED)]


def test_without_a_look_back_an_earlier_event_is_not_taken() -> None:
    django_reactor.emit("charge.refunded", {"amount": 5}, key="A1", event_id="early")

    paused = AwaitRefund.run({"order": "A1"})

    assert isinstance(paused, Paused)
    assert event_messages(paused.execution_id) == []
    later = django_reactor.emit("charge.refunded", {"amount": 7}, key="A1")
    assert later.resumed == (paused.execution_id,)


def test_a_wait_matches_by_an_index_on_the_events_name_and_key() -> None:
    AwaitRefund.run({"order": "A1"})
    row = Interrupt.objects.get(step="refunded")
    assert (row.event_name, row.event_key) == ("charge.refunded", "A1")
    query = Interrupt.objects.filter(event_name="charge.refunded", event_key="A1", status="waiting")
    if connections["default"].vendor == "postgresql":
        with connections["default"].cursor() as cursor:
            cursor.execute("SET enable_seqscan = off")
        plan = query.explain()
        assert "reactor_interrupt_event_idx" in plan, plan


def test_a_composed_childs_wait_takes_the_event_for_the_run_at_the_top() -> None:
    paused = ParentOfWaiter.run({"parcel": "P7"})
    assert isinstance(paused, Paused)

    emitted = django_reactor.emit("parcel.delivered", {"at": "door"}, key="P7")

    assert emitted.resumed == (paused.execution_id,)
    assert status(paused.execution_id) == ExecutionStatus.COMPLETED
    assert event_messages(paused.execution_id) == [("child.parcel", MessageStatus.CONSUMED)]


def test_a_trigger_starts_one_run_per_event_and_a_repeat_starts_none() -> None:
    first = django_reactor.emit("invoice.paid", {"invoice": "I1"}, event_id="evt_1")
    again = django_reactor.emit("invoice.paid", {"invoice": "I1"}, event_id="evt_1")
    other = django_reactor.emit("invoice.paid", {"invoice": "I2"}, event_id="evt_2")

    assert len(first.started) == 1
    assert again.replay
    assert again.started == ()
    assert len(other.started) == 1
    rows = Execution.objects.filter(reactor=Invoiced.definition.name).order_by("created_at")
    assert [(r.idempotency_key, r.inputs) for r in rows] == [
        ("event:invoice.paid:evt_1", {"invoice": "I1", "event": "evt_1"}),
        ("event:invoice.paid:evt_2", {"invoice": "I2", "event": "evt_2"}),
    ]
    assert {r.status for r in rows} == {ExecutionStatus.PENDING}


def test_a_trigger_whose_reactor_refuses_the_inputs_is_recorded_on_the_event() -> None:
    emitted = django_reactor.emit("invoice.paid", {"invoice": ""}, event_id="evt_bad")

    assert emitted.started == ()
    assert len(emitted.errors) == 1
    assert "refused the inputs" in emitted.errors[0]
    event = Event.objects.get(event_id="evt_bad")
    assert event.handled_at is not None
    assert event.errors == list(emitted.errors)
    assert not Execution.objects.filter(reactor=Invoiced.definition.name).exists()


def test_two_emitters_and_two_sweepers_racing_on_one_event_id_start_one_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(event_service, "UNHANDLED_AFTER_SECONDS", 0.0)
    for round_number in range(5):
        barrier = threading.Barrier(4, timeout=10)
        errors: list[BaseException] = []

        def emitter(
            number: int = round_number, barrier: Any = barrier, errors: Any = errors
        ) -> None:
            try:
                barrier.wait()
                django_reactor.emit(
                    "invoice.paid", {"invoice": f"R{number}"}, event_id=f"race_{number}"
                )
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                connections.close_all()

        def sweeper(barrier: Any = barrier, errors: Any = errors) -> None:
            try:
                barrier.wait()
                for _ in range(3):
                    services.finish_events()
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=emitter) for _ in range(2)]
        threads += [threading.Thread(target=sweeper) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors, errors
        assert not any(thread.is_alive() for thread in threads)
        started = Execution.objects.filter(
            reactor=Invoiced.definition.name,
            idempotency_key=f"event:invoice.paid:race_{round_number}",
        )
        assert started.count() == 1
        assert Event.objects.filter(event_id=f"race_{round_number}").count() == 1


def test_an_event_left_unhandled_by_a_stopped_emitter_is_handled_by_the_sweeper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    paused = AwaitRefund.run({"order": "A1"})
    # The emitter stopped after the event's row committed, before it saw to anything.
    recorded = store.events.record("charge.refunded", {"amount": 4}, key="A1", event_id="lost")
    assert recorded.waits
    monkeypatch.setattr(event_service, "UNHANDLED_AFTER_SECONDS", 0.0)

    assert services.finish_events() >= 1

    assert status(paused.execution_id) == ExecutionStatus.COMPLETED
    assert Event.objects.get(event_id="lost").handled_at is not None


def test_cancel_on_cancels_a_paused_run_and_a_worker_rolls_it_back() -> None:
    started = django_reactor.emit("invoice.paid", {"invoice": "I9"}, event_id="evt_9")
    run_id = started.started[0]
    services.resume(run_id)  # the worker: it books, then waits for approval
    assert status(run_id) == ExecutionStatus.PAUSED
    ledger.clear()

    emitted = django_reactor.emit("order.cancelled", {"why": "customer"}, key="I9")

    assert emitted.cancelled == (run_id,)
    assert status(run_id) == ExecutionStatus.ROLLING_BACK
    assert not CancelSubscription.objects.filter(execution_id=run_id).exists()
    services.resume(run_id)  # the worker the rollback was handed to
    assert status(run_id) == ExecutionStatus.CANCELLED
    assert ledger.calls == [("undo", "book")]
    cancel = [e for e in store.event_rows(run_id) if e.kind == "cancel"]
    assert cancel[0].data["rollback"] is True
    assert cancel[0].data["event"] == "order.cancelled"
    # Another run's key cancels nothing; a finished run is not cancelled again.
    assert django_reactor.emit("order.cancelled", {}, key="I9").cancelled == ()


def test_cancel_on_asks_a_busy_run_to_stop_and_the_sweeper_rolls_it_back_after() -> None:
    GATE.entered.clear()
    GATE.release.clear()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["run"] = HeldOrder.run({"order": "H1"})
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert GATE.entered.wait(timeout=30)
        run_id = Execution.objects.get(reactor=HeldOrder.definition.name).pk
        emitted = django_reactor.emit("order.voided", {}, key="H1")
        assert emitted.cancelled == (run_id,)
        assert CancelSubscription.objects.get(execution_id=run_id).fired_at is not None
    finally:
        GATE.release.set()
        runner.join(timeout=30)
    assert status(run_id) == ExecutionStatus.CANCELLED  # it stopped after the held step
    ledger.clear()

    services.finish_events()
    services.resume(run_id)

    assert status(run_id) == ExecutionStatus.CANCELLED
    assert ledger.calls == [("undo", "book")]
    assert not CancelSubscription.objects.filter(execution_id=run_id).exists()


def test_emit_refuses_bad_input_and_writes_nothing() -> None:
    with pytest.raises(UnknownEvent, match="declare wait_for_event") as unknown:
        django_reactor.emit("invoice.payed", {})
    assert "invoice.paid" in unknown.value.known
    with pytest.raises(InvalidEvent, match="an event name"):
        django_reactor.emit("not a name", {})
    with pytest.raises(InvalidEvent, match="the key"):
        django_reactor.emit("charge.refunded", {}, key="")
    with pytest.raises(InvalidEvent, match="the event_id"):
        django_reactor.emit("charge.refunded", {}, event_id="x" * 256)
    with pytest.raises(InvalidEvent, match="cannot be stored"):
        django_reactor.emit("charge.refunded", {"when": object()})
    with pytest.raises(InvalidEvent, match="larger than"):
        django_reactor.emit("charge.refunded", {"blob": "x" * 2_000_000})
    assert not Event.objects.exists()


def test_declarations_refuse_what_cannot_work() -> None:
    with pytest.raises(DefinitionError, match="wait_for_event"):
        wait_for_event("no name")
    with pytest.raises(DefinitionError, match=r"match=\.\.\."):
        wait_for_event("a.b", match="order")
    with pytest.raises(DefinitionError, match="give a timeout too"):
        wait_for_event("a.b", default={})
    with pytest.raises(DefinitionError, match=r"arg\.input"):
        on_event("a.b", match=arg.result("x"))  # type: ignore[arg-type]

    with pytest.raises(DefinitionError, match="needs match="):

        class NoMatch(Reactor):
            only = step(Tracked)

            class Meta:
                cancel_on = [on_event("a.b")]

    with pytest.raises(DefinitionError, match="does not declare"):

        class UnknownInput(Reactor):
            class Inputs(serializers.Serializer):
                order = serializers.CharField()

            only = step(Tracked)

            class Meta:
                cancel_on = [on_event("a.b", match=arg.input("invoice"))]

    with pytest.raises(DefinitionError, match="match= belongs"):

        class TriggerWithMatch(Reactor):
            only = step(Tracked)

            class Meta:
                triggers = [on_event("a.b", match=arg.input("x"))]


def test_prune_deletes_handled_events_older_than_its_cutoff() -> None:
    django_reactor.emit("charge.refunded", {"amount": 1}, key="A1", event_id="old")
    django_reactor.emit("charge.refunded", {"amount": 1}, key="A1", event_id="new")
    store.events.record("charge.refunded", {"amount": 1}, key="A1", event_id="unhandled")
    Event.objects.filter(event_id__in=["old", "unhandled"]).update(
        created_at=timezone.now() - dt.timedelta(days=40)
    )

    services.prune(older_than_days=30)

    assert sorted(Event.objects.values_list("event_id", flat=True)) == ["new", "unhandled"]


def test_a_later_event_never_overtakes_one_the_look_back_gave_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    django_reactor.emit("charge.refunded", {"amount": 1}, event_id="earlier")
    # The window between the wait's checkpoint (its look back gives it "earlier", unread) and
    # the look at its mailbox after the pause: a slower process, or one killed there.
    monkeypatch.setattr(store.messages, "has_unread", lambda *args, **kwargs: False)
    outcome = AwaitAnyRefund.run({})
    monkeypatch.undo()
    assert event_messages(outcome.execution_id) == [("refunded", MessageStatus.UNREAD)]

    django_reactor.emit("charge.refunded", {"amount": 2}, event_id="later")

    services.resume(outcome.execution_id)  # the worker the wait hands the run to
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.COMPLETED
    assert row.steps.get(step="refunded").result == {"amount": 1}
    assert event_messages(outcome.execution_id) == [
        ("refunded", MessageStatus.CONSUMED),
        ("refunded", MessageStatus.UNREAD),
    ]
