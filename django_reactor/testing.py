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
import functools
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    from .engine.definition import ReactorDefinition, StepSpec
    from .engine.outcomes import Outcome
    from .engine.step import Step
    from .handle import ExecutionHandle
    from .maps import ElementResult
    from .reactor import Reactor

__all__ = [
    "MapElements",
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
        parent: ReactorResult | None = None,
    ) -> None:
        self.reactor = reactor
        self._outcome = outcome
        self._queue = queue
        self._eager = eager
        self.max_rounds = max_rounds
        self._handle: ExecutionHandle | None = None
        # For the result of a composed child or async unit: the result it was read from.
        self.parent = parent

    def __repr__(self) -> str:
        return f"<ReactorResult {self._name} {self.execution_id} {self.status}>"

    @property
    def _name(self) -> str:
        # An async_step unit has no class of its own: its definition is named "Parent:step".
        return getattr(self.reactor, "__qualname__", None) or self.reactor.definition.name

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

    # -- children, units and map elements
    def child(self, step: str) -> ReactorResult:
        """The run of the reactor that ``step`` composed (``compose``) or dispatched
        (``async_reactor``, ``async_step``), as a result of its own, read as it is now.

        ``"ship.pack"`` is the child that step ``pack`` of ``ship``'s child ran. The child
        shares this result's captured work: draining either moves both on.
        """
        result = self
        for name in step.split("."):
            result = result._child(name)
        return result

    def _child(self, step: str) -> ReactorResult:
        from . import registry

        if "[" in step:
            raise self._fail(
                f"{step!r}: map elements are not runs of their own; read them with "
                f"elements({step.partition('[')[0]!r})"
            )
        try:
            handle = self.handle.child(step)
        except KeyError:
            raise self._fail(
                f"expected step {step!r} to have run a composed reactor or an async unit, but "
                "it ran none"
            ) from None
        result = ReactorResult(
            registry.get(handle.reactor),
            handle.outcome,
            self._queue,
            eager=self._eager,
            max_rounds=self.max_rounds,
            parent=self,
        )
        result._handle = handle
        return result

    def _owner_of(self, path: str) -> tuple[ReactorResult, str]:
        """The result (this one or a child) that runs the last step of ``path``, and its name."""
        owner_path, _, step = path.rpartition(".")
        return (self.child(owner_path) if owner_path else self), step

    def _map_id(self, step: str) -> uuid.UUID:
        from . import map_store

        owner, name = self._owner_of(step)
        run = map_store.find(owner.execution_id, name) if owner.execution_id else None
        if run is None:
            spec = owner.reactor.definition.by_name.get(name)
            what = "is not a map_over() step" if spec is None or spec.map is None else "never ran"
            raise owner._fail(f"expected map step {name!r} to have run, but it {what}")
        return uuid.UUID(str(run.pk))

    def elements(self, step: str) -> MapElements:
        """Every element of the map ``step`` (``"ship.lines"``: of a child's map), in index
        order, with assertions about them."""
        from . import map_store
        from .maps import MapResults

        owner, name = self._owner_of(step)
        map_id = self._map_id(step)
        return MapElements(
            owner,
            name,
            map_id,
            list(MapResults(map_id).outcomes()),
            dict(map_store.rollback_errors(map_id)),
        )

    def map_summary(self, step: str) -> dict[str, Any]:
        """The totals of the map ``step``: ``size``, ``succeeded``, ``failed``, ``halted``,
        ``not_started``, ``undone``, ``undo_failed``... and sampled ``failures``
        (``map_store.summary``)."""
        from . import map_store

        return map_store.summary(self._map_id(step))

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
        result: ReactorResult | None = self
        while result is not None:
            result._refresh()
            result = result.parent
        return True

    def wait(self, timeout: float = 30.0) -> ReactorResult:
        """Wait for real workers to finish (or pause) the run; AssertionError after ``timeout``.

        For runs started with ``background="workers"`` (or resumed by workers meanwhile).
        """
        import time

        from .states import ExecutionStatus

        moving = (ExecutionStatus.PENDING, ExecutionStatus.RUNNING, ExecutionStatus.ROLLING_BACK)
        deadline = time.monotonic() + timeout
        pause = 0.02
        while True:
            self._refresh()
            if self.status not in moving:
                return self
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.reactor.__qualname__}: the run was still {self.status} after "
                    f"{timeout:g} s; is a Celery worker running on the queue "
                    "REACTOR['CELERY_QUEUE'] names?\n" + self._describe()
                )
            time.sleep(pause)  # waiting for another process: there is nothing to wait on here
            pause = min(pause * 1.5, 0.2)

    def drain(self, max_rounds: int | None = None) -> ReactorResult:
        """Run captured tasks until none is left (at most ``max_rounds`` of them)."""
        limit = self.max_rounds if max_rounds is None else max_rounds
        for _ in range(limit):
            if not self.step_once():
                return self
        if self._queue.pending:
            raise AssertionError(
                f"{self._name}: work was still queued after {limit} resume "
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
        lines = [f"{self._name} run {self.execution_id}: status {self.status}"]
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

    def assert_map(
        self,
        step: str,
        *,
        size: int | None = None,
        succeeded: int | None = None,
        failed: int | None = None,
        halted: int | None = None,
        not_started: int | None = None,
        undone: int | None = None,
        undo_failed: int | None = None,
    ) -> ReactorResult:
        """The map ``step`` has these totals (those given), as :meth:`map_summary` reads them.

        An element counts where it is now: an element undone by rollback counts as ``undone``,
        not ``succeeded``.
        """
        expected = {
            "size": size,
            "succeeded": succeeded,
            "failed": failed,
            "halted": halted,
            "not_started": not_started,
            "undone": undone,
            "undo_failed": undo_failed,
        }
        summary = self.map_summary(step)
        wrong = {
            name: (count, summary.get(name))
            for name, count in expected.items()
            if count is not None and summary.get(name) != count
        }
        if wrong:
            totals = ", ".join(
                f"{name}={summary.get(name)}" for name in expected if summary.get(name)
            )
            raise self._fail(
                f"expected map {step!r} to have "
                + ", ".join(f"{name}={want}" for name, (want, _) in wrong.items())
                + f", but it has {totals or 'no elements'}"
            )
        return self


class MapElements(Sequence["ElementResult"]):
    """The elements of one map step, in index order: each an ``ElementResult`` (``index``,
    ``status``, ``value``, ``error``), and assertions about them.

    ``error`` is the element's ``ErrorInfo`` as a dict when it failed (``error["step"]`` names
    the element's step that failed) and ``{"reason": ...}`` when it halted; what went wrong
    undoing an element is :meth:`rollback_errors`. Obtained from
    :meth:`ReactorResult.elements`.
    """

    def __init__(
        self,
        owner: ReactorResult,
        step: str,
        map_id: uuid.UUID,
        elements: list[ElementResult],
        rollback_errors: Mapping[int, list[dict[str, Any]]] | None = None,
    ) -> None:
        self.owner = owner
        self.step = step
        self.map_id = map_id
        self._elements = elements
        self._rollback_errors = dict(rollback_errors or {})

    def __repr__(self) -> str:
        return f"<MapElements {self.step} of {self.owner._name}: {len(self)} element(s)>"

    @overload
    def __getitem__(self, index: int) -> ElementResult: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[ElementResult]: ...

    def __getitem__(self, index: int | slice) -> ElementResult | Sequence[ElementResult]:
        return self._elements[index]

    def __len__(self) -> int:
        return len(self._elements)

    @property
    def statuses(self) -> list[str]:
        """Each element's status, in index order."""
        return [element.status for element in self._elements]

    def indices(self, *statuses: str) -> list[int]:
        """The indices of the elements with one of ``statuses``."""
        return [element.index for element in self._elements if element.status in statuses]

    def values(self) -> list[Any]:
        """The values of the elements that succeeded (or succeeded and were undone since)."""
        return [e.value for e in self._elements if e.status in ("succeeded", "undone")]

    def rollback_errors(self, index: int) -> list[dict[str, Any]]:
        """The rollback failures (``step``, ``action``, ``message``...) of element ``index``
        whose undo failed (empty for other elements)."""
        return list(self._rollback_errors.get(index) or [])

    def summary(self) -> dict[str, Any]:
        """The map's totals (see :meth:`ReactorResult.map_summary`)."""
        from . import map_store

        return map_store.summary(self.map_id)

    # -- assertions
    def _describe(self) -> str:
        lines = [f"map {self.step} ({len(self)} element(s)):"]
        for element in self._elements[:50]:
            detail = _detail(element, self.rollback_errors(element.index))
            lines.append(f"  [{element.index}] {element.status:<12} {detail}".rstrip())
        if len(self) > 50:
            lines.append(f"  ... and {len(self) - 50} more")
        return "\n".join(lines)

    def _fail(self, message: str) -> AssertionError:
        return self.owner._fail(f"{message}\n{self._describe()}")

    def _element(self, index: int, status: str) -> ElementResult:
        found = [e for e in self._elements if e.index == index]
        if not found:
            raise self._fail(
                f"expected element {index} of map {self.step!r} to be {status}, but the map has "
                f"{len(self)} element(s)"
            )
        if found[0].status != status:
            raise self._fail(
                f"expected element {index} of map {self.step!r} to be {status}, but it is "
                f"{found[0].status}"
            )
        return found[0]

    def assert_element_succeeded(self, index: int, value: Any = _UNSET) -> MapElements:
        """Element ``index`` succeeded (with ``value``, when given)."""
        element = self._element(index, "succeeded")
        if value is not _UNSET and element.value != value:
            raise self._fail(
                f"expected element {index} of map {self.step!r} to succeed with {value!r}, but "
                f"its value is {element.value!r}"
            )
        return self

    def assert_element_failed(
        self,
        index: int,
        *,
        step: str | None = None,
        kind: str | None = None,
        message: str | None = None,
    ) -> MapElements:
        """Element ``index`` failed (at its ``step``, with an error of ``kind`` whose message
        contains ``message``, when given)."""
        error = self._element(index, "failed").error or {}
        for field, wanted in (("step", step), ("kind", kind)):
            if wanted is not None and error.get(field) != wanted:
                raise self._fail(
                    f"expected element {index} of map {self.step!r} to fail with {field} "
                    f"{wanted!r}, but its {field} is {error.get(field)!r}"
                )
        if message is not None and message not in str(error.get("message", "")):
            raise self._fail(
                f"expected the error of element {index} of map {self.step!r} to mention "
                f"{message!r}, but it is {error.get('message')!r}"
            )
        return self

    def assert_element_halted(self, index: int, reason: Any = _UNSET) -> MapElements:
        """Element ``index`` halted (with ``reason``, when given)."""
        error = self._element(index, "halted").error or {}
        if reason is not _UNSET and error.get("reason") != reason:
            raise self._fail(
                f"expected element {index} of map {self.step!r} to halt with reason "
                f"{reason!r}, but the reason is {error.get('reason')!r}"
            )
        return self

    def assert_element_undone(self, index: int) -> MapElements:
        """Element ``index`` succeeded, then rollback undid it."""
        self._element(index, "undone")
        return self

    def assert_element_not_started(self, index: int) -> MapElements:
        """Element ``index`` never ran: the map stopped before it."""
        self._element(index, "not_started")
        return self

    def assert_element_undo_failed(self, index: int, message: str | None = None) -> MapElements:
        """Undoing element ``index`` failed during rollback (with an error whose message
        contains ``message``, when given)."""
        self._element(index, "undo_failed")
        messages = [str(f.get("message", "")) for f in self.rollback_errors(index)]
        if message is not None and not any(message in m for m in messages):
            raise self._fail(
                f"expected undoing element {index} of map {self.step!r} to fail mentioning "
                f"{message!r}, but it failed with {'; '.join(messages) or 'no message'}"
            )
        return self


def _detail(element: ElementResult, rollback_errors: list[dict[str, Any]]) -> str:
    error: Any = element.error
    if rollback_errors:
        return "; ".join(
            f"{f.get('action', 'undo')} {f.get('step') or ''} failed: {f.get('message')}"
            for f in rollback_errors
        )
    if element.status == "halted" and isinstance(error, dict):
        return f"halted: {error.get('reason')}"
    if isinstance(error, dict):
        where = f" at step {error['step']!r}" if error.get("step") else ""
        return f"{error.get('kind', 'step')} error{where}: {error.get('message', '')}"
    return "" if element.value is None else repr(element.value)[:80]


def run_reactor(
    reactor: type[Reactor],
    inputs: Mapping[str, Any] | None = None,
    *,
    background: str = "eager",
    idempotency_key: str | None = None,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    timeout: float = 30.0,
) -> ReactorResult:
    """Run ``reactor`` and return a :class:`ReactorResult`.

    With ``background="eager"`` (the default) or ``"none"`` no task reaches Celery: the tasks
    a run queues are captured. ``"eager"`` runs them here, one after the other, until nothing
    is queued (at most ``max_rounds``); a retry waiting for its backoff is made due at once.
    ``"none"`` leaves them queued: continue with :meth:`ReactorResult.step_once` or
    :meth:`ReactorResult.drain`. With ``background="workers"`` the tasks go to Celery as in
    production and real workers (which your test starts) run them; the call returns once the
    run has finished or paused, or fails after ``timeout`` seconds. Replaced steps
    (``mock_step``) only apply in this process, so not on real workers.
    """
    from . import services

    if background not in ("eager", "none", "workers"):
        raise ValueError(f'background must be "eager", "none" or "workers", got {background!r}')
    if background == "workers":
        outcome = services.run(reactor, inputs or {}, idempotency_key=idempotency_key)
        result = ReactorResult(reactor, outcome, _TaskQueue(), eager=False)
        return result.wait(timeout)
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
    """A replaced step: ``calls`` holds the arguments of every call of its replacement.

    For a step of map elements, ``indices`` holds the element index of each of those calls.
    """

    reactor: type[Reactor]
    step: str
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    indices: list[int] = dataclasses.field(default_factory=list)

    @property
    def called(self) -> bool:
        return bool(self.calls)


_SEGMENT = re.compile(r"(?P<name>[A-Za-z_]\w*)(?:\[(?P<index>\d+|\*)\])?")


@dataclasses.dataclass(frozen=True)
class _Target:
    """Where a step path leads: step ``step`` of ``owner``, or (``element_step`` given) the
    step ``element_step`` of the elements of ``owner``'s map ``step``."""

    owner: type[Reactor]
    step: str
    spec: StepSpec  # the step replaced: its impl is the original the replacement wraps
    element_step: str | None = None
    index: int | None = None  # the one element replaced (None: every element)

    def definition_with(self, impl: type[Step]) -> ReactorDefinition:
        """``owner``'s current definition with the target step's impl replaced by ``impl``."""
        definition: ReactorDefinition = self.owner.definition
        if self.element_step is None:
            return _with_impl(definition, self.step, impl)
        spec = definition.by_name[self.step]
        assert spec.map is not None
        element = _with_impl(spec.map.element_definition, self.element_step, impl)
        mapped = dataclasses.replace(spec.map, element_definition=element)
        return _with_spec(definition, dataclasses.replace(spec, map=mapped))


def _with_spec(definition: ReactorDefinition, spec: StepSpec) -> ReactorDefinition:
    steps = tuple(spec if s.name == spec.name else s for s in definition.steps)
    return dataclasses.replace(definition, steps=steps, by_name={s.name: s for s in steps})


def _with_impl(definition: ReactorDefinition, step: str, impl: type[Step]) -> ReactorDefinition:
    spec = definition.by_name[step]
    replaced = dataclasses.replace(spec, impl=impl)
    if spec.unit == "step" and spec.unit_definition is not None:
        # An async_step runs as a one-step reactor of its own, found through its parent.
        unit = _with_impl(spec.unit_definition, step, impl)
        replaced = dataclasses.replace(replaced, unit_definition=unit)
    return _with_spec(definition, replaced)


def _child_class(spec: StepSpec) -> Any:
    """The reactor class a compose() or async_reactor() step runs (None for other steps)."""
    if spec.child is not None:
        return spec.child
    if spec.unit == "reactor":
        return getattr(spec.impl, "child", None)
    return None


def _steps_of(definition: ReactorDefinition) -> str:
    return ", ".join(definition.by_name) or "none"


def _resolve(reactor: type[Reactor], path: str) -> _Target:
    """Follow ``path`` ("charge", "ship.pack", "lines[3].charge", "lines[*].charge") from
    ``reactor`` to the step it names; ValueError saying where it leads nowhere."""
    parsed = []
    for segment in path.split("."):
        match = _SEGMENT.fullmatch(segment)
        if match is None:
            raise ValueError(
                f"step path {path!r}: {segment!r} is not a step name, 'name[3]' (one map "
                "element) or 'name[*]' (every map element)"
            )
        parsed.append((match["name"], match["index"]))
    owner = reactor
    for position, (name, index) in enumerate(parsed):
        definition: ReactorDefinition = owner.definition
        where = getattr(owner, "__qualname__", definition.name)
        spec = definition.by_name.get(name)
        if spec is None:
            via = f" (reached by {'.'.join(n for n, _ in parsed[:position])!r})" if position else ""
            raise ValueError(
                f"{where}{via} has no step {name!r}; its steps: {_steps_of(definition)}"
            )
        rest = parsed[position + 1 :]
        if index is not None:
            if spec.map is None:
                raise ValueError(
                    f"step path {path!r}: step {name!r} of {where} is not a map_over() step; "
                    "only a map's elements are chosen with [index]"
                )
            return _element_target(owner, spec, index, rest, path)
        if not rest:
            _check_leaf(where, spec, path)
            return _Target(owner, name, spec)
        child = _child_class(spec)
        if child is None:
            if spec.map is not None:
                raise ValueError(
                    f"step path {path!r}: step {name!r} of {where} is a map; choose its "
                    f"elements: {name}[3].<step> (element 3) or {name}[*].<step> (every element)"
                )
            raise ValueError(
                f"step path {path!r}: step {name!r} of {where} is not a compose() or "
                "async_reactor() step: no steps are nested in it"
            )
        owner = child
    raise AssertionError("unreachable")  # pragma: no cover


def _check_leaf(where: str, spec: StepSpec, path: str) -> None:
    child = _child_class(spec)
    if child is not None:
        raise ValueError(
            f"step {spec.name!r} of {where} runs the reactor {child.__qualname__}; only plain "
            f"steps can be replaced: name one of its steps, {path}.<step> (its steps: "
            f"{_steps_of(child.definition)})"
        )
    if spec.map is not None:
        raise ValueError(
            f"step {spec.name!r} of {where} is a map; only plain steps can be replaced: name an "
            f"element's step, {path}[3].<step> (element 3) or {path}[*].<step> (every element)"
        )
    if spec.interrupt is not None:
        raise ValueError(
            f"step {spec.name!r} of {where} is an interrupt; only plain steps can be replaced "
            "(deliver its payload with ReactorResult.resume(...) instead)"
        )


def _element_target(
    owner: type[Reactor],
    spec: StepSpec,
    index: str,
    rest: list[tuple[str, str | None]],
    path: str,
) -> _Target:
    assert spec.map is not None
    element = spec.map.element_definition
    if len(rest) > 1 or (rest and rest[0][1] is not None):
        raise ValueError(
            f"step path {path!r}: the steps of a map element have nothing nested in them "
            "(an element cannot compose, dispatch or map)"
        )
    if rest:
        inner = element.by_name.get(rest[0][0])
        if inner is None:
            raise ValueError(
                f"step path {path!r}: the elements of map {spec.name!r} have no step "
                f"{rest[0][0]!r}; their steps: {_steps_of(element)}"
            )
    elif len(element.steps) == 1:
        inner = element.steps[0]  # "lines[*]": the element is one step
    else:
        raise ValueError(
            f"step path {path!r}: the elements of map {spec.name!r} have several steps; name "
            f"one: {path}.<step> (their steps: {_steps_of(element)})"
        )
    _check_leaf(element.name, inner, path)
    return _Target(
        owner,
        spec.name,
        inner,
        element_step=inner.name,
        index=None if index == "*" else int(index),
    )


def _impl_with_run(
    spec: StepSpec, run: Callable[[Step, dict[str, Any]], Any], index: int | None = None
) -> type[Step]:
    """A subclass of the step's class whose ``run`` is ``run``; undo and compensate stay.

    With ``index``, only map element ``index`` calls ``run``; other elements run the
    original body. It keeps the original's module and qualified name, so the run's stored
    shape does not change: a run started with the replacement can continue without it, and
    back.
    """
    original = spec.impl

    def body(self: Step, **arguments: Any) -> Any:
        if index is not None:
            from .engine.elements import current_element

            element = current_element()
            if element is None or element.index != index:
                return original.run(self, **arguments)
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
def _swapped(reactor: type[Reactor], definition: ReactorDefinition) -> Iterator[None]:
    """Make ``definition`` ``reactor``'s definition while the block runs; restore on exit.

    Workers find reactors through the registry: while the block runs, the registry returns
    this class for its name.
    """
    from . import registry

    previous: ReactorDefinition = reactor.definition
    registered = registry.all_reactors().get(previous.name)
    reactor.definition = definition
    registry.register(reactor)
    try:
        yield
    finally:
        reactor.definition = previous
        if registered is not None:
            registry.register(registered)


@contextlib.contextmanager
def _replaced(reactor: type[Reactor], impls: Mapping[str, type[Step]]) -> Iterator[None]:
    """Swap ``reactor.definition`` for one whose top-level steps use ``impls``."""
    definition: ReactorDefinition = reactor.definition
    for name, impl in impls.items():
        definition = _with_impl(definition, name, impl)
    with _swapped(reactor, definition):
        yield


@contextlib.contextmanager
def mock_step(
    reactor: type[Reactor],
    step: str,
    *,
    returns: Any = _UNSET,
    side_effect: Callable[..., Any] | None = None,
    raises: BaseException | type[BaseException] | None = None,
    wraps: Callable[..., Any] | None = None,
) -> Iterator[StepMock]:
    """Replace the body of ``reactor``'s ``step`` while the block runs.

    ``step`` is a step name or a path to a nested step: ``"ship.pack"`` is step ``pack`` of
    the reactor that step ``ship`` runs (``compose`` or ``async_reactor``; any depth,
    ``"a.b.c"``), ``"lines[3].charge"`` is step ``charge`` of element 3 of the map ``lines``
    (``"lines[*].charge"``: of every element; ``"lines[*]"`` when the element is one step).
    A step of a composed reactor is replaced in that reactor's class, so wherever the class
    runs while the block is open; a step of map elements only in that map.

    Give one of ``returns`` (the value the step returns: a plain value, ``Success``,
    ``Failure``, ``Halt`` or ``Skip``), ``side_effect`` (called with the step's arguments as
    keywords; what it returns or raises is the step's), ``raises`` (an exception to raise) or
    ``wraps`` (called as ``wraps(original, **arguments)``, where ``original(**arguments)``
    runs the step's own body; what it returns or raises is the step's). The step's ``undo``
    and ``compensate`` stay as they are.
    """
    given = [returns is not _UNSET, side_effect is not None, raises is not None, wraps is not None]
    if sum(given) != 1:
        raise TypeError(
            "mock_step() takes exactly one of returns=, side_effect=, raises= or wraps="
        )
    target = _resolve(reactor, step)
    record = StepMock(reactor, step)

    def run(instance: Step, arguments: dict[str, Any]) -> Any:
        from .engine.elements import current_element

        record.calls.append(dict(arguments))
        element = current_element()
        if element is not None:
            record.indices.append(element.index)
        if raises is not None:
            raise raises
        if side_effect is not None:
            return side_effect(**arguments)
        if wraps is not None:
            return wraps(functools.partial(target.spec.impl.run, instance), **arguments)
        return returns

    impl = _impl_with_run(target.spec, run, index=target.index)
    with _swapped(target.owner, target.definition_with(impl)):
        yield record


def fail_step(
    reactor: type[Reactor],
    step: str,
    error: BaseException | str = "failed by fail_step()",
    *,
    retryable: bool = False,
) -> contextlib.AbstractContextManager[StepMock]:
    """Make ``step`` fail while the block runs (by default without retries).

    ``step`` is a name or a path, as for :func:`mock_step` (``"ship.pack"``,
    ``"lines[3].charge"``, ``"lines[*].charge"``). ``error`` is an exception to raise or a
    message. With ``retryable=False`` the step returns
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
        """:func:`mock_step` for the rest of the test: ``mock_step(R, "charge", returns=1)``
        (or a path: ``"ship.pack"``, ``"lines[3].charge"``)."""
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
    from .coordination.runtime import backend_key

    holder = get_backend().lock_holder(backend_key("lock", key))
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
    from .coordination.runtime import backend_key

    return limit - len(get_backend().semaphore_holders(backend_key("semaphore", key)))


def rate_limit_count(key: str, seconds: float, *, name: bool = False) -> int:
    """Starts charged to rate limit ``key`` (or the named limit ``key``) in the last
    ``seconds``."""
    from .coordination import Window, get_backend
    from .coordination.rates import named_rate_limit
    from .coordination.runtime import backend_key

    full = named_rate_limit(key)[0] if name else backend_key("rate", key)
    return get_backend().rate_count(full, Window(1_000_000, seconds))
