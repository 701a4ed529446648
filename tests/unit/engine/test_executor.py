"""The executor on its own: order, outcomes, retries and the rollback rule, on a memory journal."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from django_reactor import Failure, Halt, Reactor, Retry, Skip, Step, Success, arg, step
from django_reactor.engine.outcomes import ErrorInfo, ErrorKind
from django_reactor.states import ExecutionStatus, RollbackStatus, StepStatus
from tests.helpers import ledger, run_in_memory, trace


class Recording(Step):
    """Runs, undoes and compensates by writing to the ledger; returns its own name."""

    def run(self, **arguments: Any) -> Any:
        ledger("run", self.context.step)
        return Success(self.context.step)

    def undo(self, result: Any, **arguments: Any) -> None:
        ledger("undo", self.context.step)

    def compensate(self, error: Any, **arguments: Any) -> None:
        ledger("compensate", self.context.step)


class Boom(Recording):
    def run(self, **arguments: Any) -> Any:
        ledger("run", self.context.step)
        raise RuntimeError("boom")


# ---------------------------------------------------------------------------- ordering


def test_steps_run_in_declaration_order_among_ready_steps() -> None:
    class Diamond(Reactor):
        a = step(Recording)
        b = step(Recording, x=arg.result("a"))
        c = step(Recording)
        d = step(Recording, x=arg.result("b"), y=arg.result("c"))

    outcome, journal = run_in_memory(Diamond)
    assert outcome.ok
    # b is ready as soon as a is done and is declared before c.
    assert ledger.calls == [("run", "a"), ("run", "b"), ("run", "c"), ("run", "d")]
    assert trace(journal) == [("run", "a"), ("run", "b"), ("run", "c"), ("run", "d")]


def test_wait_for_orders_without_data() -> None:
    class Waits(Reactor):
        second = step(Recording, wait_for=["first"])
        first = step(Recording)

    run_in_memory(Waits)
    assert ledger.calls == [("run", "first"), ("run", "second")]


def test_results_flow_through_paths_and_transforms() -> None:
    class Flow(Reactor):
        class Inputs(serializers.Serializer):
            order = serializers.DictField()

        @step(items=arg.input("order", "items"))
        def count(items: list[Any]) -> Any:
            return {"n": len(items), "first": items[0]}

        @step(
            n=arg.result("count", "n", transform=lambda n: n * 10),
            sku=arg.result("count", "first.sku"),
            label=arg.value("total"),
        )
        def total(n: int, sku: str, label: str) -> Any:
            return f"{label}:{n}:{sku}"

        class Meta:
            returns = "total"

    outcome, _ = run_in_memory(Flow, {"order": {"items": [{"sku": "A"}, {"sku": "B"}]}})
    assert outcome.value == "total:20:A"


def test_without_returns_the_value_is_every_result() -> None:
    class Two(Reactor):
        a = step(Recording)
        b = step(Recording)

    outcome, journal = run_in_memory(Two)
    assert outcome.value == {"a": "a", "b": "b"}
    assert journal.statuses[-1] == ExecutionStatus.COMPLETED


# ---------------------------------------------------------------------------- outcomes


def test_skip_passes_its_value_and_is_never_undone() -> None:
    class Skipping(Reactor):
        @step
        def maybe() -> Any:
            ledger("run", "maybe")
            return Skip("default")

        user = step(Recording, x=arg.result("maybe"))
        fails = step(Boom, x=arg.result("user"))

    outcome, journal = run_in_memory(Skipping)
    assert outcome.status == ExecutionStatus.FAILED
    assert trace(journal) == [
        ("skip", "maybe"),
        ("run", "user"),
        ("fail", "fails"),
        ("compensate", "fails"),
        ("undo", "user"),
    ]
    assert journal.steps["maybe"].status == StepStatus.SKIPPED
    assert journal.steps["maybe"].result == "default"


def test_halt_stops_cleanly_without_rollback() -> None:
    class Halting(Reactor):
        a = step(Recording)

        @step(wait_for=["a"])
        def check() -> Any:
            return Halt("customer on hold")

        after = step(Recording, wait_for=["check"])

    outcome, journal = run_in_memory(Halting)
    assert outcome.status == ExecutionStatus.HALTED
    assert outcome.reason == "customer on hold"
    assert outcome.step == "check"
    assert ledger.calls == [("run", "a")]
    assert trace(journal) == [("run", "a"), ("halt", "check")]
    assert journal.statuses == [ExecutionStatus.HALTED]


def test_plain_return_values_are_successes() -> None:
    class Plain(Reactor):
        @step
        def value() -> int:
            return 42

    outcome, _ = run_in_memory(Plain)
    assert outcome.value == {"value": 42}


# ---------------------------------------------------------------------------- rollback rule


def test_failure_compensates_the_failing_step_then_undoes_newest_first() -> None:
    class Saga(Reactor):
        a = step(Recording)
        b = step(Recording, x=arg.result("a"))
        c = step(Boom, x=arg.result("b"))

    outcome, journal = run_in_memory(Saga)
    assert outcome.status == ExecutionStatus.FAILED
    assert ledger.calls == [
        ("run", "a"),
        ("run", "b"),
        ("run", "c"),
        ("compensate", "c"),
        ("undo", "b"),
        ("undo", "a"),
    ]
    assert trace(journal) == [
        ("run", "a"),
        ("run", "b"),
        ("fail", "c"),
        ("compensate", "c"),
        ("undo", "b"),
        ("undo", "a"),
    ]
    error = outcome.error
    assert error.step == "c"
    assert error.exception_class == "RuntimeError"
    assert error.message == "boom"
    assert 'raise RuntimeError("boom")' in error.traceback
    assert error.rollback_failures == ()
    assert journal.statuses == [ExecutionStatus.ROLLING_BACK, ExecutionStatus.FAILED]


def test_undo_order_is_reverse_completion_order_across_branches() -> None:
    class Branches(Reactor):
        left = step(Recording)
        right = step(Recording)
        left2 = step(Recording, x=arg.result("left"))
        join = step(Boom, x=arg.result("left2"), y=arg.result("right"))

    run_in_memory(Branches)
    runs = [s for a, s in ledger.calls if a == "run" and s != "join"]
    undos = [s for a, s in ledger.calls if a == "undo"]
    assert runs == ["left", "right", "left2"]
    assert undos == list(reversed(runs))


def test_a_failing_undo_does_not_stop_the_rest_and_is_reported() -> None:
    class BadUndo(Recording):
        def undo(self, result: Any, **arguments: Any) -> None:
            ledger("undo", self.context.step)
            raise ValueError("refund API down")

    class FailingUndoReturn(Recording):
        def undo(self, result: Any, **arguments: Any) -> Any:
            ledger("undo", self.context.step)
            return Failure("still locked")

    class Saga(Reactor):
        a = step(Recording)
        b = step(BadUndo, wait_for=["a"])
        c = step(FailingUndoReturn, wait_for=["b"])
        d = step(Boom, wait_for=["c"])

    outcome, journal = run_in_memory(Saga)
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    undos = [a for a in ledger.calls if a[0] == "undo"]
    assert undos == [("undo", "c"), ("undo", "b"), ("undo", "a")]
    failures = outcome.error.rollback_failures
    assert [(f.step, f.action, f.exception_class) for f in failures] == [
        ("c", "undo", None),
        ("b", "undo", "ValueError"),
    ]
    assert failures[1].message == "refund API down"
    assert trace(journal)[-3:] == [("undo_failed", "c"), ("undo_failed", "b"), ("undo", "a")]
    assert journal.rollbacks["b"].status == RollbackStatus.FAILED
    assert journal.rollbacks["a"].status == RollbackStatus.UNDONE


def test_a_failing_compensate_is_reported_and_undo_continues() -> None:
    class BadCompensate(Boom):
        def compensate(self, error: Any, **arguments: Any) -> None:
            raise OSError("cleanup failed")

    class Saga(Reactor):
        a = step(Recording)
        b = step(BadCompensate, wait_for=["a"])

    outcome, journal = run_in_memory(Saga)
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    assert trace(journal) == [
        ("run", "a"),
        ("fail", "b"),
        ("compensate_failed", "b"),
        ("undo", "a"),
    ]
    assert outcome.error.rollback_failures[0].action == "compensate"


def test_steps_without_handlers_are_recorded_as_such() -> None:
    class Saga(Reactor):
        @step
        def a() -> int:
            return 1

        @step(wait_for=["a"])
        def b() -> int:
            raise RuntimeError("nope")

    _outcome, journal = run_in_memory(Saga)
    assert trace(journal) == [
        ("run", "a"),
        ("fail", "b"),
        ("compensate_skipped", "b"),
        ("undo_skipped", "a"),
    ]
    assert journal.rollbacks["a"].status == RollbackStatus.NO_HANDLER


def test_function_step_rollback_decorators() -> None:
    class Saga(Reactor):
        @step
        def reserve() -> dict[str, int]:
            return {"reservation": 7}

        @reserve.undo
        def release(result: dict[str, int]) -> None:
            ledger("undo", f"reserve:{result['reservation']}")

        @step(wait_for=["reserve"])
        def charge() -> None:
            raise RuntimeError("card declined")

        @charge.compensate
        def void(error: ErrorInfo) -> None:
            ledger("compensate", f"charge:{error.message}")

    _outcome, _journal = run_in_memory(Saga)
    assert ledger.calls == [("compensate", "charge:card declined"), ("undo", "reserve:7")]
    assert set(Saga.definition.by_name) == {"reserve", "charge"}


def test_argument_resolution_error_is_not_compensated_or_retried() -> None:
    class Saga(Reactor):
        a = step(Recording)

        @step(x=arg.result("a", "missing.key"), retry=Retry(attempts=3, delay=0))
        def b(x: Any) -> None:
            ledger("run", "b")

    outcome, journal = run_in_memory(Saga)
    assert outcome.error.kind == ErrorKind.ARGUMENT
    assert outcome.error.step == "b"
    assert "missing" in outcome.error.message
    assert ledger.calls == [("run", "a"), ("undo", "a")]
    assert trace(journal) == [("run", "a"), ("fail", "b"), ("undo", "a")]
    assert journal.steps["b"].compensable is False


def test_a_raising_transform_is_an_argument_error() -> None:
    class Saga(Reactor):
        a = step(Recording)

        @step(x=arg.result("a", transform=lambda v: 1 / 0))
        def b(x: Any) -> None:
            ledger("run", "b")

    outcome, _ = run_in_memory(Saga)
    assert outcome.error.kind == ErrorKind.ARGUMENT
    assert "ZeroDivisionError" in outcome.error.message


def test_an_unstorable_result_fails_the_step_and_compensates_it() -> None:
    class Unstorable(Recording):
        def run(self, **arguments: Any) -> Any:
            ledger("run", self.context.step)
            return object()

    class Saga(Reactor):
        a = step(Recording)
        b = step(Unstorable, wait_for=["a"])

    outcome, journal = run_in_memory(Saga)
    assert outcome.error.kind == ErrorKind.RESULT
    assert trace(journal) == [("run", "a"), ("fail", "b"), ("compensate", "b"), ("undo", "a")]


def test_base_exceptions_other_than_interruptions_are_failures() -> None:
    class Custom(BaseException):
        pass

    class Saga(Reactor):
        a = step(Recording)

        @step(wait_for=["a"])
        def b() -> None:
            raise Custom("odd")

    outcome, _ = run_in_memory(Saga)
    assert outcome.status == ExecutionStatus.FAILED
    assert ledger.calls[-1] == ("undo", "a")


# ---------------------------------------------------------------------------- retries


def test_retries_then_succeeds_without_compensation() -> None:
    attempts: list[int] = []

    class Flaky(Recording):
        def run(self, **arguments: Any) -> Any:
            attempts.append(self.context.attempt)
            if self.context.attempt < 3:
                raise TimeoutError("slow")
            return "ok"

    class Saga(Reactor):
        charge = step(Flaky, retry=Retry(attempts=5, backoff="exponential", delay=0.5))

    sleeps: list[float] = []
    outcome, journal = run_in_memory(Saga, sleeps=sleeps)
    assert outcome.ok
    assert attempts == [1, 2, 3]
    assert sleeps == [0.5, 1.0]
    assert trace(journal) == [("retry", "charge"), ("retry", "charge"), ("run", "charge")]
    assert [e.attempt for e in journal.events if e.step] == [1, 2, 3]
    assert journal.steps["charge"].attempts == 3
    assert ("compensate", "charge") not in ledger.calls


def test_compensation_runs_once_after_the_last_attempt() -> None:
    class Saga(Reactor):
        a = step(Recording)
        b = step(Boom, wait_for=["a"], retry=Retry(attempts=3, backoff="linear", delay=1))

    sleeps: list[float] = []
    outcome, _journal = run_in_memory(Saga, sleeps=sleeps)
    assert ledger.calls == [
        ("run", "a"),
        ("run", "b"),
        ("run", "b"),
        ("run", "b"),
        ("compensate", "b"),
        ("undo", "a"),
    ]
    assert sleeps == [1.0, 2.0]
    assert outcome.error.attempts == 3
    assert outcome.error.retryable is True


def test_non_retryable_failures_are_not_retried() -> None:
    class Declined(Recording):
        def run(self, **arguments: Any) -> Any:
            ledger("run", self.context.step)
            return Failure("card declined", retryable=False)

    class Saga(Reactor):
        pay = step(Declined, retry=Retry(attempts=5, delay=0))

    outcome, _ = run_in_memory(Saga)
    assert ledger.calls == [("run", "pay"), ("compensate", "pay")]
    assert outcome.error.retryable is False
    assert outcome.error.message == "card declined"


def test_exceptions_flagged_not_retryable_and_exceptions_outside_on_are_not_retried() -> None:
    class Permanent(Exception):
        retryable = False

    class RaisesPermanent(Recording):
        def run(self, **arguments: Any) -> Any:
            ledger("run", self.context.step)
            raise Permanent("no")

    class RaisesValue(Recording):
        def run(self, **arguments: Any) -> Any:
            ledger("run", self.context.step)
            raise ValueError("bad")

    class Saga(Reactor):
        a = step(RaisesPermanent, retry=Retry(attempts=3, delay=0))

    class Saga2(Reactor):
        b = step(RaisesValue, retry=Retry(attempts=3, delay=0, on=(TimeoutError,)))

    run_in_memory(Saga)
    run_in_memory(Saga2)
    assert [c for c in ledger.calls if c[0] == "run"] == [("run", "a"), ("run", "b")]


def test_step_class_retry_policy_applies_and_declaration_overrides_it() -> None:
    class Patient(Boom):
        retry = Retry(attempts=2, delay=0)

    class Saga(Reactor):
        default = step(Patient)

    class Saga2(Reactor):
        override = step(Patient, retry=Retry(attempts=4, delay=0))

    run_in_memory(Saga)
    run_in_memory(Saga2)
    runs = [s for a, s in ledger.calls if a == "run"]
    assert runs.count("default") == 2
    assert runs.count("override") == 4


# ---------------------------------------------------------------------------- contracts


class Contracted(Step):
    class Inputs(serializers.Serializer):
        quantity = serializers.IntegerField(min_value=1)
        note = serializers.CharField(default="none")

    def run(self, quantity: int, note: str) -> Any:
        ledger("run", f"contracted:{quantity}:{note}")
        return quantity

    def compensate(self, error: Any, **arguments: Any) -> None:
        ledger("compensate", "contracted")


def test_contract_validates_and_applies_defaults() -> None:
    class Saga(Reactor):
        c = step(Contracted, quantity=arg.value("3"))

    outcome, _ = run_in_memory(Saga)
    assert outcome.ok
    assert ledger.calls == [("run", "contracted:3:none")]


def test_contract_violation_is_not_retried_or_compensated() -> None:
    class Saga(Reactor):
        a = step(Recording)
        c = step(Contracted, quantity=arg.value(0), wait_for=["a"], retry=Retry(attempts=3))

    outcome, journal = run_in_memory(Saga)
    assert outcome.error.kind == ErrorKind.CONTRACT
    assert outcome.error.field_errors == {
        "quantity": ["Ensure this value is greater than or equal to 1."]
    }
    assert outcome.error.retryable is False
    assert ledger.calls == [("run", "a"), ("undo", "a")]
    assert trace(journal) == [("run", "a"), ("fail", "c"), ("undo", "a")]


# ---------------------------------------------------------------------------- secrets


def test_secret_inputs_are_redacted_in_the_failure() -> None:
    class Saga(Reactor):
        class Inputs(serializers.Serializer):
            card = serializers.CharField(write_only=True)
            amount = serializers.IntegerField()

        @step(card=arg.input("card"), amount=arg.input("amount"))
        def charge(card: str, amount: int) -> None:
            raise RuntimeError("declined")

    outcome, journal = run_in_memory(Saga, {"card": "4242-secret", "amount": 5})
    assert outcome.error.inputs == {"card": "[REDACTED]", "amount": 5}
    assert outcome.error.arguments == {"card": "[REDACTED]", "amount": 5}
    assert journal.steps["charge"].secret_arguments == [("card",)]
    # The stored arguments keep the real value: compensate needs it.
    assert journal.steps["charge"].arguments["card"] == "4242-secret"


# ---------------------------------------------------------------------------- interruption


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit])
def test_interruption_aborts_with_the_undo_stack_kept(interruption: type[BaseException]) -> None:
    class Saga(Reactor):
        a = step(Recording)

        @step(wait_for=["a"])
        def b() -> None:
            raise interruption()

    from django_reactor.engine.journal import MemoryJournal

    journal = MemoryJournal()
    with pytest.raises(interruption):
        run_in_memory(Saga, journal=journal)
    assert ledger.calls == [("run", "a")]  # nothing rolled back
    assert journal.statuses == [ExecutionStatus.ABORTED]
    assert trace(journal) == [("run", "a"), ("fail", "b")]
    assert journal.events[-1].kind == "abort"
    assert journal.steps["b"].compensable is True
    assert journal.failure["kind"] == ErrorKind.INTERRUPTED


def test_cancel_request_stops_after_the_current_step() -> None:
    from django_reactor.engine.journal import MemoryJournal

    journal = MemoryJournal()
    journal.cancel_requested = True

    class Saga(Reactor):
        a = step(Recording)
        b = step(Recording, wait_for=["a"])

    outcome, _ = run_in_memory(Saga, journal=journal)
    assert outcome.status == ExecutionStatus.CANCELLED
    assert ledger.calls == [("run", "a")]


def test_pause_request_suspends_after_the_current_step_and_a_cancel_wins() -> None:
    from django_reactor.engine.journal import MemoryJournal

    class Saga(Reactor):
        a = step(Recording)
        b = step(Recording, wait_for=["a"])

    journal = MemoryJournal()
    journal.pause_requested = "hold on"
    outcome, _ = run_in_memory(Saga, journal=journal)
    assert (outcome.status, outcome.reason) == (ExecutionStatus.SUSPENDED, "hold on")
    assert ledger.calls == [("run", "a")]
    assert journal.statuses == [ExecutionStatus.SUSPENDED]
    assert journal.current_step == "b"  # where it goes on when unpaused

    ledger.clear()
    journal = MemoryJournal()
    journal.pause_requested = "hold on"
    journal.cancel_requested = "no, stop"
    outcome, _ = run_in_memory(Saga, journal=journal)
    assert outcome.status == ExecutionStatus.CANCELLED


def test_step_context_has_a_stable_idempotency_key_per_action() -> None:
    keys: list[str] = []

    class Keyed(Step):
        def run(self) -> None:
            keys.append(self.context.idempotency_key)
            if self.context.attempt == 1:
                raise TimeoutError

    class Saga(Reactor):
        a = step(Keyed, retry=Retry(attempts=2, delay=0))

    run_in_memory(Saga)
    assert len(keys) == 2
    assert keys[0] == keys[1]


# ---------------------------------------------------------------------------- review fixes


def test_an_interruption_during_the_retry_pause_aborts_the_run() -> None:
    from django_reactor.engine.executor import Executor, RunState
    from django_reactor.engine.journal import MemoryJournal

    class Saga(Reactor):
        a = step(Recording)
        b = step(Boom, wait_for=["a"], retry=Retry(attempts=3, delay=5))

    def interrupted_sleep(seconds: float) -> None:
        raise KeyboardInterrupt

    journal = MemoryJournal()
    executor = Executor(
        Saga.definition, journal, inputs={}, state=RunState(), sleep=interrupted_sleep
    )
    with pytest.raises(KeyboardInterrupt):
        executor.run()
    assert journal.statuses == [ExecutionStatus.ABORTED]
    assert journal.steps["b"].compensable is True
    assert trace(journal) == [("run", "a"), ("retry", "b"), ("fail", "b")]


def test_retry_delays_are_capped_and_the_trace_records_the_real_pause() -> None:
    from django_reactor.engine.context import RunPolicy
    from django_reactor.engine.executor import Executor, RunState
    from django_reactor.engine.journal import MemoryJournal

    class Saga(Reactor):
        b = step(Boom, retry=Retry(attempts=2, delay=600, max_delay=None))

    sleeps: list[float] = []
    journal = MemoryJournal()
    Executor(
        Saga.definition,
        journal,
        inputs={},
        state=RunState(),
        sleep=sleeps.append,
        policy=RunPolicy(max_retry_delay=2.5),
    ).run()
    assert sleeps == [2.5]
    assert journal.events[0].data["delay"] == 2.5


def test_function_steps_reach_their_context_and_nothing_else_does() -> None:
    from django_reactor import step_context
    from django_reactor.exceptions import ReactorError

    seen: list[tuple[str, int, str]] = []

    class Saga(Reactor):
        @step
        def charge() -> None:
            context = step_context()
            seen.append((context.step, context.attempt, context.action))
            raise RuntimeError("declined")

        @charge.compensate
        def void(error: ErrorInfo) -> None:
            context = step_context()
            seen.append((context.step, context.attempt, context.action))
            assert context.run_idempotency_key != context.idempotency_key

    run_in_memory(Saga)
    assert seen == [("charge", 1, "run"), ("charge", 1, "compensate")]
    with pytest.raises(ReactorError, match="only available inside a step"):
        step_context()


def test_compensate_receives_the_error_info_and_the_run_key() -> None:
    received: list[Any] = []

    class Charge(Step):
        def run(self) -> None:
            received.append(self.context.idempotency_key)
            raise TimeoutError("gateway timed out")

        def compensate(self, error: ErrorInfo) -> None:
            received.append(
                (error.exception_class, error.message, self.context.run_idempotency_key)
            )

    class Saga(Reactor):
        charge = step(Charge)

    run_in_memory(Saga)
    run_key = received[0]
    assert received[1] == ("TimeoutError", "gateway timed out", run_key)


def test_same_name_rollback_decorator_keeps_the_step() -> None:
    class Saga(Reactor):
        @step
        def reserve() -> int:
            return 7

        @reserve.undo
        def reserve(result: int) -> None:
            ledger("undo", f"reserve:{result}")

        @step(wait_for=["reserve"])
        def fail() -> None:
            raise RuntimeError("no")

    assert [s.name for s in Saga.definition.steps] == ["reserve", "fail"]
    run_in_memory(Saga)
    assert ("undo", "reserve:7") in ledger.calls


def test_undo_receives_the_contracts_validated_arguments() -> None:
    seen: list[Any] = []

    class Typed(Step):
        class Inputs(serializers.Serializer):
            quantity = serializers.IntegerField()

        def run(self, quantity: int) -> int:
            return quantity

        def undo(self, result: int, quantity: int) -> None:
            seen.append(quantity)

    class Saga(Reactor):
        t = step(Typed, quantity=arg.value("3"))
        boom = step(Boom, wait_for=["t"])

    _, journal = run_in_memory(Saga)
    assert seen == [3]
    assert journal.steps["t"].arguments == {"quantity": 3}


def test_wiring_a_non_contract_argument_is_rejected_even_with_var_kwargs() -> None:
    from django_reactor.exceptions import DefinitionError

    class Loose(Step):
        class Inputs(serializers.Serializer):
            quantity = serializers.IntegerField()

        def run(self, **arguments: Any) -> None:
            return None

    with pytest.raises(DefinitionError, match="'extra' is not a field of"):

        class Saga(Reactor):
            t = step(Loose, quantity=arg.value(1), extra=arg.value(2))
