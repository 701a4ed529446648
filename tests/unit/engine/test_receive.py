"""receive(topic): an interrupt whose payloads come from the run's mailbox, in memory."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from django_reactor import ContinueWith, Paused, Reactor, compose, receive, step
from django_reactor.engine import constructs
from django_reactor.engine.constructs.receive import check_topic, receive_paths
from django_reactor.exceptions import DefinitionError, InvalidMessage
from tests.helpers import run_in_memory, trace
from tests.integration.reactors import Tracked


class Payment(serializers.Serializer):
    amount = serializers.IntegerField()
    card = serializers.CharField(write_only=True)


class Checkout(Reactor):
    order = step(Tracked)
    paid = receive("payment.done", after="order", serializer=Payment, timeout=60, default={})
    ship = step(Tracked, wait_for=["paid"])


class Parent(Reactor):
    first = step(Tracked)
    checkout = compose(Checkout, wait_for=["first"])
    refund = receive("refund", after="checkout", resume="background")


def test_a_receive_is_an_interrupt_of_its_topic_run_by_the_interrupt_construct() -> None:
    spec = Checkout.definition.by_name["paid"]
    assert spec.interrupt is not None
    assert (spec.interrupt.topic, spec.interrupt.payload, spec.interrupt.timeout) == (
        "payment.done",
        Payment,
        60.0,
    )
    assert spec.interrupt.on_timeout == ContinueWith({})
    assert spec.secret_result_paths == (("card",),)
    assert constructs.construct_for(spec).name == "interrupt"
    assert Checkout.definition.shape["paid"]["impl"] == "django_reactor.engine.interrupts.Receive"


def test_a_run_waits_at_its_receive_as_at_an_interrupt() -> None:
    outcome, journal = run_in_memory(Checkout)
    assert isinstance(outcome, Paused)
    assert outcome.step == "paid"
    assert trace(journal) == [("run", "order"), ("interrupt", "paid")]
    assert [e.kind for e in journal.events][-1] == "pause"


def test_receive_paths_list_the_composed_childrens_receives_by_path() -> None:
    assert list(receive_paths(Parent.definition)) == [
        ("checkout.paid", "payment.done"),
        ("refund", "refund"),
    ]


@pytest.mark.parametrize("topic", ["payment", "a.b-c_d:e", "9lives", "x" * 255])
def test_valid_topics(topic: str) -> None:
    assert check_topic(topic) == topic


@pytest.mark.parametrize("topic", ["", " ", "a b", ".dot", "x" * 256, "é", "a/b", None, 5])
def test_invalid_topics_say_what_a_topic_is(topic: object) -> None:
    with pytest.raises(InvalidMessage, match=r"letters, digits and '\._:-'"):
        check_topic(topic)


def test_a_bad_declaration_is_refused_when_the_reactor_is_defined() -> None:
    with pytest.raises(DefinitionError, match=r"receive\(topic=...\)"):
        receive("two words")
    with pytest.raises(DefinitionError, match="give a timeout too"):
        receive("t", default=1)
    with pytest.raises(DefinitionError, match="must be a DRF serializer class"):
        receive("t", serializer=dict)
    with pytest.raises(DefinitionError, match='"inline" or "background"'):
        receive("t", resume="later")
