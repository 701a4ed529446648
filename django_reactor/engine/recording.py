"""How a run records itself: trace entries, journal commits, step contexts, error reports and
the events its observers get.

The executor core (:mod:`.executor`) is a :class:`RunRecorder` that adds the loop and the
rollback rule; the constructs (:mod:`.constructs`) record what is their own through the same
methods, so that every construct writes the trace, the step records and the observer events
the same way.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..states import EventKind, ExecutionStatus, StepStatus
from .coordination import Coordinator
from .journal import Event, Journal, JournalBatch, StepTransaction, StepWrite
from .observers import ExecutionEvent, RunObserver, StepEvent, composite, summarise
from .outcomes import ErrorInfo, ErrorKind, RollbackFailure, qualified_class_name
from .redaction import redact
from .serialization import shown_items
from .state import RunState
from .step import StepContext
from .supervision import Watch

if TYPE_CHECKING:
    from .spec import ReactorDefinition, StepSpec

logger = logging.getLogger("django_reactor.executor")


class RunRecorder:
    """Writes one run's trace and step records through its journal and tells its observers."""

    def __init__(
        self,
        definition: ReactorDefinition,
        journal: Journal,
        *,
        inputs: Mapping[str, Any],
        state: RunState | None,
        clock: Callable[[], dt.datetime],
        observer: RunObserver | None,
        coordinator: Coordinator | None,
        hand_back_on_interruption: bool,
    ) -> None:
        self.definition = definition
        self.journal = journal
        self.inputs = inputs
        self.state = state or RunState()
        self.clock = clock
        # Lifecycle notifications, after each commit; None (the default) costs one test each.
        self.observer = composite(observer)
        # Locks, semaphores, rate limits, periods, ordered locks (None: nothing declared).
        self.coordinator = coordinator
        # In a worker, a process-level interruption (SystemExit, KeyboardInterrupt, MemoryError)
        # gives the run back for the message's redelivery instead of aborting it.
        self.hand_back_on_interruption = hand_back_on_interruption
        # The fencing numbers held for the step running now (its coordination), by lock key.
        self.fences: dict[str, int] = {}
        self._notes: list[Event] = []
        # The transaction of an atomic step's action that this thread's next commit joins.
        self._held = threading.local()
        # Steps running at the same time (Meta.max_concurrency) take sequence numbers and
        # change the run's state one at a time; uncontended otherwise.
        self.lock = threading.RLock()
        self._display_inputs: dict[str, Any] | None = None
        self._t0 = time.perf_counter()
        # The run's deadline: a run that parks wakes by it at the latest (the executor sets it).
        self.deadline: dt.datetime | None = None

    @property
    def execution_id(self) -> Any:
        """The id of the run this executor runs (None for a dry run)."""
        return self.journal.execution_id

    def note(self, kind: str, data: dict[str, Any] | None = None, *, step: str = "") -> None:
        """Add an entry to the trace (for example, a worker resuming the run).

        It is written with the next state change, in the same transaction: no commit of its own.
        """
        self._notes.append(self.event(kind, step=step, data=data))

    def commit(self, batch: JournalBatch) -> str | None:
        """Write ``batch`` with the pending notes; return a cancellation's reason, if asked.

        After :meth:`hold`, the batch joins the atomic action's transaction and commits with it.
        """
        return self.send(batch)()

    def send(self, batch: JournalBatch) -> Callable[[], str | None]:
        """Start writing ``batch`` (see :meth:`commit`); the function returned waits until it is
        written and returns what :meth:`commit` would. A lane's batches are written by the
        run's thread in the order they were sent; others are written before this returns."""
        with self.lock:
            if self.state.waiting and (
                batch.finished or batch.status == ExecutionStatus.ROLLING_BACK
            ):
                batch.close_interrupts = True
                self.state.waiting.clear()
            if self._notes:
                batch.events[:0] = self._notes
                self._notes = []
            if batch.wake_after is not None and self.deadline is not None:
                # Parked (a backoff, a sleep, a unit or a map): wake by the deadline at the
                # latest, to stop there.
                left = max((self.deadline - self.clock()).total_seconds(), 0.0)
                batch.wake_after = min(batch.wake_after, left)
                batch.dispatch_delay = min(batch.dispatch_delay, left)
            transaction: StepTransaction | None = getattr(self._held, "transaction", None)
            self._held.transaction = None
        if transaction is None:
            write = getattr(self._held, "write", None)  # a lane's writes go through the run's
            if write is not None:
                return write(batch)
            cancel = self.journal.commit(batch)
            return lambda: cancel
        try:
            cancel = self.journal.commit(batch)
        except BaseException:
            transaction.rollback()
            raise
        transaction.commit()
        return lambda: cancel

    def write_through(
        self, write: Callable[[JournalBatch], Callable[[], str | None]] | None
    ) -> None:
        """Send this thread's batches (but those that join an atomic step's transaction,
        which is this thread's) through ``write``; None: to the journal again."""
        self._held.write = write

    def hold(self, transaction: StepTransaction) -> None:
        """An atomic action's body returned: the next commit of this thread records it inside
        ``transaction``, so that its writes and its checkpoint commit together."""
        self._held.transaction = transaction

    def drop_held(self) -> None:
        """Roll back a held transaction that no checkpoint joined (what the body returned was
        not recorded as done after all, or the process is stopping)."""
        transaction: StepTransaction | None = getattr(self._held, "transaction", None)
        if transaction is not None:
            self._held.transaction = None
            transaction.rollback()

    def event(
        self,
        kind: str,
        *,
        step: str = "",
        attempt: int = 0,
        duration_ms: float | None = None,
        data: dict[str, Any] | None = None,
    ) -> Event:
        """The next trace entry (it takes the next sequence number)."""
        with self.lock:
            seq = self.state.next_seq
            self.state.next_seq = seq + 1
        return Event(seq, kind, self.clock(), step, attempt, duration_ms, data or {})

    def context(self, spec: StepSpec, action: str, attempt: int) -> StepContext:
        """The :class:`StepContext` of one action of a step."""
        return StepContext(
            execution_id=self.execution_id,
            reactor=self.definition.name,
            step=spec.name,
            action=action,
            attempt=attempt,
            inputs=self.inputs,
            fences=self.fences
            or (dict(self.coordinator.fences) if self.coordinator is not None else {}),
            atomic=spec.atomic,
            watch=Watch(self.journal, spec.name) if action == "run" else None,
        )

    def next_after(self, spec: StepSpec) -> StepSpec | None:
        """The step that runs next once ``spec`` is done."""
        return self.definition.next_ready(self.state.done | {spec.name}, self.state.waiting)

    def redacted_inputs(self) -> dict[str, Any]:
        """The run's inputs as error reports show them: displayable, secrets redacted."""
        if self._display_inputs is None:
            self._display_inputs = redact(
                shown_items(self.inputs), self.definition.input_secret_paths
            )
        return self._display_inputs

    def redacted_arguments(self, spec: StepSpec, arguments: dict[str, Any]) -> dict[str, Any]:
        """A step's arguments as error reports show them: displayable, secrets redacted."""
        return redact(shown_items(arguments), spec.argument_secret_paths())

    def step_error(
        self,
        spec: StepSpec,
        kind: str,
        message: str,
        *,
        arguments: dict[str, Any] | None = None,
        **fields: Any,
    ) -> ErrorInfo:
        """An :class:`ErrorInfo` for ``spec`` of this run (with ``arguments`` when given)."""
        return ErrorInfo(
            kind=kind,
            message=message,
            step=spec.name,
            reactor=self.definition.name,
            inputs=self.redacted_inputs(),
            arguments=self.redacted_arguments(spec, arguments) if arguments is not None else {},
            **fields,
        )

    def error_info(
        self,
        exc: BaseException,
        kind: str,
        spec: StepSpec,
        arguments: dict[str, Any],
        attempts: int,
    ) -> ErrorInfo:
        """An :class:`ErrorInfo` describing ``exc``, raised for ``spec`` (never retryable)."""
        return ErrorInfo.from_exception(
            exc,
            kind=kind,
            step=spec.name,
            reactor=self.definition.name,
            retryable=False,
            attempts=attempts,
            inputs=self.redacted_inputs(),
            arguments=self.redacted_arguments(spec, arguments),
        )

    # ------------------------------------------------------------------ failures

    def _failed_step(
        self,
        spec: StepSpec,
        error: ErrorInfo,
        arguments: dict[str, Any],
        *,
        attempts: int,
        started_at: dt.datetime | None,
        compensable: bool,
    ) -> JournalBatch:
        """The ``fail`` trace entry and the failed step record, as one batch to commit."""
        event = self.event(
            EventKind.FAIL,
            step=spec.name,
            attempt=attempts,
            data={
                "kind": error.kind,
                "error": error.message,
                "exception_class": error.exception_class,
            },
        )
        return JournalBatch(
            events=[event],
            step=StepWrite.of(
                spec,
                StepStatus.FAILED,
                event,
                attempts,
                arguments,
                started_at,
                error=error.to_dict(),
                compensable=compensable,
            ),
            current_step=spec.name,
        )

    def abort(
        self,
        exc: BaseException,
        *,
        spec: StepSpec | None = None,
        arguments: dict[str, Any] | None = None,
        attempt: int = 0,
        started_at: dt.datetime | None = None,
    ) -> None:
        """Record that the process was interrupted; the undo stack stays for ``undo()``.

        In a worker (``hand_back_on_interruption``) the run is not aborted: it keeps its status
        and its lease ends now, so the redelivered message (or the sweeper) resumes it at once,
        counting one recovery; the step that was in flight runs again.
        """
        try:
            self.drop_held()  # an atomic step's writes never commit with an abort
        except Exception:
            logger.debug("rolling back an atomic step's transaction failed", exc_info=True)
        if self.hand_back_on_interruption:
            self._hand_back(exc, spec=spec, attempt=attempt)
            return
        if spec is not None:
            error = self.error_info(exc, ErrorKind.INTERRUPTED, spec, arguments or {}, attempt)
            batch = self._failed_step(
                spec,
                error,
                arguments or {},
                attempts=attempt,
                started_at=started_at,
                # An atomic step's writes were rolled back with its transaction.
                compensable=not spec.atomic,
            )
            batch.failure = error.to_dict()
        else:
            batch = JournalBatch()
        batch.status = ExecutionStatus.ABORTED
        batch.finished = True
        batch.events.append(
            self.event(EventKind.ABORT, data={"exception_class": qualified_class_name(exc)})
        )
        try:
            self.commit(batch)
        except Exception:  # the interruption must still propagate; say what was lost
            logger.exception(
                "could not record that execution %s was aborted; it stays in its last "
                "checkpointed state",
                self.execution_id,
            )

    def _hand_back(self, exc: BaseException, *, spec: StepSpec | None, attempt: int) -> None:
        data: dict[str, Any] = {"exception_class": qualified_class_name(exc), "resumable": True}
        if attempt:
            data["attempt"] = attempt
        batch = JournalBatch(
            events=[self.event(EventKind.HAND_BACK, step=spec.name if spec else "", data=data)],
            expire_lease=True,
        )
        try:
            self.commit(batch)
        except Exception:  # the interruption must still propagate; the lease lapses by itself
            logger.exception(
                "could not hand execution %s back after the process was interrupted; it is "
                "resumed when its lease expires",
                self.execution_id,
            )

    # ------------------------------------------------------------------ observer events

    def run_event(
        self,
        status: str,
        *,
        failure: dict[str, Any] | None = None,
        **fields: Any,
    ) -> ExecutionEvent:
        """What the observers are told about the run (``failure``: its stored failure)."""
        if failure is not None:
            fields.setdefault("step", failure.get("step"))
            fields["error"] = summarise(failure.get("message"))
            fields["error_class"] = failure.get("exception_class")
        return ExecutionEvent(
            execution_id=self.execution_id,
            reactor=self.definition.name,
            status=str(status),
            duration_ms=(time.perf_counter() - self._t0) * 1000,
            **fields,
        )

    def step_event(self, step: str, status: str, attempt: int, **fields: Any) -> StepEvent:
        """What the observers are told about a step."""
        if "error" in fields:
            fields["error"] = summarise(fields["error"])
        return StepEvent(
            execution_id=self.execution_id,
            reactor=self.definition.name,
            step=step,
            status=str(status),
            attempt=attempt,
            **fields,
        )

    def notify_parked(self, step: str, reason: str, delay: float) -> None:
        """Tell the observers that the run parked (``reason``) for ``delay`` seconds."""
        if self.observer is not None:
            self.observer.execution_parked(
                self.run_event(ExecutionStatus.PENDING, step=step, reason=reason, delay=delay)
            )

    def notify_rollback(
        self,
        action: str,
        step: str,
        status: str,
        duration: float | None,
        failure: RollbackFailure | None,
    ) -> None:
        """Tell the observers that a step was undone or compensated (or could not be)."""
        if self.observer is None:
            return
        event = self.step_event(
            step,
            status,
            1,
            duration_ms=duration,
            error=failure.message if failure is not None else None,
            error_class=failure.exception_class if failure is not None else None,
        )
        if action == "undo":
            self.observer.step_undone(event)
        else:
            self.observer.step_compensated(event)
