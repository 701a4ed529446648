"""Running a reactor in a test and asserting what it did: ``run_reactor`` and its result."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    from ..engine.outcomes import Outcome
    from ..handle import ExecutionHandle
    from ..reactor import Reactor
    from ..runtime.maps import ElementResult

# pytest loads this package through the ``pytest11`` entry point before Django is configured:
# nothing here may import models or settings at import time, so imports are inside functions.


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
        from ..store import outbox  # the plugin loads before Django is set up

        previous = outbox.register_publisher(self, after_commit=False)
        try:
            yield
        finally:
            outbox.register_publisher(previous[0], after_commit=previous[1])

    def publish(self, dispatches: Sequence[Any]) -> list[int]:
        """The outbox's publisher while capturing: keep the tasks, as if sent."""
        for d in dispatches:
            self.pending.append(
                (d.task, d.map_id) if d.map_id is not None else ("resume", d.execution_id)
            )
        return [d.dispatch_id for d in dispatches]


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
            from .. import services

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
        from .. import registry

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

        from .. import store  # the plugin loads before Django is set up

        owner, name = self._owner_of(step)
        run = store.maps.find(owner.execution_id, name) if owner.execution_id else None
        if run is None:
            spec = owner.reactor.definition.by_name.get(name)
            what = "is not a map_over() step" if spec is None or spec.map is None else "never ran"
            raise owner._fail(f"expected map step {name!r} to have run, but it {what}")
        return uuid.UUID(str(run.pk))

    def elements(self, step: str) -> MapElements:
        """Every element of the map ``step`` (``"ship.lines"``: of a child's map), in index
        order, with assertions about them."""
        from .. import store  # the plugin loads before Django is set up
        from ..runtime.maps import MapResults

        owner, name = self._owner_of(step)
        map_id = self._map_id(step)
        return MapElements(
            owner,
            name,
            map_id,
            list(MapResults(map_id).outcomes()),
            dict(store.maps.rollback_errors(map_id)),
        )

    def map_summary(self, step: str) -> dict[str, Any]:
        """The totals of the map ``step``: ``size``, ``succeeded``, ``failed``, ``halted``,
        ``not_started``, ``undone``, ``undo_failed``... and sampled ``failures``
        (``store.maps.summary``)."""
        from .. import store  # the plugin loads before Django is set up

        return store.maps.summary(self._map_id(step))

    # -- moving the run on
    def _refresh(self) -> None:
        from .. import services

        self._handle = None
        if self.execution_id is not None:
            self._handle = services.find(self.execution_id)
            self._outcome = self._handle.outcome

    def step_once(self) -> bool:
        """Run the oldest captured task as a worker would; False when none is queued."""
        from .. import services

        if not self._queue.pending:
            self._fast_forward()
        if not self._queue.pending:
            return False
        kind, target = self._queue.pending.pop(0)
        with self._queue.capturing():
            if kind == "resume":
                services.resume(target)
            else:
                from ..runtime import maps

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

        from ..states import MOVING_STATUSES

        deadline = time.monotonic() + timeout
        pause = 0.02
        while True:
            self._refresh()
            if self.status not in MOVING_STATUSES:
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
        from .. import store  # the plugin loads before Django is set up

        if self.execution_id is None:
            return
        if store.wake_now(self.execution_id):
            self._queue.pending.append(("resume", self.execution_id))

    def resume(self, step: str | None = None, payload: Any = None) -> ReactorResult:
        """Deliver ``payload`` to the interrupt ``step`` (``None``: the one waiting); then
        drain, unless the run was made with ``background="none"``."""
        from .. import services

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
        from ..states import ExecutionStatus

        if self.status != ExecutionStatus.COMPLETED:
            raise self._fail(f"expected the run to complete, but it is {self.status}")
        return self

    def assert_failed(self, step: str | None = None, kind: str | None = None) -> ReactorResult:
        """The run failed (at ``step``, with an error of ``kind``, when given)."""
        from ..engine.outcomes import Failed

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
        from ..engine.outcomes import Halted

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
        from .. import store  # the plugin loads before Django is set up

        return store.maps.summary(self.map_id)

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
    from .. import services

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
