"""Reactor declarations: the planner's checks at class definition, and wiring."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import Reactor, Retry, Step, arg, interrupt, step
from django_reactor.exceptions import DefinitionError, DependencyCycleError


class Echo(Step):
    def run(self, value: Any = None) -> Any:
        return value


class NeedsOrder(Step):
    def run(self, order_id: int) -> Any:
        return order_id


def test_cycle_is_rejected_naming_the_reactor_and_the_cycle() -> None:
    with pytest.raises(DependencyCycleError, match=r"Loop has a dependency cycle: a -> b -> a"):

        class Loop(Reactor):
            a = step(Echo, value=arg.result("b"))
            b = step(Echo, value=arg.result("a"))


def test_self_dependency_is_rejected() -> None:
    with pytest.raises(DependencyCycleError, match=r"Selfish.a depends on itself"):

        class Selfish(Reactor):
            a = step(Echo, wait_for=["a"])


def test_unknown_step_in_result_and_wait_for() -> None:
    with pytest.raises(DefinitionError, match=r"Typo.b reads the result of step 'aa'"):

        class Typo(Reactor):
            a = step(Echo)
            b = step(Echo, value=arg.result("aa"))

    with pytest.raises(DefinitionError, match=r"Typo2.b waits for step 'nope'"):

        class Typo2(Reactor):
            b = step(Echo, wait_for=["nope"])


def test_unknown_input_is_rejected() -> None:
    with pytest.raises(DefinitionError, match=r"reads input 'ordr'.*inputs: order_id"):

        class BadInput(Reactor):
            class Inputs(serializers.Serializer):
                order_id = serializers.IntegerField()

            a = step(Echo, value=arg.input("ordr"))


def test_unwired_required_argument_is_rejected_with_advice() -> None:
    with pytest.raises(DefinitionError, match=r"Unwired.a: NeedsOrder needs argument 'order_id'"):

        class Unwired(Reactor):
            a = step(NeedsOrder)


def test_required_argument_is_wired_from_a_same_named_input() -> None:
    class Wired(Reactor):
        class Inputs(serializers.Serializer):
            order_id = serializers.IntegerField()

        a = step(NeedsOrder)

    template = Wired.definition.step("a").arguments["order_id"]
    assert template.describe() == "input 'order_id'"


def test_wiring_an_argument_the_step_does_not_take() -> None:
    with pytest.raises(DefinitionError, match=r"NeedsOrder.run\(\) takes no argument 'amount'"):

        class Extra(Reactor):
            a = step(NeedsOrder, order_id=arg.value(1), amount=arg.value(2))


def test_literal_wiring_must_be_wrapped() -> None:
    with pytest.raises(DefinitionError, match=r"wrap literals as arg.value\(5\)"):

        class Literal(Reactor):
            a = step(Echo, value=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 0}, "must be at least 1"),
        ({"backoff": "random"}, "must be one of fixed, linear, exponential"),
        ({"delay": -1}, r"Retry\(delay=...\) cannot be negative"),
        ({"jitter": 2}, "must be between 0 and 1"),
        ({"on": (str,)}, "must be exception classes"),
    ],
)
def test_bad_retry_options(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        Retry(**kwargs)


def test_bad_meta_options() -> None:
    with pytest.raises(DefinitionError, match=r"Meta has unknown option\(s\) timeout"):

        class BadMeta(Reactor):
            a = step(Echo)

            class Meta:
                timeout = 3

    with pytest.raises(DefinitionError, match=r"Meta.returns names 'z'"):

        class BadReturns(Reactor):
            a = step(Echo)

            class Meta:
                returns = "z"


def test_step_rejects_non_steps() -> None:
    with pytest.raises(DefinitionError, match=r"make it subclass django_reactor\.Step"):
        step(dict)
    with pytest.raises(DefinitionError, match="retry= must be a Retry"):
        step(Echo, retry=3)
    with pytest.raises(DefinitionError, match="Inputs must be a DRF serializer"):

        class BadInputs(Reactor):
            Inputs = dict
            a = step(Echo)


def test_contract_fields_are_checked_at_definition() -> None:
    class Contracted(Step):
        class Inputs(serializers.Serializer):
            quantity = serializers.IntegerField()

        def run(self, quantity: int) -> int:
            return quantity

    with pytest.raises(DefinitionError, match=r"'qty' is not a field of .*Contracted.Inputs"):

        class Bad(Reactor):
            a = step(Contracted, qty=arg.value(1))

    with pytest.raises(DefinitionError, match="needs argument 'quantity'"):

        class Missing(Reactor):
            a = step(Contracted)


def test_subclasses_inherit_and_override_steps() -> None:
    class Base(Reactor):
        a = step(Echo)
        b = step(Echo, value=arg.result("a"))

        class Meta:
            abstract = True

    class Child(Base):
        b = step(Echo, value=arg.value("replaced"))
        c = step(Echo)

    assert [s.name for s in Child.definition.steps] == ["a", "b", "c"]
    assert Child.definition.step("b").depends_on == frozenset()


def test_definition_hash_tracks_the_shape() -> None:
    class One(Reactor):
        a = step(Echo)

    class Same(Reactor):
        a = step(Echo)

    class Other(Reactor):
        a = step(Echo)
        b = step(Echo, value=arg.result("a"))

    assert One.definition.definition_hash == Same.definition.definition_hash
    assert One.definition.definition_hash != Other.definition.definition_hash


def test_secret_paths_follow_inputs_into_arguments() -> None:
    class Secretive(Reactor):
        class Inputs(serializers.Serializer):
            class Card(serializers.Serializer):
                number = serializers.CharField(write_only=True)
                holder = serializers.CharField()

            card = Card()
            token = serializers.CharField(write_only=True)

        whole = step(Echo, value=arg.input("card"))
        part = step(Echo, value=arg.input("card", "number"))
        shown = step(Echo, value=arg.input("card", "holder"))
        transformed = step(Echo, value=arg.input("token", transform=str.upper))

    d = Secretive.definition
    assert set(d.input_secret_paths) == {("card", "number"), ("token",)}
    assert d.step("whole").argument_secret_paths() == [("value", "number")]
    assert d.step("part").argument_secret_paths() == [("value",)]
    assert d.step("shown").argument_secret_paths() == []
    assert d.step("transformed").argument_secret_paths() == [("value",)]


def test_a_rollback_function_named_like_the_step_attribute_keeps_the_step() -> None:
    def book() -> int:
        return 1

    class Saga(Reactor):
        reserve = step(book)

        @reserve.undo
        def reserve(result: int) -> None:
            pass

    assert [s.name for s in Saga.definition.steps] == ["reserve"]
    assert Saga.definition.step("reserve").has_undo


def test_rollback_decorators_on_class_steps_are_refused_by_name() -> None:
    from django_reactor.exceptions import DefinitionError

    with pytest.raises(DefinitionError, match=r"@Echo.undo only works on function steps"):
        step(Echo).undo(lambda result: None)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("some", 'must be "all"'),
        ({"after": "a", "before": "b"}, "exactly one hand-off point"),
        ({"during": "a"}, 'must be "all"'),
        ({"after": "zz"}, "hands off after 'zz', which is not a step"),
    ],
)
def test_background_option_is_checked(option: Any, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        type(
            "Bg",
            (Reactor,),
            {
                "__module__": __name__,
                "a": step(Echo),
                "b": step(Echo),
                "Meta": type("Meta", (), {"background": option}),
            },
        )


def test_an_interrupt_is_no_point_to_hand_off_after() -> None:
    """The run pauses at an interrupt and its deliverer runs the rest: nothing is left to hand
    off after it. Handing off before it is a point like any other."""
    with pytest.raises(DefinitionError) as refused:

        class AfterApproval(Reactor):
            approval = interrupt()
            ship = step(Echo, wait_for=["approval"])

            class Meta:
                background = {"after": "approval"}

    assert str(refused.value).endswith(
        "AfterApproval.Meta.background hands off after 'approval', an interrupt: the run "
        "pauses there and the rest runs where its payload is delivered, so nothing is handed "
        'off. Use interrupt(resume="background") to have a worker run the rest, or '
        "{\"before\": 'approval'} to hand off before it"
    )

    class BeforeApproval(Reactor):
        approval = interrupt()
        ship = step(Echo, wait_for=["approval"])

        class Meta:
            background = {"before": "approval"}

    assert BeforeApproval.definition.background.mode == "before"


def test_background_points_are_recorded() -> None:
    class After(Reactor):
        a = step(Echo)
        b = step(Echo, wait_for=["a"])

        class Meta:
            background = {"after": "a"}

    assert (After.definition.background.mode, After.definition.background.step) == ("after", "a")


def test_stored_shapes_keep_the_names_runs_recorded_before_the_constructs_moved() -> None:
    """An interrupt's step class is recorded as ``django_reactor.engine.interrupts.Interrupt``
    (the module it was declared in before ``engine/constructs/``): runs paused under that
    shape resume under today's definition, whose shape names it the same way."""
    from django_reactor import sleep

    class Moved(Reactor):
        first = step(Echo)
        approval = interrupt(after=["first"])
        pause = sleep(5, after=["approval"])

    shape = Moved.definition.shape
    assert shape["approval"]["impl"] == "django_reactor.engine.interrupts.Interrupt"
    assert shape["pause"]["impl"] == "django_reactor.engine.constructs.sleep.SleepFor"
    stored = {
        "first": shape["first"],
        "approval": {"impl": "django_reactor.engine.interrupts.Interrupt", "depends_on": ["first"]},
    }
    assert Moved.definition.incompatibilities(stored, {"first", "approval"}) == []
