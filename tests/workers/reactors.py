"""Reactors the worker tests run on real Celery workers.

Every step records that its body started (``BodyRun``) and its external effect once per
idempotency key (``Effect``), so tests can tell re-runs (allowed for a step in flight) from
duplicated effects (never allowed).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django_reactor import (
    Failed,
    Reactor,
    Retry,
    Step,
    Success,
    arg,
    async_reactor,
    async_step,
    compose,
    faults,
    step,
)
from testproject.example.models import BodyRun, Effect


def effect(key: str, execution_id: Any, name: str) -> None:
    Effect.objects.get_or_create(key=key, defaults={"execution_id": execution_id, "step": name})


class Effectful(Step):
    """Records its body run, then its effect (once per key), then returns its name."""

    def run(self, **arguments: Any) -> Any:
        context = self.context
        BodyRun.objects.create(
            execution_id=context.execution_id, step=context.step, pid=os.getpid()
        )
        effect(context.idempotency_key, context.execution_id, context.step)
        faults.point("after_effect", step=context.step)
        if Effect.objects.filter(step=f"slow-{context.step}").exists():
            time.sleep(2)  # the step's own work, long enough to be in it when the test acts
        if context.step in FAILING:
            raise RuntimeError(f"{context.step} failed")
        return Success({"step": context.step})

    def undo(self, result: Any, **arguments: Any) -> None:
        context = self.context
        BodyRun.objects.create(
            execution_id=context.execution_id, step=f"undo:{context.step}", pid=os.getpid()
        )
        effect(context.idempotency_key, context.execution_id, f"undo:{context.step}")

    def compensate(self, error: Any, **arguments: Any) -> None:
        context = self.context
        effect(context.idempotency_key, context.execution_id, f"compensate:{context.step}")


FAILING = {"f4"}


class Five(Reactor):
    """Five steps in a chain, all in the background."""

    s1 = step(Effectful)
    s2 = step(Effectful, wait_for=["s1"])
    s3 = step(Effectful, wait_for=["s2"])
    s4 = step(Effectful, wait_for=["s3"])
    s5 = step(Effectful, wait_for=["s4"])

    class Meta:
        background = "all"


class FailsAtFour(Reactor):
    """Three steps, then a failing fourth: the rollback undoes three steps in a worker."""

    f1 = step(Effectful)
    f2 = step(Effectful, wait_for=["f1"])
    f3 = step(Effectful, wait_for=["f2"])
    f4 = step(Effectful, wait_for=["f3"])

    class Meta:
        background = "all"


class Flaky(Step):
    """Fails its first two attempts; the worker reschedules it instead of sleeping."""

    def run(self) -> Any:
        BodyRun.objects.create(
            execution_id=self.context.execution_id, step="flaky", pid=os.getpid()
        )
        if self.context.attempt < 3:
            raise TimeoutError(f"attempt {self.context.attempt} timed out")
        return "third time lucky"


class Retrying(Reactor):
    first = step(Effectful)
    flaky = step(Flaky, wait_for=["first"], retry=Retry(attempts=3, backoff="fixed", delay=0.3))

    class Meta:
        background = "all"
        returns = "flaky"


class HandsOffAfterFirst(Reactor):
    """Runs ``h1`` in the caller, the rest in a worker."""

    h1 = step(Effectful)
    h2 = step(Effectful, wait_for=["h1"])
    h3 = step(Effectful, wait_for=["h2"])

    class Meta:
        background = {"after": "h1"}


class HandsOffBeforeCharge(Reactor):
    """Runs ``b1`` in the caller; ``charge`` and what follows run in a worker."""

    b1 = step(Effectful)
    charge = step(Effectful, wait_for=["b1"])
    b3 = step(Effectful, wait_for=["charge"])

    class Meta:
        background = {"before": "charge"}


class ChildThree(Reactor):
    """Composed by ``WithChild``."""

    c1 = step(Effectful)
    c2 = step(Effectful, wait_for=["c1"])
    c3 = step(Effectful, wait_for=["c2"])


class WithChild(Reactor):
    p1 = step(Effectful)
    child = compose(ChildThree, wait_for=["p1"])
    p2 = step(Effectful, wait_for=["child"])

    class Meta:
        background = "all"


class Doubler(Step):
    """An async unit: doubles ``n`` (or fails, when the test says so) and compensates once."""

    def run(self, n: int) -> int:
        context = self.context
        BodyRun.objects.create(execution_id=context.execution_id, step="double", pid=os.getpid())
        effect(context.idempotency_key, context.execution_id, "double")
        if Effect.objects.filter(step="make-unit-fail").exists():
            raise ValueError("the unit failed")
        return n * 2

    def compensate(self, error: Any, n: int) -> None:
        effect(self.context.idempotency_key, self.context.execution_id, "compensate:double")


class WithUnit(Reactor):
    first = step(Effectful)
    unit = async_step(Doubler, n=arg.value(21), wait_for=["first"])
    sibling = step(Effectful, wait_for=["first"])

    @step(doubled=arg.result("unit"), wait_for=["sibling"])
    def reader(doubled: Any) -> Any:
        if isinstance(doubled, Failed):
            return {"unit_failed": doubled.error.message}
        return {"doubled": doubled}

    class Meta:
        background = "all"
        returns = "reader"


class InlineWithUnit(Reactor):
    """Runs in the caller; only the unit goes to a worker, and the reader waits for it."""

    unit = async_step(Doubler, n=arg.value(5))

    @step(doubled=arg.result("unit"))
    def reader(doubled: Any) -> Any:
        return doubled

    class Meta:
        returns = "reader"


class WithAsyncChild(Reactor):
    start = step(Effectful)
    child = async_reactor(ChildThree, wait_for=["start"])

    @step(result=arg.result("child"))
    def after(result: Any) -> Any:
        return result

    class Meta:
        background = "all"
        returns = "after"


class FlakyChild(Reactor):
    """A composed child whose second step needs three attempts."""

    k1 = step(Effectful)
    flaky = step(Flaky, wait_for=["k1"], retry=Retry(attempts=3, backoff="fixed", delay=0.3))


class ParentOfFlaky(Reactor):
    before = step(Effectful)
    child = compose(FlakyChild, wait_for=["before"])
    after = step(Effectful, wait_for=["child"])

    class Meta:
        background = "all"


class ChildReadingUnit(Reactor):
    unit = async_step(Doubler, n=arg.value(4))

    @step(doubled=arg.result("unit"))
    def read(doubled: Any) -> Any:
        return doubled


class ParentOfReader(Reactor):
    child = compose(ChildReadingUnit)

    class Meta:
        background = "all"
        returns = "child"
