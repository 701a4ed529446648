"""Business attributes in the engine: Meta.attributes checked at class definition, values kept
in one canonical text form, set_attribute() recorded with the step's checkpoint."""

from __future__ import annotations

import enum
import uuid
from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import Reactor, Retry, Step, Success, arg, map_over, step
from django_reactor.engine.attributes import canonical, check_key, parse_filter, wanted
from django_reactor.engine.journal import MemoryJournal
from django_reactor.engine.outcomes import Completed, Failed
from django_reactor.exceptions import DefinitionError, InvalidAttribute
from tests.helpers import run_in_memory


class Noop(Step):
    def run(self, **arguments: Any) -> Any:
        return None


class CustomerInputs(serializers.Serializer):
    customer_id = serializers.IntegerField()
    card = serializers.CharField(write_only=True, required=False)
    tier = serializers.CharField(required=False, allow_blank=True)


# ---------------------------------------------------------------------------- declarations


def test_meta_attributes_are_read_from_the_inputs_as_text() -> None:
    class Found(Reactor):
        Inputs = CustomerInputs
        only = step(Noop)

        class Meta:
            attributes = {
                "customer_id": arg.input("customer_id"),
                "tier": arg.input("tier"),
                "channel": arg.value("web"),
                "big": arg.input("customer_id", transform=lambda c: c > 100),
            }

    definition = Found.definition
    assert [key for key, _ in definition.attributes] == ["customer_id", "tier", "channel", "big"]
    assert definition.attributes_of({"customer_id": 42, "tier": "gold"}) == {
        "customer_id": "42",
        "tier": "gold",
        "channel": "web",
        "big": "false",
    }
    # An input left out, or blank, gives no attribute.
    assert definition.attributes_of({"customer_id": 420, "tier": ""}) == {
        "customer_id": "420",
        "channel": "web",
        "big": "true",
    }


def test_a_reactor_without_attributes_declares_none() -> None:
    class Bare(Reactor):
        only = step(Noop)

    assert Bare.definition.attributes == ()
    assert Bare.definition.attributes_of({"anything": 1}) == {}


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        (["customer_id"], r"Bad\.Meta\.attributes must be a dict of keys to templates"),
        ({"1st": arg.value("x")}, r"Bad\.Meta\.attributes: an attribute key is a letter"),
        ({"has space": arg.value("x")}, r"got 'has space'"),
        ({"k" * 65: arg.value("x")}, r"at most 64 characters"),
        (
            {"tier": "gold"},
            r"Bad\.Meta\.attributes\['tier'\] must be arg\.input.*arg\.value\('gold'\)",
        ),
        (
            {"paid": arg.result("only")},
            r"Bad\.Meta\.attributes\['paid'\] is the result of step 'only': attributes are set "
            r"when the run is created.*set_attribute",
        ),
        (
            {"customer": arg.input("customr")},
            r"Bad\.Meta\.attributes\['customer'\] reads input 'customr', which Bad\.Inputs does "
            r"not declare \(inputs: card, customer_id, tier\)",
        ),
        (
            {"card": arg.input("card")},
            r"Bad\.Meta\.attributes\['card'\] reads input 'card', a secret: attributes are kept "
            r"in clear and indexed",
        ),
        (
            {"amount": arg.value(1.5)},
            r"Bad\.Meta\.attributes\['amount'\]: an attribute is a string",
        ),
        ({"none": arg.value(None)}, r"arg\.value\(None\) sets no attribute"),
        (
            {f"k{i}": arg.value(i) for i in range(33)},
            r"declares 33 attributes; a reactor declares at most 32",
        ),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_reactor_and_the_key(
    attributes: object, message: str
) -> None:
    with pytest.raises(DefinitionError, match=message):
        define("Bad", attributes)


def define(name: str, attributes: object) -> type[Reactor]:
    """A reactor class named ``name`` with one step and ``Meta.attributes = attributes``."""
    meta = type("Meta", (), {"attributes": attributes})
    body = {
        "__module__": __name__,
        "__qualname__": name,
        "Inputs": CustomerInputs,
        "only": step(Noop),
        "Meta": meta,
    }
    made: type[Reactor] = type(Reactor)(name, (Reactor,), body)
    return made


def test_an_attribute_value_that_cannot_be_one_is_refused_when_the_run_is_made() -> None:
    class Typed(Reactor):
        only = step(Noop)

        class Meta:
            attributes = {"customer": arg.input("customer")}

    definition = Typed.definition
    with pytest.raises(
        InvalidAttribute,
        match=r"Typed\.Meta\.attributes\['customer'\]: an "
        r"attribute is a string, a whole number, a boolean or a UUID, got dict",
    ):
        definition.attributes_of({"customer": {"id": 7}})
    # Inputs that failed validation (a run recorded failed) keep what resolves, no more.
    assert definition.attributes_of({"customer": {"id": 7}}, strict=False) == {}
    assert definition.attributes_of({"customer": 7}, strict=False) == {"customer": "7"}
    assert definition.attributes_of({}, strict=True) == {}


# ---------------------------------------------------------------------------- values


class Colour(enum.StrEnum):
    RED = "red"


class Size(enum.IntEnum):
    LARGE = 3


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (42, "42"),
        ("42", "42"),
        (-7, "-7"),
        (True, "true"),
        (False, "false"),
        (uuid.UUID("12345678-1234-5678-1234-56781234ABCD"), "12345678-1234-5678-1234-56781234abcd"),
        (Colour.RED, "red"),
        (Size.LARGE, "3"),
        ("Zoë", "Zoë"),
        (None, None),
        ("", None),
        ("x" * 255, "x" * 255),
    ],
)
def test_values_are_kept_in_one_canonical_text(value: object, text: str | None) -> None:
    assert canonical(value, "here") == text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1.5, r"here: an attribute is a string, a whole number, a boolean or a UUID, got float"),
        ({"a": 1}, r"got dict"),
        ([1], r"got list"),
        ("x" * 256, r"at most 255 characters, got 256"),
        ("a\x00b", r"cannot hold NUL"),
        ("\ud800", r"unpaired surrogates"),
    ],
)
def test_a_value_no_attribute_can_hold_is_refused_saying_why(value: object, message: str) -> None:
    with pytest.raises(InvalidAttribute, match=message):
        canonical(value, "here")


def test_keys_and_filters_typed_by_a_person() -> None:
    assert check_key("customer_id", "here") == "customer_id"
    assert check_key("a.b:c-d_e", "here") == "a.b:c-d_e"
    for bad in ("", "9lives", "with space", "k=v", 42, "é"):
        with pytest.raises(InvalidAttribute, match="an attribute key is a letter"):
            check_key(bad, "here")
    assert parse_filter("customer_id=42", "here") == ("customer_id", "42")
    assert parse_filter("note=a=b", "here") == ("note", "a=b")
    for bad in ("customer_id", "customer_id="):
        with pytest.raises(InvalidAttribute, match=r"here: an attribute filter is KEY=VALUE"):
            parse_filter(bad, "here")
    with pytest.raises(InvalidAttribute, match=r"here: an attribute key is a letter.*got ''"):
        parse_filter("=42", "here")
    assert wanted({"customer_id": 42, "vip": True}, "here") == {"customer_id": "42", "vip": "true"}
    with pytest.raises(InvalidAttribute, match="attribute 'customer_id' has no value to look for"):
        wanted({"customer_id": None}, "here")


# ---------------------------------------------------------------------------- set_attribute


ATTEMPTS: list[int] = []


class SetsAttributes(Step):
    retry = Retry(attempts=2, backoff="fixed", delay=0)

    def run(self, **arguments: Any) -> Any:
        ATTEMPTS.append(self.context.attempt)
        self.context.set_attribute("attempt", self.context.attempt)
        self.context.set_attribute("order", f"order-{self.context.attempt}")
        if self.context.attempt == 1:
            self.context.set_attribute("only_on_failure", "x")
            raise RuntimeError("first attempt fails")
        return Success("ok")


class RemovesOne(Step):
    def run(self, **arguments: Any) -> Any:
        self.context.set_attribute("order", None)
        self.context.set_attribute("vip", True)
        return Success("ok")


class SetsInUndo(Step):
    def run(self, **arguments: Any) -> Any:
        return Success("ok")

    def undo(self, result: Any, **arguments: Any) -> Any:
        self.context.set_attribute("refunded", True)


class Explodes(Step):
    def run(self, **arguments: Any) -> Any:
        raise RuntimeError("boom")


class SetsBad(Step):
    def run(self, **arguments: Any) -> Any:
        self.context.set_attribute("amount", 12.5)
        return Success("never")


def test_set_attribute_is_recorded_with_the_checkpoint_of_the_attempt_that_succeeded() -> None:
    class Sets(Reactor):
        first = step(SetsAttributes)
        second = step(RemovesOne, wait_for=["first"])

    ATTEMPTS.clear()
    outcome, journal = run_in_memory(Sets)

    assert isinstance(outcome, Completed)
    assert ATTEMPTS == [1, 2]
    # The failed first attempt set nothing ("only_on_failure"); the second step removed one.
    assert journal.attributes == {"attempt": "2", "vip": "true"}


def test_a_bad_attribute_fails_the_attempt_saying_why() -> None:
    class SetsNonsense(Reactor):
        only = step(SetsBad)

    outcome, journal = run_in_memory(SetsNonsense)

    assert isinstance(outcome, Failed)
    assert outcome.error is not None
    assert outcome.error.exception_class.endswith("InvalidAttribute")
    assert "set_attribute('amount', ...): an attribute is a string" in outcome.error.message
    assert journal.attributes == {}


def test_undo_cannot_set_attributes() -> None:
    class UndoSets(Reactor):
        first = step(SetsInUndo)
        second = step(Explodes, wait_for=["first"])

    outcome, journal = run_in_memory(UndoSets)

    assert isinstance(outcome, Failed)
    assert outcome.error is not None
    failures = outcome.error.rollback_failures
    assert [f.step for f in failures] == ["first"]
    assert "set_attribute('refunded', ...) in the undo of step 'first'" in failures[0].message
    assert journal.attributes == {}


def element(item: int) -> int:
    from django_reactor import step_context

    step_context().set_attribute("item", item)
    return item


def test_a_map_element_cannot_set_attributes() -> None:
    from django_reactor.engine.elements import run_element

    class Maps(Reactor):
        each = map_over(arg.value([1, 2]), element, item=arg.element())

    spec = Maps.definition.by_name["each"]
    assert spec.map is not None
    done = run_element(spec.map.element_definition, {"item": 1})
    assert done.status == "failed"
    assert done.error is not None
    assert "of a map's element: an element is not a run of its own" in str(done.error["message"])


def test_the_memory_journal_keeps_the_attributes_a_batch_sets_and_removes() -> None:
    from django_reactor.engine.journal import JournalBatch

    journal = MemoryJournal()
    journal.commit(JournalBatch(attributes={"a": "1", "b": "2"}))
    journal.commit(JournalBatch(attributes={"a": None, "c": "3"}))
    assert journal.attributes == {"b": "2", "c": "3"}
