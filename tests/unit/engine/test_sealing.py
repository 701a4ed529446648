"""Secret values in stored JSON: where envelopes go, what a display shows, and which parts of
a reactor's values are secret (declared, or derived from what is)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import Reactor, Step, arg, compose, interrupt, step
from django_reactor.engine.redaction import ERASED, REDACTED, redact
from django_reactor.engine.sealing import envelope, payloads, seal_at
from django_reactor.engine.serialization import TAG, conceal, encode, readable
from django_reactor.exceptions import DefinitionError


def fake_seal(value: Any) -> dict[str, Any]:
    return {"token": f"sealed:{value!r}"}


def test_seal_at_replaces_each_secret_path_by_an_envelope_and_leaves_the_rest() -> None:
    stored = encode(
        {"email": "a@b.c", "card": "4242", "cards": [{"n": "1", "h": "x"}, {"n": "2", "h": "y"}]}
    )
    sealed = seal_at(stored, [("card",), ("cards", "*", "n"), ("missing",)], fake_seal)
    assert sealed == {
        "email": "a@b.c",
        "card": envelope({"token": "sealed:'4242'"}),
        "cards": [
            {"n": envelope({"token": "sealed:'1'"}), "h": "x"},
            {"n": envelope({"token": "sealed:'2'"}), "h": "y"},
        ],
    }
    assert stored["card"] == "4242"  # a copy: the value given is left as it is
    assert seal_at(sealed, [("card",)], fake_seal) == sealed  # sealed already: left
    assert seal_at("whole", [()], fake_seal) == envelope({"token": "sealed:'whole'"})
    assert seal_at([1, 2], [("1",)], fake_seal) == [1, envelope({"token": "sealed:2"})]
    assert [p["token"] for p in payloads(sealed)] == ["sealed:'4242'", "sealed:'1'", "sealed:'2'"]


def test_user_data_that_looks_like_an_envelope_is_stored_escaped() -> None:
    looks_like = {TAG: "secret", "v": {"token": "mine"}}
    stored = encode(looks_like)
    assert stored == {TAG: "dict", "v": looks_like}
    assert list(payloads(stored)) == []
    assert readable(stored) == looks_like  # read back as the dict it was, never redacted


def test_a_display_never_opens_an_envelope() -> None:
    stored = {"card": envelope({"key": "k1", "token": "t"}), "when": encode({"x": (1, 2)})}
    assert readable(stored) == {"card": REDACTED, "when": {"x": (1, 2)}}
    assert readable(stored, lambda payload: ERASED) == {"card": ERASED, "when": {"x": (1, 2)}}
    plain = {"a": [1, {"b": 2}]}
    assert conceal(plain) is plain  # nothing sealed: the value itself, not a copy
    # Redacting by path keeps an erased secret erased.
    assert redact({"card": ERASED, "pin": "1"}, [("card",), ("pin",)]) == {
        "card": ERASED,
        "pin": REDACTED,
    }


class Issue(Step):
    secret_result = ("api_key", "cards.*.number")

    def run(self) -> Any:
        return {}


class Echo(Step):
    def run(self, value: Any = None) -> Any:
        return value


class Approval(serializers.Serializer):
    ok = serializers.BooleanField()
    pin = serializers.CharField(write_only=True)


class Keys(Reactor):
    class Inputs(serializers.Serializer):
        customer = serializers.CharField()
        card = serializers.CharField(write_only=True)

    issue = step(Issue)
    whole = step(Echo, value=arg.value(1), secret_result=True)
    approval = interrupt(after=["issue"], payload=Approval)
    use = step(
        Echo,
        value=arg.result("issue", "api_key"),
    )
    pin = step(Echo, value=arg.result("approval", "pin"))
    plain = step(Echo, value=arg.result("issue", "key_id"))
    all_of_it = step(Echo, value=arg.result("whole", transform=str))

    class Meta:
        subject = arg.input("customer")


def test_secret_results_are_declared_derived_and_followed_into_arguments() -> None:
    definition = Keys.definition
    assert definition.step("issue").secret_result_paths == (
        ("api_key",),
        ("cards", "*", "number"),
    )
    assert definition.step("whole").secret_result_paths == ((),)
    assert definition.step("approval").secret_result_paths == (("pin",),)
    assert definition.step("use").secret_argument_paths == (("value",),)
    assert definition.step("pin").secret_argument_paths == (("value",),)
    assert definition.step("plain").secret_argument_paths == ()
    assert definition.step("all_of_it").secret_argument_paths == (("value",),)
    # No Meta.returns: the run's value holds every step's result under its name.
    assert ("issue", "api_key") in definition.value_secret_paths
    assert ("whole",) in definition.value_secret_paths
    assert definition.has_secrets
    assert definition.subject_of({"customer": "c-1", "card": "x"}) == "c-1"
    assert definition.subject_of({"card": "x"}) == ""  # no subject input: no subject


def test_a_composed_childs_secret_value_is_a_secret_of_its_step() -> None:
    class Child(Reactor):
        issue = step(Issue)

        class Meta:
            returns = "issue"

    class Parent(Reactor):
        child = compose(Child)
        read = step(Echo, value=arg.result("child", "api_key"))

    assert Parent.definition.step("child").secret_result_paths == (
        ("api_key",),
        ("cards", "*", "number"),
    )
    assert Parent.definition.step("read").secret_argument_paths == (("value",),)
    assert not Parent.definition.step("read").secret_result_paths


def test_a_reactor_without_secrets_has_none_to_seal() -> None:
    class Plain(Reactor):
        a = step(Echo, value=arg.value(1))

    assert not Plain.definition.has_secrets
    assert Plain.definition.value_secret_paths == ()
    assert Plain.definition.subject_of({}) == ""


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (3, "secret_result must be True, False, a dotted path"),
        (["a", 1], "secret_result must be True, False, a dotted path"),
    ],
)
def test_a_bad_secret_result_is_refused_when_the_reactor_is_defined(
    option: Any, message: str
) -> None:
    with pytest.raises(DefinitionError, match=message):

        class Bad(Reactor):
            a = step(Echo, secret_result=option)


def test_meta_subject_must_read_a_declared_input() -> None:
    with pytest.raises(DefinitionError, match=r"Meta.subject must be arg.input"):

        class Literal(Reactor):
            a = step(Echo)

            class Meta:
                subject = "customer"

    with pytest.raises(DefinitionError, match=r"reads input 'who', which .* does not declare"):

        class Unknown(Reactor):
            class Inputs(serializers.Serializer):
                customer = serializers.CharField()

            a = step(Echo)

            class Meta:
                subject = arg.input("who")
