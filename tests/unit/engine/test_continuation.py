"""Continue-as-new in the engine: when a step may end its run by continuing it as new, what is
recorded, and what the successor it asks for holds (on a memory journal)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import Completed, ContinueAsNew, Failed, Reactor, Step, arg, step
from django_reactor.engine.context import RunPolicy
from django_reactor.engine.continuation import successor_key
from django_reactor.engine.outcomes import ErrorKind
from django_reactor.states import EventKind, ExecutionStatus, StepStatus
from tests.helpers import ledger, run_in_memory

#: The policy of a run of its own kept in the database (as ``runtime.executors`` sets it).
TOP_LEVEL = RunPolicy(continues=True)


class Renew(Step):
    """Renews once, then asks for the next round (or stops after the last)."""

    def run(self, month: int, last: int) -> Any:
        ledger("run", self.context.step)
        if month >= last:
            return {"renewed": month}
        return ContinueAsNew({"month": month + 1, "last": last})

    def undo(self, result: Any, **arguments: Any) -> None:
        ledger("undo", self.context.step)


class Charge(Step):
    def run(self, month: int) -> Any:
        ledger("run", self.context.step)
        return {"charged": month}

    def undo(self, result: Any, **arguments: Any) -> None:
        ledger("undo", self.context.step)


class Months(serializers.Serializer[dict[str, Any]]):
    month = serializers.IntegerField(min_value=1)
    last = serializers.IntegerField(min_value=1)


class Subscription(Reactor):
    class Inputs(Months):
        pass

    charge = step(Charge, month=arg.input("month"))
    renew = step(Renew, month=arg.input("month"), last=arg.input("last"), wait_for=["charge"])


def test_the_last_step_continues_the_run_as_new() -> None:
    outcome, journal = run_in_memory(Subscription, {"month": 1, "last": 3}, policy=TOP_LEVEL)
    assert isinstance(outcome, Completed)
    [successor] = journal.successors
    assert outcome.continued_as == successor.execution_id
    assert successor.inputs == {"month": 2, "last": 3}
    assert successor.first_step == "charge"
    assert successor.definition_hash == Subscription.definition.definition_hash
    # The step is recorded completed with a marker naming the successor.
    record = journal.steps["renew"]
    assert record.status == StepStatus.COMPLETED
    assert record.result == {"continued_as_new": True, "continued_as": str(outcome.continued_as)}
    # run, run, continue, complete: the continue entry names the successor, before completion.
    kinds = [(e.kind, e.step) for e in journal.events]
    assert kinds == [
        (EventKind.RUN, "charge"),
        (EventKind.RUN, "renew"),
        (EventKind.CONTINUE, ""),
        (EventKind.COMPLETE, ""),
    ]
    continued = journal.events[2]
    assert continued.data == {"continued_as": str(outcome.continued_as), "step": "renew"}
    assert journal.statuses[-1] == ExecutionStatus.COMPLETED
    assert ledger.calls == [("run", "charge"), ("run", "renew")]


def test_a_run_that_returns_a_plain_value_has_no_successor() -> None:
    outcome, journal = run_in_memory(Subscription, {"month": 3, "last": 3}, policy=TOP_LEVEL)
    assert isinstance(outcome, Completed)
    assert outcome.continued_as is None
    assert journal.successors == []
    assert EventKind.CONTINUE not in [e.kind for e in journal.events]


def test_inputs_the_reactor_refuses_fail_the_step_naming_the_fields() -> None:
    class Refused(Step):
        def run(self) -> Any:
            return ContinueAsNew({"month": 0})

    class BadRenewal(Reactor):
        class Inputs(Months):
            pass

        charge = step(Charge, month=arg.input("month"))
        renew = step(Refused, wait_for=["charge"])

    outcome, journal = run_in_memory(BadRenewal, {"month": 1, "last": 2}, policy=TOP_LEVEL)
    assert isinstance(outcome, Failed)
    error = outcome.error
    assert (error.kind, error.step, error.retryable) == (ErrorKind.CONTINUATION, "renew", False)
    assert "BadRenewal.Inputs refuses" in error.message
    assert "month:" in error.message
    assert "last:" in error.message
    assert set(error.field_errors) == {"month", "last"}
    assert journal.successors == []
    # A failed step like any other: what completed is undone.
    assert ledger.calls == [("run", "charge"), ("undo", "charge")]


def test_continue_as_new_from_a_step_that_is_not_the_last_fails_it() -> None:
    class Early(Reactor):
        class Inputs(Months):
            pass

        renew = step(Renew, month=arg.input("month"), last=arg.input("last"))
        charge = step(Charge, month=arg.input("month"))

    outcome, journal = run_in_memory(Early, {"month": 1, "last": 3}, policy=TOP_LEVEL)
    assert isinstance(outcome, Failed)
    assert outcome.error.kind == ErrorKind.CONTINUATION
    assert "steps charge had not ended" in outcome.error.message
    assert "wait_for=" in outcome.error.message
    assert journal.successors == []
    assert ledger.calls == [("run", "renew")]  # charge never ran; renew had no undo to run


def test_a_run_that_is_part_of_another_cannot_continue() -> None:
    outcome, journal = run_in_memory(Subscription, {"month": 1, "last": 3})
    assert isinstance(outcome, Failed)
    assert outcome.error.kind == ErrorKind.CONTINUATION
    assert "part of another" in outcome.error.message
    assert journal.successors == []


@pytest.mark.parametrize(
    ("key", "generation", "expected"),
    [
        (None, 0, None),
        (None, 7, None),
        ("sub-42", 0, "sub-42~continued~1"),
        ("sub-42~continued~1", 1, "sub-42~continued~2"),
        ("sub-42~continued~999", 999, "sub-42~continued~1000"),
        # A key that happens to end like a derived one is only stripped past the first run.
        ("x~continued~3", 0, "x~continued~3~continued~1"),
    ],
)
def test_the_successor_key_is_derived_from_the_first_runs_key(
    key: str | None, generation: int, expected: str | None
) -> None:
    assert successor_key(key, generation) == expected


def test_a_key_too_long_to_derive_from_is_replaced_by_its_digest() -> None:
    long = "k" * 250
    first = successor_key(long, 0)
    assert first is not None
    assert first.startswith("sha256:")
    assert first.endswith("~continued~1")
    assert len(first) <= 255
    # The lineage goes on from the digest.
    assert successor_key(first, 1) == first.removesuffix("~continued~1") + "~continued~2"
