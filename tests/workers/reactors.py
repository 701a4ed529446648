"""Reactors the worker tests run on real Celery workers.

Every step records that its body started (``BodyRun``) and its external effect once per
idempotency key (``Effect``), so tests can tell re-runs (allowed for a step in flight) from
duplicated effects (never allowed).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from decimal import Decimal
from typing import Any

from rest_framework import serializers

from django_reactor import (
    Batch,
    Concurrency,
    ContinueAsNew,
    Debounce,
    Failed,
    Reactor,
    Retry,
    Step,
    Success,
    Throttle,
    arg,
    async_reactor,
    async_step,
    compose,
    faults,
    interrupt,
    map_over,
    on_event,
    sleep,
    step,
    step_context,
)
from testproject.example.models import Account, BodyRun, Effect
from testproject.example.reactors import move


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


class One(Reactor):
    """One step that does nothing, in the background: a backlog's unit of work."""

    @step()
    def only() -> Any:
        return 1

    class Meta:
        background = "all"


class KeyedWork(Reactor):
    """Two steps per run, at most two runs in flight per tenant (the others queue)."""

    class Inputs(serializers.Serializer):
        tenant = serializers.CharField()
        n = serializers.IntegerField()

    first = step(Effectful)
    second = step(Effectful, wait_for=["first"])

    class Meta:
        background = "all"
        concurrency = Concurrency(key="{tenant}", limit=2)


class ThrottledWork(Reactor):
    """One step; at most two runs per tenant start within any second (the others wait)."""

    class Inputs(serializers.Serializer):
        tenant = serializers.CharField()

    only = step(Effectful)

    class Meta:
        background = "all"
        throttle = Throttle(key="{tenant}", limit=2, period=1.0)


class DebouncedWork(Reactor):
    """Starts of a user within three seconds of each other collapse into one run."""

    class Inputs(serializers.Serializer):
        user = serializers.CharField()
        n = serializers.IntegerField()

    @step(n=arg.input("n"))
    def only(n: int) -> int:
        return n

    class Meta:
        background = "all"
        returns = "only"
        debounce = Debounce(key="{user}", period=3.0)


class BatchedWork(Reactor):
    """Each ``work.item`` event is an item of its tenant's batch (at most ten, or a second
    after the first); the run returns the items' numbers."""

    class Inputs(serializers.Serializer):
        tenant = serializers.CharField()
        n = serializers.IntegerField()

    @step(items=arg.input("items"))
    def only(items: list[dict[str, Any]]) -> list[int]:
        return [item["n"] for item in items]

    class Meta:
        returns = "only"
        triggers = [on_event("work.item")]
        batch = Batch(key="{tenant}", max_size=10, max_wait=1.0)


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


class Approval(serializers.Serializer):
    approved = serializers.BooleanField()


class PausingChild(Reactor):
    """Composed by ``WithPausingChild``: pauses at ``approval``, resumed on a worker."""

    c1 = step(Effectful)
    approval = interrupt(after="c1", payload=Approval, resume="background")
    c2 = step(Effectful, wait_for=["approval"])


class WithPausingChild(Reactor):
    """Its child's interrupt pauses it; the payload is delivered by path (child.approval)."""

    p1 = step(Effectful)
    child = compose(PausingChild, wait_for=["p1"])
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


# ---------------------------------------------------------------------------- maps


def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


class MapTick(Step):
    """A map element on workers. Every run and undo is recorded in Redis under ``ns`` (what
    the test reads): ``runs:<i>`` / ``undos:<i>`` counters and ``started`` / ``undone`` lists
    of ``pid:index``. While the key ``<ns>:hold`` exists the element waits (the test's
    barrier, bounded); element ``fail_at`` raises; each element takes ``pause`` seconds, and
    ``<ns>:slow:<i>`` / ``<ns>:undo_pause`` seconds more when those keys are set."""

    def run(self, item: int, ns: str, redis_url: str, fail_at: int, pause: float) -> Any:
        client = _redis(redis_url)
        client.incr(f"{ns}:runs:{item}")
        client.rpush(f"{ns}:started", f"{os.getpid()}:{item}")
        if client.exists(f"{ns}:hold"):
            client.sadd(f"{ns}:waiting", f"{os.getpid()}:{item}")
            deadline = time.monotonic() + 30
            while client.exists(f"{ns}:hold") and time.monotonic() < deadline:
                time.sleep(0.02)
        if pause:
            time.sleep(pause)
        slow = client.get(f"{ns}:slow:{item}")
        if slow:
            time.sleep(float(slow))
        if item == fail_at:
            raise RuntimeError(f"element {item} failed")
        return item * 2

    def undo(
        self, result: Any, item: int, ns: str, redis_url: str, fail_at: int, pause: float
    ) -> None:
        client = _redis(redis_url)
        client.incr(f"{ns}:undos:{item}")
        client.rpush(f"{ns}:undone", f"{os.getpid()}:{item}")
        slow = client.get(f"{ns}:undo_pause")
        if slow:
            time.sleep(float(slow))


def _sum(results: Any) -> int:
    return sum(results)


class FannedOutTicks(Reactor):
    """A fanned-out map of ``MapTick``: 4 element tasks of 5 elements in flight."""

    ticks = map_over(
        arg.input("items"),
        MapTick,
        item=arg.element(),
        ns=arg.input("ns"),
        redis_url=arg.input("redis_url"),
        fail_at=arg.input("fail_at"),
        pause=arg.input("pause"),
        fan_out=True,
        batch_size=20,
        chunk_size=5,
        collect=_sum,
    )

    class Meta:
        background = "all"
        returns = "ticks"


class TwoTaskTicks(FannedOutTicks):
    """The same map with 2 element tasks of 5 elements in flight (one per worker process)."""

    ticks = map_over(
        arg.input("items"),
        MapTick,
        item=arg.element(),
        ns=arg.input("ns"),
        redis_url=arg.input("redis_url"),
        fail_at=arg.input("fail_at"),
        pause=arg.input("pause"),
        fan_out=True,
        batch_size=10,
        chunk_size=5,
        collect=_sum,
    )

    class Meta:
        background = "all"
        returns = "ticks"


# ---------------------------------------------------------------------------- coordination

from django_reactor import Lock, RateLimit  # noqa: E402

# INCR the holders counter, keep its high-water mark, return the server time (us) and count.
_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
local t = redis.call('TIME')
return {n, t[1] * 1000000 + t[2]}
"""


def _server_us(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


class Holder(Step):
    """Records, in Redis under ``ns``, that its body holds the run's coordination: INCR of
    ``<ns>:holders`` (high-water mark in ``<ns>:max_holders``) on entry, DECR on exit, and a
    ``<ns>:entries`` line ``execution start_us end_us fences pid`` (Redis server time) per body
    run. Sleeps ``pause`` seconds in between."""

    def run(self, ns: str, redis_url: str, pause: float) -> Any:
        import json

        context = self.context
        client = _redis(redis_url)
        holders, start = client.eval(_ENTER, 2, f"{ns}:holders", f"{ns}:max_holders")
        try:
            time.sleep(pause)
        finally:
            end = _server_us(client)
            client.decr(f"{ns}:holders")
        entry = {
            "execution": str(context.execution_id),
            "start": int(start),
            "end": end,
            "holders": int(holders),
            "fences": dict(context.fences),
            "pid": os.getpid(),
        }
        client.rpush(f"{ns}:entries", json.dumps(entry))
        return {"fences": dict(context.fences)}


def _hold(**extra: Any) -> Any:
    return step(
        Holder,
        ns=arg.input("ns"),
        redis_url=arg.input("redis_url"),
        pause=arg.input("pause"),
        **extra,
    )


class LockedHolder(Reactor):
    """One ``Holder`` step under a reactor-level lock on ``coord-{ns}``, in the background."""

    hold = _hold()

    class Meta:
        background = "all"
        coordination = [Lock("coord-{ns}", ttl=30)]
        returns = "hold"


class RateLimitedHolder(Reactor):
    """One ``Holder`` step; runs start at most 5 times a second (per ``ns``)."""

    hold = _hold()

    class Meta:
        background = "all"
        coordination = [RateLimit("coord-rate-{ns}", limits={"second": 5})]
        returns = "hold"


class BarrierUnit(Step):
    """An async unit that waits (bounded, 30 s) while ``<ns>:hold`` exists; ``<ns>:unit``
    says it started."""

    def run(self, ns: str, redis_url: str) -> str:
        client = _redis(redis_url)
        client.set(f"{ns}:unit", str(self.context.execution_id))
        deadline = time.monotonic() + 30
        while client.exists(f"{ns}:hold") and time.monotonic() < deadline:
            time.sleep(0.02)
        return "unit done"


class LockedWithUnit(Reactor):
    """Holds ``coord-{ns}`` for the whole run, which parks while its async unit runs."""

    first = _hold()
    unit = async_step(
        BarrierUnit, ns=arg.input("ns"), redis_url=arg.input("redis_url"), wait_for=["first"]
    )

    @step(value=arg.result("unit"))
    def reader(value: Any) -> Any:
        return value

    class Meta:
        background = "all"
        coordination = [Lock("coord-{ns}", ttl=30)]
        returns = "reader"


def note_start(step_name: str) -> None:
    """Count a body's start outside its transaction (an atomic body's rows roll back)."""
    context = step_context()
    folder = os.environ.get("REACTOR_FAULTS_STATE") or "/tmp"
    with open(os.path.join(folder, f"starts-{context.execution_id}"), "a") as starts:
        starts.write(f"{step_name}\n")


class AtomicMove(Step):
    """Moves money in the body's transaction; a fault point sits after the writes."""

    atomic = True

    def run(self, account: str, amount: str) -> Any:
        note_start(self.context.step)
        moved = move(account, Decimal(amount), step=self.context.step)
        faults.point("mid_body", step=self.context.step)
        if account == "closed":
            raise RuntimeError("the account is closed")
        return moved

    def undo(self, result: Any, account: str, amount: str) -> None:
        note_start(f"undo:{self.context.step}")
        move(account, -Decimal(amount), step=f"undo:{self.context.step}")
        faults.point("mid_undo", step=self.context.step)


class AtomicTransfer(Reactor):
    """Two atomic steps on a worker: debit the source, then credit the target."""

    class Inputs(serializers.Serializer):
        source = serializers.CharField()
        target = serializers.CharField()

    debit = step(AtomicMove, account=arg.input("source"), amount=arg.value("-30"))
    credit = step(
        AtomicMove, account=arg.input("target"), amount=arg.value("30"), wait_for=["debit"]
    )

    class Meta:
        background = "all"


class AtomicMoveThenRead(AtomicMove):
    """``AtomicMove`` whose body reads the balance back after the fault point (a query after
    a stall there finds the session ended if the run was taken over meanwhile)."""

    def run(self, account: str, amount: str) -> Any:
        moved = super().run(account, amount)
        moved["balance"] = str(Account.objects.get(name=account).balance)
        return moved


class AtomicTransferThenRead(Reactor):
    """``AtomicTransfer`` whose steps read the balance back after their fault point."""

    class Inputs(serializers.Serializer):
        source = serializers.CharField()
        target = serializers.CharField()

    debit = step(AtomicMoveThenRead, account=arg.input("source"), amount=arg.value("-30"))
    credit = step(
        AtomicMoveThenRead, account=arg.input("target"), amount=arg.value("30"), wait_for=["debit"]
    )

    class Meta:
        background = "all"


#: The steps of one side-by-side run meet here (in the worker process that runs them all).
SIDE_BY_SIDE = threading.Barrier(8, timeout=30)


class Meets(Step):
    """Records its body run, waits for the other seven at the barrier, records its effect."""

    def run(self) -> Any:
        context = self.context
        BodyRun.objects.create(
            execution_id=context.execution_id, step=context.step, pid=os.getpid()
        )
        SIDE_BY_SIDE.wait()
        effect(context.idempotency_key, context.execution_id, context.step)
        return context.step


class EightSideBySide(Reactor):
    """Eight independent steps that can only finish together (a barrier of eight)."""

    s1 = step(Meets)
    s2 = step(Meets)
    s3 = step(Meets)
    s4 = step(Meets)
    s5 = step(Meets)
    s6 = step(Meets)
    s7 = step(Meets)
    s8 = step(Meets)

    class Meta:
        background = "all"
        max_concurrency = 8


class FailsFirstAttempt(Effectful):
    """An Effectful step whose first attempt fails; retried after 1 s."""

    retry = Retry(attempts=3, delay=1)

    def run(self, **arguments: Any) -> Any:
        if self.context.attempt == 1:
            BodyRun.objects.create(
                execution_id=self.context.execution_id, step=self.context.step, pid=os.getpid()
            )
            raise RuntimeError("the partner is down for a moment")
        return super().run(**arguments)


class RetriesSideBySide(Reactor):
    """Two steps failing their first attempt beside one that does not, on a worker."""

    a = step(FailsFirstAttempt)
    b = step(FailsFirstAttempt)
    c = step(Effectful)
    total = step(Effectful, wait_for=["a", "b", "c"])

    class Meta:
        background = "all"
        max_concurrency = 3


class FourSideBySide(Reactor):
    """Four independent Effectful steps, then one that waits for them all."""

    s1 = step(Effectful)
    s2 = step(Effectful)
    s3 = step(Effectful)
    s4 = step(Effectful)
    last = step(Effectful, wait_for=["s1", "s2", "s3", "s4"])

    class Meta:
        background = "all"
        max_concurrency = 4


class FailsSideBySide(Reactor):
    """Three Effectful steps side by side; ``f4`` fails (FAILING), the others are undone."""

    s1 = step(Effectful)
    s2 = step(Effectful)
    f4 = step(Effectful)
    last = step(Effectful, wait_for=["s1", "s2", "f4"])

    class Meta:
        background = "all"
        max_concurrency = 3


class LockedSideBySide(Reactor):
    """Three ``Holder`` steps side by side under one reactor-level lock on ``coord-{ns}``."""

    h1 = _hold()
    h2 = _hold()
    h3 = _hold()

    class Meta:
        background = "all"
        coordination = [Lock("coord-{ns}", ttl=30)]
        max_concurrency = 3


class InlineSideBySide(Reactor):
    """Three Effectful steps side by side, inline (run by a "web process" in the tests)."""

    s1 = step(Effectful)
    s2 = step(Effectful)
    s3 = step(Effectful)

    class Meta:
        max_concurrency = 3


class NapsOnWorker(Reactor):
    """An Effectful step, a day's sleep, another Effectful step: in the background."""

    first = step(Effectful)
    nap = sleep(dt.timedelta(days=1), after=["first"])
    second = step(Effectful, wait_for=["nap"])

    class Meta:
        background = "all"


class HangsOnce(Step):
    """Its first attempt hangs (its own slow work, past its 1 s timeout); the second returns."""

    timeout = 1
    retry = Retry(attempts=2, delay=0.5)

    def run(self) -> str:
        BodyRun.objects.create(
            execution_id=self.context.execution_id, step=self.context.step, pid=os.getpid()
        )
        if self.context.attempt == 1:
            for _ in range(300):  # at most 30 s, and it stops once abandoned
                if self.context.should_stop():
                    return "abandoned"
                time.sleep(0.1)
        return f"attempt {self.context.attempt}"


class TimesOutOnWorker(Reactor):
    """One step whose first attempt hangs past its timeout, on a worker."""

    hang = step(HangsOnce)

    class Meta:
        background = "all"
        returns = "hang"


def _wait_while_held(ns: str, redis_url: str, started: str) -> None:
    """Mark ``started`` (INCR ``<ns>:<started>``), then wait (bounded, 30 s) while
    ``<ns>:hold`` exists."""
    client = _redis(redis_url)
    client.incr(f"{ns}:{started}")
    deadline = time.monotonic() + 30
    while client.exists(f"{ns}:hold") and time.monotonic() < deadline:
        time.sleep(0.02)


class HeldStep(Step):
    """Waits while the test holds ``<ns>:hold``; counts its starts under ``<ns>:<step>``."""

    def run(self, ns: str, redis_url: str) -> str:
        _wait_while_held(ns, redis_url, self.context.step)
        return self.context.step


class TwoStepUnit(Reactor):
    """An async reactor unit: ``wait`` (held by the test), then ``after`` (counted)."""

    wait = step(HeldStep, ns=arg.input("ns"), redis_url=arg.input("redis_url"))
    after = step(HeldStep, ns=arg.input("ns"), redis_url=arg.input("redis_url"), wait_for=["wait"])


def held_element(item: int, ns: str, redis_url: str) -> int:
    _wait_while_held(ns, redis_url, "element")
    return item


class CancelsATree(Reactor):
    """An async unit and a fanned-out map (two elements at a time) in flight while the run
    waits for them: cancelling it reaches both."""

    unit = async_reactor(TwoStepUnit, ns=arg.input("ns"), redis_url=arg.input("redis_url"))
    lines = map_over(
        arg.value(list(range(10))),
        held_element,
        item=arg.element(),
        ns=arg.input("ns"),
        redis_url=arg.input("redis_url"),
        fan_out=True,
        batch_size=2,
        chunk_size=1,
    )

    @step(unit=arg.result("unit"), lines=arg.result("lines"))
    def reader(unit: Any, lines: Any) -> str:
        return "read"

    class Meta:
        background = "all"


# ---------------------------------------------------------------------------- fleet steering


class Lookup(Step):
    """Records its body run and needs no undo (it reads): its result stands after a failure."""

    def run(self, **arguments: Any) -> Any:
        BodyRun.objects.create(
            execution_id=self.context.execution_id, step=self.context.step, pid=os.getpid()
        )
        return Success({"step": self.context.step})


class Breakable(Effectful):
    """An ``Effectful`` step that fails while a ``broken-<step>`` effect row exists (a bug a
    deploy fixes: the test deletes the row)."""

    def run(self, **arguments: Any) -> Any:
        if Effect.objects.filter(key=f"broken-{self.context.step}").exists():
            BodyRun.objects.create(
                execution_id=self.context.execution_id, step=self.context.step, pid=os.getpid()
            )
            raise RuntimeError(f"{self.context.step} has a bug")
        return super().run(**arguments)


class EightSteps(Reactor):
    """Four lookups, then four steps with effects, in the background."""

    s1 = step(Lookup)
    s2 = step(Lookup, wait_for=["s1"])
    s3 = step(Lookup, wait_for=["s2"])
    s4 = step(Lookup, wait_for=["s3"])
    s5 = step(Breakable, wait_for=["s4"])
    s6 = step(Breakable, wait_for=["s5"])
    s7 = step(Breakable, wait_for=["s6"])
    s8 = step(Breakable, wait_for=["s7"])

    class Meta:
        background = "all"


class Checkout(Reactor):
    """A run the bulk tests fail (``broken-c2``) and retry."""

    c1 = step(Lookup)
    c2 = step(Breakable, wait_for=["c1"])

    class Meta:
        background = "all"


class RenewMonth(Step):
    """One month of a subscription: its effect once per generation, then the next month as a
    new run (continue-as-new) until ``last``."""

    def run(self, month: int, last: int) -> Any:
        context = self.context
        BodyRun.objects.create(
            execution_id=context.execution_id, step=context.step, pid=os.getpid()
        )
        effect(context.idempotency_key, context.execution_id, context.step)
        faults.point("after_effect", step=context.step)
        if month < last:
            return ContinueAsNew({"month": month + 1, "last": last})
        return {"ended_at": month}


class Renewal(Reactor):
    """A monthly renewal loop, one run per month."""

    class Inputs(serializers.Serializer[dict[str, Any]]):
        month = serializers.IntegerField(min_value=0)
        last = serializers.IntegerField(min_value=0)

    renew = step(RenewMonth, month=arg.input("month"), last=arg.input("last"))

    class Meta:
        background = "all"
