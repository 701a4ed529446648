"""Helpers for testing your own reactors, and the pytest plugin that provides them as fixtures.

::

    from django_reactor.testing import run_reactor, mock_step

    def test_refund_is_rolled_back_when_the_charge_fails():
        with mock_step(Checkout, "charge", raises=PaymentDeclined("card declined")):
            result = run_reactor(Checkout, {"order": "A1"})
        result.assert_failed(step="charge")
        result.assert_undid("reserve")

:func:`run_reactor` runs a reactor in this process and also works off the background work it
queues (``Meta.background``, ``interrupt(resume="background")``, retries a worker would pick
up): instead of sending Celery tasks to a broker, it captures them and resumes each run here.

pytest loads this module through the ``pytest11`` entry point before Django is configured, so
nothing here may import Django models or settings at import time: imports are kept inside the
functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine.definition import ReactorDefinition, StepSpec
    from .engine.outcomes import Outcome
    from .engine.step import Step
    from .handle import ExecutionHandle
    from .reactor import Reactor

__all__ = [
    "ReactorResult",
    "StepMock",
    "assert_idempotent",
    "assert_lock_free",
    "assert_lock_held",
    "fail_step",
    "lock_holder",
    "mock_step",
    "rate_limit_count",
    "run_reactor",
    "semaphore_available",
]

#: How many queued tasks :meth:`ReactorResult.drain` runs before it gives up.
DEFAULT_MAX_ROUNDS = 100

_UNSET: Any = object()


# ---------------------------------------------------------------------------- capturing tasks


class _TaskQueue:
    """Tasks that would have gone to the broker: ``("resume", execution id)``, or a map's
    ``("map", map id)`` / ``("map_undo", map id)``."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, uuid.UUID]] = []

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Send resume tasks here instead of to Celery while the block runs.

        Dispatches are captured when they are queued, not after the commit: inside a test
        wrapped in a transaction (``django_db`` without ``transaction=True``) the commit never
        comes.
        """
        from unittest import mock

        from .celery import router

        def task(d: Any) -> tuple[str, uuid.UUID]:
            return (d.task, d.map_id) if d.map_id is not None else ("resume", d.execution_id)

        def publish_on_commit(dispatches: Any, using: str) -> None:
            self.pending.extend(task(d) for d in dispatches)

        def publish(dispatches: Any, using: str) -> list[int]:
            self.pending.extend(task(d) for d in dispatches)
            return [d.dispatch_id for d in dispatches]

        with (
            mock.patch.object(router, "publish_on_commit", publish_on_commit),
            mock.patch.object(router, "publish", publish),
        ):
            yield


# ---------------------------------------------------------------------------- the result


class ReactorResult:
    """How a run of :func:`run_reactor` ended, what it did, and assertions about it."""

    def __init__(
        self,
        reactor: type[Reactor],
        outcome: Outcome,
        queue: _TaskQueue,
        *,
        eager: bool,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
    ) -> None:
        self.reactor = reactor
        self._outcome = outcome
        self._queue = queue
        self._eager = eager
        self.max_rounds = max_rounds
        self._handle: ExecutionHandle | None = None

    def __repr__(self) -> str:
        return f"<ReactorResult {self.reactor.__qualname__} {self.execution_id} {self.status}>"

    # -- what happened
    @property
    def outcome(self) -> Outcome:
        return self._outcome

    @property
    def status(self) -> str:
        return self._outcome.status

    @property
    def execution_id(self) -> uuid.UUID | None:
        return self._outcome.execution_id

    @property
    def value(self) -> Any:
        """The completed run's value (``None`` unless it completed)."""
        return getattr(self._outcome, "value", None)

    @property
    def error(self) -> Any:
        """The failed run's ``ErrorInfo`` (``None`` unless it failed)."""
        return getattr(self._outcome, "error", None)

    @property
    def handle(self) -> ExecutionHandle:
        """The stored execution (read again after every operation of this result)."""
        if self._handle is None:
            from . import services

            if self.execution_id is None:
                raise AssertionError("this run has no stored execution")
            self._handle = services.find(self.execution_id)
        return self._handle

    def result_of(self, step: str) -> Any:
        """The stored result of ``step`` (KeyError when the step has no record)."""
        return self.handle.step_result(step)

    @property
    def trace(self) -> list[tuple[str, str]]:
        """The run's trace as ``(kind, step)`` pairs, oldest first."""
        return [(event.kind, event.step) for event in self.handle.trace]

    @property
    def paused_at(self) -> tuple[str, ...]:
        """The interrupt steps the run waits at (empty unless it is paused)."""
        if self.execution_id is None:
            return ()
        return tuple(i.step for i in self.handle.interrupts)

    @property
    def queued(self) -> list[uuid.UUID]:
        """Executions with a resume task captured and not run yet."""
        return [target for kind, target in self._queue.pending if kind == "resume"]

    # -- moving the run on
    def _refresh(self) -> None:
        from . import services

        self._handle = None
        if self.execution_id is not None:
            self._handle = services.find(self.execution_id)
            self._outcome = self._handle.outcome

    def step_once(self) -> bool:
        """Run the oldest captured task as a worker would; False when none is queued."""
        from . import services

        if not self._queue.pending:
            self._fast_forward()
        if not self._queue.pending:
            return False
        kind, target = self._queue.pending.pop(0)
        with self._queue.capturing():
            if kind == "resume":
                services.resume(target)
            else:
                from . import maps

                maps.work(target, forward=kind == "map")
        self._refresh()
        return True

    def drain(self, max_rounds: int | None = None) -> ReactorResult:
        """Run captured tasks until none is left (at most ``max_rounds`` of them)."""
        limit = self.max_rounds if max_rounds is None else max_rounds
        for _ in range(limit):
            if not self.step_once():
                return self
        if self._queue.pending:
            raise AssertionError(
                f"{self.reactor.__qualname__}: work was still queued after {limit} resume "
                f"task(s) (queued: {[f'{k} {i}' for k, i in self._queue.pending]}); a step that "
                "keeps rescheduling itself? Raise max_rounds if the run needs more.\n"
                + self._describe()
            )
        return self

    def _fast_forward(self) -> None:
        """A pending run waiting for its retry's wake-up time is due now: time passes in tests."""
        from .models import Execution
        from .states import ExecutionStatus

        if self.execution_id is None:
            return
        woken = Execution.objects.filter(
            pk=self.execution_id,
            status=ExecutionStatus.PENDING,
            wake_at__isnull=False,
            lease_owner__isnull=True,
        ).update(wake_at=None)
        if woken:
            self._queue.pending.append(("resume", self.execution_id))

    def resume(self, step: str | None = None, payload: Any = None) -> ReactorResult:
        """Deliver ``payload`` to the interrupt ``step`` (``None``: the one waiting); then
        drain, unless the run was made with ``background="none"``."""
        from . import services

        if self.execution_id is None:
            raise AssertionError("this run has no stored execution to resume")
        with self._queue.capturing():
            self._outcome = services.resume_interrupt(self.execution_id, step=step, payload=payload)
        self._handle = None
        if self._eager:
            self.drain()
        return self

    # -- assertions
    def _describe(self) -> str:
        lines = [f"{self.reactor.__qualname__} run {self.execution_id}: status {self.status}"]
        if self.error is not None:
            lines.append(f"error: {self.error}")
        if self.paused_at:
            lines.append(f"paused at: {', '.join(self.paused_at)}")
        lines.append("trace:")
        try:
            trace = self.trace
        except Exception:  # no stored run: nothing to show
            trace = []
        lines.extend(f"  {kind:<18} {step}".rstrip() for kind, step in trace)
        return "\n".join(lines)

    def _fail(self, message: str) -> AssertionError:
        return AssertionError(f"{message}\n{self._describe()}")

    def _steps_of(self, *kinds: str) -> list[str]:
        return [step for kind, step in self.trace if kind in kinds and step]

    def assert_completed(self) -> ReactorResult:
        from .states import ExecutionStatus

        if self.status != ExecutionStatus.COMPLETED:
            raise self._fail(f"expected the run to complete, but it is {self.status}")
        return self

    def assert_failed(self, step: str | None = None, kind: str | None = None) -> ReactorResult:
        """The run failed (at ``step``, with an error of ``kind``, when given)."""
        from .engine.outcomes import Failed

        if not isinstance(self._outcome, Failed):
            raise self._fail(f"expected the run to fail, but it is {self.status}")
        if step is not None and self._outcome.error.step != step:
            raise self._fail(
                f"expected the run to fail at step {step!r}, but it failed at "
                f"{self._outcome.error.step!r}"
            )
        if kind is not None and self._outcome.error.kind != kind:
            raise self._fail(
                f"expected a failure of kind {kind!r}, but it is {self._outcome.error.kind!r}"
            )
        return self

    def assert_halted(self, reason: Any = _UNSET) -> ReactorResult:
        from .engine.outcomes import Halted

        if not isinstance(self._outcome, Halted):
            raise self._fail(f"expected the run to halt, but it is {self.status}")
        if reason is not _UNSET and self._outcome.reason != reason:
            raise self._fail(
                f"expected the run to halt with reason {reason!r}, but the reason is "
                f"{self._outcome.reason!r}"
            )
        return self

    def _assert_in_order(
        self, expected: str, verb: str, steps: tuple[str, ...], actual: list[str]
    ) -> None:
        remaining = iter(actual)
        if not all(name in remaining for name in steps):
            raise self._fail(
                f"expected {expected} {', '.join(steps)} (in this order), but it {verb} "
                f"{', '.join(actual) or 'nothing'}"
            )

    def assert_ran(self, *steps: str) -> ReactorResult:
        """Each step's body ran (and succeeded, failed or halted), in this order; other steps
        may have run in between."""
        ran = dict.fromkeys(self._steps_of("run", "retry", "fail", "skip", "halt"))
        self._assert_in_order("the run to run", "ran", steps, list(ran))
        return self

    def assert_undid(self, *steps: str) -> ReactorResult:
        """Rollback undid these steps, in this order."""
        self._assert_in_order("rollback to undo", "undid", steps, self._steps_of("undo"))
        return self

    def assert_compensated(self, step: str) -> ReactorResult:
        if step not in self._steps_of("compensate"):
            raise self._fail(f"expected step {step!r} to be compensated, but it was not")
        return self

    def assert_retried(self, step: str, times: int | None = None) -> ReactorResult:
        """``step`` failed and was tried again: ``times`` retries (any number when None)."""
        retries = self._steps_of("retry").count(step)
        if (times is None and retries == 0) or (times is not None and retries != times):
            wanted = "at least once" if times is None else f"{times} time(s)"
            raise self._fail(
                f"expected step {step!r} to be retried {wanted}, but it was retried "
                f"{retries} time(s)"
            )
        return self

    def assert_paused_at(self, step: str) -> ReactorResult:
        if step not in self.paused_at:
            raise self._fail(
                f"expected the run to wait at interrupt {step!r}, but it is {self.status}"
                + (f" waiting at {', '.join(self.paused_at)}" if self.paused_at else "")
            )
        return self

    def assert_acquired(self, kind: str, key: str, step: str = "") -> ReactorResult:
        """The run (or its ``step``) took ``kind`` ("lock", "semaphore", "rate_limit",
        "period") ``key``, as its trace says."""
        events = self.handle.trace if self.execution_id is not None else []
        taken = [
            (e.step, e.data.get(kind)) for e in events if e.kind == "acquire" and kind in e.data
        ]
        if (step, key) not in taken:
            seen = ", ".join(f"{k}" + (f" (step {s})" if s else "") for s, k in taken) or "none"
            raise self._fail(f"expected the run to take {kind} {key!r}; it took: {seen}")
        return self

    def assert_rollback_failure(self, step: str) -> ReactorResult:
        """Undoing or compensating ``step`` failed during rollback."""
        failed = {f.step for f in getattr(self.error, "rollback_failures", ())}
        failed.update(self._steps_of("undo_failed", "compensate_failed"))
        if step not in failed:
            raise self._fail(
                f"expected the rollback of step {step!r} to fail, but "
                + (f"only {', '.join(sorted(failed))} failed" if failed else "nothing failed")
            )
        return self


def run_reactor(
    reactor: type[Reactor],
    inputs: Mapping[str, Any] | None = None,
    *,
    background: str = "eager",
    idempotency_key: str | None = None,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
) -> ReactorResult:
    """Run ``reactor`` in this process and return a :class:`ReactorResult`.

    No task reaches Celery: the resume tasks a run queues are captured. With
    ``background="eager"`` (the default) they run here, one after the other, until nothing is
    queued (at most ``max_rounds``); a retry waiting for its backoff is made due at once. With
    ``background="none"`` they stay queued: continue with :meth:`ReactorResult.step_once` or
    :meth:`ReactorResult.drain`.
    """
    from . import services

    if background not in ("eager", "none"):
        raise ValueError(f'background must be "eager" or "none", got {background!r}')
    queue = _TaskQueue()
    with queue.capturing():
        outcome = services.run(reactor, inputs or {}, idempotency_key=idempotency_key)
    result = ReactorResult(
        reactor, outcome, queue, eager=background == "eager", max_rounds=max_rounds
    )
    if background == "eager" and queue.pending:
        result.drain()
    return result


# ---------------------------------------------------------------------------- replacing steps


@dataclasses.dataclass
class StepMock:
    """A replaced step: ``calls`` holds the arguments of every call of its ``run``."""

    reactor: type[Reactor]
    step: str
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def called(self) -> bool:
        return bool(self.calls)


def _replaceable(reactor: type[Reactor], step: str) -> StepSpec:
    definition = reactor.definition
    spec = definition.by_name.get(step)
    if spec is None:
        known = ", ".join(definition.by_name) or "none"
        hint = " (paths into composed reactors are not supported yet)" if "." in step else ""
        raise ValueError(f"{reactor.__qualname__} has no step {step!r}{hint}; its steps: {known}")
    if spec.interrupt is not None or spec.child is not None or spec.unit is not None:
        raise ValueError(
            f"step {step!r} of {reactor.__qualname__} is an interrupt, composed reactor or "
            "async unit; only plain steps can be replaced"
        )
    return spec


def _impl_with_run(spec: StepSpec, run: Callable[[Step, dict[str, Any]], Any]) -> type[Step]:
    """A subclass of the step's class whose ``run`` is ``run``; undo and compensate stay.

    It keeps the original's module and qualified name, so the run's stored shape does not
    change: a run started with the replacement can continue without it, and back.
    """
    original = spec.impl

    def body(self: Step, **arguments: Any) -> Any:
        return run(self, arguments)

    return type(
        original.__name__,
        (original,),
        {
            "run": body,
            "__module__": original.__module__,
            "__qualname__": original.__qualname__,
        },
    )


@contextlib.contextmanager
def _replaced(reactor: type[Reactor], impls: Mapping[str, type[Step]]) -> Iterator[None]:
    """Swap ``reactor.definition`` for one whose steps use ``impls``; restore on exit.

    Workers find reactors through the registry: while the block runs, the registry returns
    this class for its name.
    """
    from . import registry

    previous: ReactorDefinition = reactor.definition
    steps = tuple(
        dataclasses.replace(s, impl=impls[s.name]) if s.name in impls else s for s in previous.steps
    )
    replaced = dataclasses.replace(previous, steps=steps, by_name={s.name: s for s in steps})
    registered = registry.all_reactors().get(previous.name)
    reactor.definition = replaced
    registry.register(reactor)
    try:
        yield
    finally:
        reactor.definition = previous
        if registered is not None:
            registry.register(registered)


@contextlib.contextmanager
def mock_step(
    reactor: type[Reactor],
    step: str,
    *,
    returns: Any = _UNSET,
    side_effect: Callable[..., Any] | None = None,
    raises: BaseException | type[BaseException] | None = None,
) -> Iterator[StepMock]:
    """Replace the body of ``reactor``'s ``step`` while the block runs.

    Give one of ``returns`` (the value the step returns: a plain value, ``Success``,
    ``Failure``, ``Halt`` or ``Skip``), ``side_effect`` (called with the step's arguments as
    keywords; what it returns or raises is the step's) or ``raises`` (an exception to raise).
    The step's ``undo`` and ``compensate`` stay as they are. Only a top-level step name is
    supported for now: steps of composed reactors and ``map`` items come later.
    """
    given = [returns is not _UNSET, side_effect is not None, raises is not None]
    if sum(given) != 1:
        raise TypeError("mock_step() takes exactly one of returns=, side_effect= or raises=")
    spec = _replaceable(reactor, step)
    record = StepMock(reactor, step)

    def run(instance: Step, arguments: dict[str, Any]) -> Any:
        record.calls.append(dict(arguments))
        if raises is not None:
            raise raises
        if side_effect is not None:
            return side_effect(**arguments)
        return returns

    with _replaced(reactor, {step: _impl_with_run(spec, run)}):
        yield record


def fail_step(
    reactor: type[Reactor],
    step: str,
    error: BaseException | str = "failed by fail_step()",
    *,
    retryable: bool = False,
) -> contextlib.AbstractContextManager[StepMock]:
    """Make ``step`` fail while the block runs (by default without retries).

    ``error`` is an exception to raise or a message. With ``retryable=False`` the step returns
    ``Failure(error, retryable=False)``, so its retry policy does not delay the failure.
    """
    from .engine.outcomes import Failure

    if retryable:
        exc = error if isinstance(error, BaseException) else RuntimeError(error)
        return mock_step(reactor, step, raises=exc)
    return mock_step(reactor, step, returns=Failure(error, retryable=False))


# ---------------------------------------------------------------------------- idempotency


def assert_idempotent(
    reactor: type[Reactor],
    inputs: Mapping[str, Any] | None = None,
    *,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
) -> ReactorResult:
    """Run ``reactor`` with every step's ``run`` called twice with the same arguments.

    A worker that dies mid-step runs that step again, so a step must give the same outcome when
    repeated. Fails naming each step whose second call returned something else or raised.
    Interrupts, composed reactors and async units are run once.
    """
    from .engine.outcomes import as_step_outcome

    problems: list[str] = []
    impls: dict[str, type[Step]] = {}
    for spec in reactor.definition.steps:
        if spec.interrupt is not None or spec.child is not None or spec.unit is not None:
            continue

        def twice(instance: Step, arguments: dict[str, Any], original: Any = spec.impl) -> Any:
            name = instance.context.step
            first = original(instance.context).run(**arguments)
            try:
                second = original(instance.context).run(**arguments)
            except Exception as exc:
                problems.append(
                    f"step {name!r} raised on its second call with the same arguments: "
                    f"{type(exc).__name__}: {exc}"
                )
                return first
            if as_step_outcome(first) != as_step_outcome(second):
                problems.append(
                    f"step {name!r} is not idempotent: its first call returned {first!r}, "
                    f"its second call with the same arguments returned {second!r}"
                )
            return first

        impls[spec.name] = _impl_with_run(spec, twice)
    with _replaced(reactor, impls):
        result = run_reactor(reactor, inputs, max_rounds=max_rounds)
    if problems:
        raise AssertionError("\n".join(problems) + "\n" + result._describe())
    return result


# ---------------------------------------------------------------------------- pytest plugin

try:
    import pytest
except ImportError:  # pragma: no cover - unittest users need not install pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def reactor_runner() -> Callable[..., ReactorResult]:
        """:func:`run_reactor`: ``reactor_runner(MyReactor, {...}).assert_completed()``."""
        return run_reactor

    @pytest.fixture(name="mock_step")
    def mock_step_fixture() -> Iterator[Callable[..., StepMock]]:
        """:func:`mock_step` for the rest of the test: ``mock_step(R, "charge", returns=1)``."""
        with contextlib.ExitStack() as stack:

            def replace(reactor: type[Reactor], step: str, **options: Any) -> StepMock:
                return stack.enter_context(mock_step(reactor, step, **options))

            yield replace

    @pytest.fixture(name="fail_step")
    def fail_step_fixture() -> Iterator[Callable[..., StepMock]]:
        """:func:`fail_step` for the rest of the test: ``fail_step(R, "charge", "declined")``."""
        with contextlib.ExitStack() as stack:

            def replace(reactor: type[Reactor], step: str, *args: Any, **options: Any) -> StepMock:
                return stack.enter_context(fail_step(reactor, step, *args, **options))

            yield replace


# ---------------------------------------------------------------------------- coordination


def lock_holder(key: str) -> uuid.UUID | None:
    """The run holding lock ``key`` (as declared, ``"order-7"``) on the configured backend."""
    from .coordination import get_backend

    holder = get_backend().lock_holder(f"lock:{key}")
    return uuid.UUID(holder.removeprefix("run:")) if holder else None


def assert_lock_held(key: str, by: Any = None) -> None:
    """Lock ``key`` is held (by the run ``by``, an execution id or a ReactorResult, if given)."""
    holder = lock_holder(key)
    wanted = getattr(by, "execution_id", by)
    if holder is None or (wanted is not None and str(holder) != str(wanted)):
        raise AssertionError(
            f"expected lock {key!r} to be held"
            + (f" by execution {wanted}" if wanted is not None else "")
            + (f", but execution {holder} holds it" if holder else ", but it is free")
        )


def assert_lock_free(key: str) -> None:
    """Nobody holds lock ``key``."""
    holder = lock_holder(key)
    if holder is not None:
        raise AssertionError(f"expected lock {key!r} to be free, but execution {holder} holds it")


def semaphore_available(key: str, limit: int) -> int:
    """Free slots of semaphore ``key`` (declared with ``limit``)."""
    from .coordination import get_backend

    return limit - len(get_backend().semaphore_holders(f"semaphore:{key}"))


def rate_limit_count(key: str, seconds: float, *, name: bool = False) -> int:
    """Starts charged to rate limit ``key`` (or the named limit ``key``) in the last
    ``seconds``."""
    from .coordination import Window, get_backend
    from .coordination.rates import named_rate_limit

    full = named_rate_limit(key)[0] if name else f"rate:{key}"
    return get_backend().rate_count(full, Window(1_000_000, seconds))
