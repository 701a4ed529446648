"""The constructs protocol: the executor core runs any construct, built in or registered.

A toy construct registered in a test gets its steps run, recorded, paused and rolled back by the
unchanged core, with the same trace a built-in construct gets.
"""

from __future__ import annotations

import ast
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_reactor import Lock, Reactor, Step, arg, async_step, compose, interrupt, step
from django_reactor.engine import constructs
from django_reactor.engine.constructs.base import (
    CONTINUE,
    Construct,
    RollbackAction,
    StepDone,
    StepFailed,
    StepResult,
    Stop,
    record_nested_rollback,
)
from django_reactor.engine.constructs.map import map_over
from django_reactor.engine.executor import Executor
from django_reactor.engine.journal import JournalBatch, StepWrite
from django_reactor.engine.outcomes import (
    Completed,
    ErrorKind,
    Failed,
    Outcome,
    Paused,
    Rescheduled,
    RollbackFailure,
)
from django_reactor.engine.spec import StepSpec
from django_reactor.states import EventKind, ExecutionStatus, StepStatus
from tests.helpers import ledger, run_in_memory, trace

ENGINE = Path(__file__).resolve().parents[3] / "django_reactor" / "engine"


class Toy(Step):
    """A step the toy construct runs instead of its body; ``mode`` says what it does."""

    mode = "double"

    def run(self, x: int = 0) -> Any:  # pragma: no cover - the toy construct never calls it
        ledger("body", self.context.step)
        return x


class ToyFails(Toy):
    mode = "fail_started"


class ToyRefuses(Toy):
    mode = "fail_unstarted"


class ToyWaits(Toy):
    mode = "wait"


class ToyParks(Toy):
    mode = "park"


class Doubling(Construct):
    """Doubles ``x``, fails, waits or parks by the step's ``mode``; rolls back by the ledger."""

    name = "toy"

    def claims(self, spec: StepSpec) -> bool:
        return issubclass(spec.impl, Toy)

    def run(
        self, run: Executor, spec: StepSpec, arguments: dict[str, Any], started_at: dt.datetime
    ) -> StepResult:
        mode = spec.impl.mode  # type: ignore[attr-defined]
        ledger(f"toy-{mode}", spec.name)
        if mode.startswith("fail"):
            error = run.step_error(spec, ErrorKind.STEP, "the toy failed", arguments=arguments)
            return StepFailed(error, started=mode == "fail_started", attempts=1)
        if mode == "wait":
            event = run.event(EventKind.INTERRUPT, step=spec.name)
            run.commit(
                JournalBatch(
                    events=[event],
                    step=StepWrite.of(spec, StepStatus.WAITING, event, 0, {}, started_at),
                )
            )
            run.state.waiting.add(spec.name)
            return CONTINUE
        if mode == "park":
            return Stop(Rescheduled(execution_id=run.execution_id, step=spec.name, reason="toy"))
        return StepDone(arguments["x"] * 2, attempts=1, duration_ms=0.0)

    def pause(self, run: Executor, waiting: list[str]) -> Outcome:
        ledger("toy-pause", ",".join(waiting))
        return Paused(execution_id=run.execution_id, results=dict(run.state.results))

    def rollback(
        self,
        run: Executor,
        spec: StepSpec,
        action: RollbackAction,
        first: Any,
        arguments: dict[str, Any],
    ) -> list[RollbackFailure]:
        ledger(f"toy-{action}", spec.name)
        return record_nested_rollback(run, spec, action, [], "", 0.0)


class Recording(Step):
    def run(self, **arguments: Any) -> Any:
        ledger("run", self.context.step)
        return self.context.step

    def undo(self, result: Any, **arguments: Any) -> None:
        ledger("undo", self.context.step)


class Boom(Recording):
    def run(self, **arguments: Any) -> Any:
        raise RuntimeError("boom")


@pytest.fixture
def toy() -> Iterator[Doubling]:
    construct = Doubling()
    constructs.register(construct)
    yield construct
    constructs.unregister(construct)


def test_a_registered_construct_runs_its_steps_and_its_result_flows(toy: Doubling) -> None:
    class Doubles(Reactor):
        double = step(Toy, x=arg.value(21))
        report = step(Recording, value=arg.result("double"))

        class Meta:
            returns = "double"

    outcome, journal = run_in_memory(Doubles)
    assert isinstance(outcome, Completed)
    assert outcome.value == 42
    assert ledger.calls == [("toy-double", "double"), ("run", "report")]
    assert trace(journal) == [("run", "double"), ("run", "report")]
    assert journal.steps["double"].status == StepStatus.COMPLETED
    assert journal.steps["double"].result == 42


def test_the_rollback_rule_reaches_a_registered_construct(toy: Doubling) -> None:
    class DoublesThenFails(Reactor):
        first = step(Recording)
        double = step(Toy, x=arg.value(1), wait_for=["first"])
        boom = step(Boom, wait_for=["double"])

    outcome, journal = run_in_memory(DoublesThenFails)
    assert isinstance(outcome, Failed)
    assert outcome.status == ExecutionStatus.FAILED
    # Completed steps are undone newest first, the toy's by the toy construct.
    assert ledger.calls == [
        ("run", "first"),
        ("toy-double", "double"),
        ("toy-undo", "double"),
        ("undo", "first"),
    ]
    assert trace(journal) == [
        ("run", "first"),
        ("run", "double"),
        ("fail", "boom"),
        ("compensate_skipped", "boom"),
        ("undo", "double"),
        ("undo", "first"),
    ]


@pytest.mark.parametrize(
    ("impl", "compensated"), [(ToyFails, True), (ToyRefuses, False)], ids=["started", "unstarted"]
)
def test_a_failed_construct_step_is_compensated_only_if_it_started(
    toy: Doubling, impl: type[Toy], compensated: bool
) -> None:
    class Fails(Reactor):
        first = step(Recording)
        toy_step = step(impl, x=arg.value(1), wait_for=["first"])

    outcome, journal = run_in_memory(Fails)
    assert isinstance(outcome, Failed)
    assert outcome.error is not None
    assert outcome.error.message == "the toy failed"
    expected = [("toy-compensate", "toy_step")] if compensated else []
    assert ledger.calls == [
        ("run", "first"),
        (f"toy-{impl.mode}", "toy_step"),
        *expected,
        ("undo", "first"),
    ]
    assert journal.steps["toy_step"].status == StepStatus.FAILED
    assert journal.steps["toy_step"].compensable is compensated


def test_a_waiting_construct_step_lets_the_others_run_then_pauses_the_run(toy: Doubling) -> None:
    class Waits(Reactor):
        wait = step(ToyWaits)
        other = step(Recording)
        after = step(Recording, wait_for=["wait"])

    outcome, journal = run_in_memory(Waits)
    assert isinstance(outcome, Paused)
    assert ledger.calls == [("toy-wait", "wait"), ("run", "other"), ("toy-pause", "wait")]
    assert "after" not in journal.steps


def test_a_construct_that_stops_the_run_returns_its_outcome(toy: Doubling) -> None:
    class Parks(Reactor):
        first = step(Recording)
        park = step(ToyParks, wait_for=["first"])
        after = step(Recording, wait_for=["park"])

    outcome, journal = run_in_memory(Parks)
    assert isinstance(outcome, Rescheduled)
    assert outcome.reason == "toy"
    assert ledger.calls == [("run", "first"), ("toy-park", "park")]
    assert trace(journal) == [("run", "first")]


def test_without_the_construct_the_step_is_a_plain_step() -> None:
    class Plain(Reactor):
        double = step(Toy, x=arg.value(21))

        class Meta:
            returns = "double"

    outcome, _journal = run_in_memory(Plain)
    assert isinstance(outcome, Completed)
    assert outcome.value == 21
    assert ledger.calls == [("body", "double")]


class Unit(Step):
    def run(self) -> Any:  # pragma: no cover - only its construct is looked up
        return None


class Child(Reactor):
    only = step(Recording)


def test_each_built_in_construct_claims_its_steps() -> None:
    class Everything(Reactor):
        plain = step(Recording)
        held = step(Recording, coordination=[Lock("k")])
        unit = async_step(Unit)
        child = compose(Child)
        each = map_over(arg.value([1, 2]), lambda item: item, item=arg.element())
        approval = interrupt()

    names = {spec.name: constructs.construct_for(spec).name for spec in Everything.definition.steps}
    assert names == {
        "plain": "step",
        "held": "coordination",
        "unit": "async_unit",
        "child": "compose",
        "each": "map",
        "approval": "interrupt",
    }


FORBIDDEN = (
    "django.db",
    "celery",
    "rest_framework",
    "django_reactor.models",
    "django_reactor.store",
)


def test_the_constructs_import_no_orm_celery_or_drf() -> None:
    # tests/test_code_quality.py checks the engine's own modules; this, its subpackage.
    package = ["django_reactor", "engine", "constructs"]
    offenders = []
    for path in (ENGINE / "constructs").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                names = [".".join([*base, node.module or ""])]
            else:
                continue
            offenders += [f"{path.name}: {n}" for n in names if n.startswith(FORBIDDEN)]
    assert offenders == []


def test_the_shape_stored_with_runs_names_the_same_classes_as_before_the_move() -> None:
    # A run resumes only if its stored shape matches; runs stored before the constructs
    # package named the interrupt's class by its old module.
    class Approves(Reactor):
        approval = interrupt()

    assert Approves.definition.shape["approval"]["impl"] == (
        "django_reactor.engine.interrupts.Interrupt"
    )
