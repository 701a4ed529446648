"""How a run records itself: trace entries, checkpoints, parks, step outcomes, step contexts
and error reports.

The executor core (:mod:`.executor`) is a :class:`RunRecorder` that adds the loop and the
rollback rule; the constructs (:mod:`.constructs`) record what is their own through the
:class:`~.context.RunContext` it implements, and the side-by-side lanes (:mod:`.lanes`)
record a step's outcome with the same :meth:`RunRecorder.record_step` as the loop, so that
every construct and every lane writes the trace, the step records and the observer events the
same way.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from ..exceptions import ResultNotSerializable
from ..states import EventKind, ExecutionStatus, StepStatus
from . import probes
from .constructs import construct_for
from .constructs.base import StepDone, StepFailed, StepHalted
from .context import RunPolicy
from .coordination import Coordinator
from .journal import Event, Journal, JournalBatch, StepTransaction, StepWrite, StopRequest
from .notices import SILENT, Notices
from .observers import RunObserver, composite
from .outcomes import ErrorInfo, ErrorKind, Rescheduled, qualified_class_name
from .patches import Patches
from .redaction import redact
from .serialization import JSONMapping, JSONObject, JSONValue, encode, roundtrip, shown, shown_items
from .state import RunState, UndoEntry
from .step import StepContext
from .supervision import Watch

if TYPE_CHECKING:
    from .spec import ReactorDefinition, StepSpec

logger = logging.getLogger("django_reactor.executor")


@dataclass(slots=True)
class Recorded:
    """A step's outcome, recorded: ``kind`` is ``done`` (completed or skipped), ``failed`` or
    ``halted``. The checkpoint may still be on its way (a lane's goes through the run's
    thread): :meth:`wait` until it is written."""

    kind: str
    wait: Callable[[], StopRequest | None]
    error: ErrorInfo | None = None
    reason: object = None
    #: The run's value, when the step's checkpoint also completed the run.
    value: object = None


class RunRecorder:
    """Writes one run's trace and step records through its journal and tells its observers."""

    def __init__(
        self,
        definition: ReactorDefinition,
        journal: Journal,
        *,
        inputs: Mapping[str, object],
        state: RunState | None,
        clock: Callable[[], dt.datetime],
        sleep: Callable[[float], None],
        policy: RunPolicy,
        observer: RunObserver | None,
        coordinator: Coordinator | None,
    ) -> None:
        self.definition = definition
        self.journal = journal
        self.inputs = inputs
        self.state = state or RunState()
        self.clock = clock
        self._sleep = sleep
        self.policy = policy
        # Lifecycle notifications, after each commit; None (the default) costs one test each.
        observers = composite(observer)
        # A run nobody observes (a map's element: many of them) shares one silent Notices.
        self.notices = (
            Notices(observers, definition.name, journal) if observers is not None else SILENT
        )
        # Locks, semaphores, rate limits, periods, ordered locks (None: nothing declared).
        self.coordinator = coordinator
        # The run's patch decisions, read on first use (None: a map's element keeps none).
        self.patches = Patches(journal) if policy.keeps_patches else None
        # The fencing numbers held for the step running now (its coordination), by lock key.
        self.fences: dict[str, int] = {}
        self._notes: list[Event] = []
        # The transaction of an atomic step's action that this thread's next commit joins.
        self._held = threading.local()
        # Steps running at the same time (Meta.max_concurrency) take sequence numbers and
        # change the run's state one at a time; uncontended otherwise.
        self.lock = threading.RLock()
        self._display_inputs: JSONObject | None = None
        # The run's first failure or halt recorded ("failed", "halted"): with steps side by
        # side, the steps still in flight settle without changing how the run ends.
        self.stopping: str | None = None

    @property
    def execution_id(self) -> UUID | None:
        """The id of the run this executor runs (None for a dry run)."""
        return self.journal.execution_id

    def note(self, kind: str, data: JSONMapping | None = None, *, step: str = "") -> None:
        """Add an entry to the trace (for example, a worker resuming the run).

        It is written with the next state change, in the same transaction: no commit of its own.
        """
        self._notes.append(self.event(kind, step=step, data=data))

    def commit(self, batch: JournalBatch) -> StopRequest | None:
        """Write ``batch`` with the pending notes; return what an operator asked of the run
        (cancel it, pause it), if anything.

        After :meth:`hold`, the batch joins the atomic action's transaction and commits with it.
        """
        return self.send(batch)()

    def send(self, batch: JournalBatch) -> Callable[[], StopRequest | None]:
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
            deadline = self.policy.deadline
            if batch.wake_after is not None and deadline is not None:
                # Parked (a backoff, a sleep, a unit or a map): wake by the deadline at the
                # latest, to stop there.
                left = max((deadline - self.clock()).total_seconds(), 0.0)
                batch.wake_after = min(batch.wake_after, left)
                batch.dispatch_delay = min(batch.dispatch_delay, left)
            held = self._held
            transaction: StepTransaction | None = getattr(held, "transaction", None)
            if transaction is not None:
                held.transaction = None
        if transaction is None:
            write = getattr(held, "write", None)  # a lane's writes go through the run's
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
        self, write: Callable[[JournalBatch], Callable[[], StopRequest | None]] | None
    ) -> None:
        """Send this thread's batches (but those that join an atomic step's transaction,
        which is this thread's) through ``write``; None: to the journal again."""
        self._held.write = write

    def hold(self, transaction: StepTransaction) -> None:
        """An atomic action's body returned: the next commit of this thread records it inside
        ``transaction``, so that its writes and its checkpoint commit together."""
        self._held.transaction = transaction

    def begin(self, step: str, action: str) -> StepTransaction:
        """Open the transaction an atomic step's ``action`` runs in (see ``Journal.begin``)."""
        return self.journal.begin(step, action)

    def thread_finished(self) -> None:
        """A thread that ran a step's body ends: the journal gives back what it took there."""
        self.journal.thread_finished()

    def ensure_owned(self) -> None:
        """Raise ``LeaseLost`` when another process has taken the run (``Journal.ensure_owned``)."""
        self.journal.ensure_owned()

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
        data: JSONMapping | None = None,
    ) -> Event:
        """The next trace entry (it takes the next sequence number)."""
        with self.lock:
            seq = self.state.next_seq
            self.state.next_seq = seq + 1
        return Event(seq, kind, self.clock(), step, attempt, duration_ms, data or {})

    def sleep(self, seconds: float) -> None:
        """Wait in this process (an inline retry's backoff)."""
        self._sleep(seconds)

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
            publish_limit=self.policy.publish_max_bytes,
            keeps_attributes=self.policy.keeps_attributes,
            patches=self.patches,
            attempted_before=spec.name in self.state.attempted_before,
        )

    def next_after(self, spec: StepSpec) -> StepSpec | None:
        """The step that runs next once ``spec`` is done."""
        return self.definition.next_ready(self.state.done | {spec.name}, self.state.waiting)

    def redacted_inputs(self) -> JSONObject:
        """The run's inputs as error reports show them: displayable, secrets redacted."""
        if self._display_inputs is None:
            self._display_inputs = redact(
                shown_items(self.inputs), self.definition.input_secret_paths
            )
        return self._display_inputs

    def redacted_arguments(self, spec: StepSpec, arguments: dict[str, object]) -> JSONObject:
        """A step's arguments as error reports show them: displayable, secrets redacted."""
        return redact(shown_items(arguments), spec.argument_secret_paths())

    def step_error(
        self,
        spec: StepSpec,
        kind: str,
        message: str,
        *,
        arguments: dict[str, object] | None = None,
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
        arguments: dict[str, object],
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

    def failed_step(
        self,
        spec: StepSpec,
        error: ErrorInfo,
        arguments: dict[str, object],
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
        arguments: dict[str, object] | None = None,
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
        if self.policy.hand_back_on_interruption:
            self._hand_back(exc, spec=spec, attempt=attempt)
            return
        if spec is not None:
            error = self.error_info(exc, ErrorKind.INTERRUPTED, spec, arguments or {}, attempt)
            batch = self.failed_step(
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
        data: JSONObject = {"exception_class": qualified_class_name(exc), "resumable": True}
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

    # ------------------------------------------------------------------ parks and outcomes

    def park(
        self,
        step: str,
        *,
        reason: str,
        delay: float,
        event: Event,
        by_task: bool = False,
        record: StepWrite | None = None,
        attempt: int | None = None,
        status: str | None = None,
        tell: bool = True,
    ) -> Rescheduled:
        """Release the run until ``delay`` seconds from now (by its deadline at the latest),
        writing ``event`` (and ``record``, the step's) with the park. ``by_task``: a task
        wakes the run (a composed child's parent holds it); otherwise the sweeper does, or the
        work it waits for. ``attempt``: the attempts the step in flight made (a retry)."""
        status = status or ExecutionStatus.PENDING
        batch = JournalBatch(
            events=[event],
            step=record,
            status=status,
            current_step=step or None,
            current_attempt=attempt,
            release=True,
            wake_after=delay,
            dispatch="retry" if by_task and not self.policy.attached else None,
            dispatch_delay=delay,
        )
        self.commit(batch)
        delay = batch.wake_after if batch.wake_after is not None else delay
        if tell:
            self.notices.parked(step, reason, delay)
        return Rescheduled(
            execution_id=self.execution_id, step=step, delay=delay, reason=reason, status=status
        )

    def record_step(
        self,
        spec: StepSpec,
        result: StepDone | StepFailed | StepHalted,
        arguments: dict[str, object],
        started_at: dt.datetime | None,
        *,
        current_step: str | None = None,
        completes: bool = False,
    ) -> Recorded:
        """Record how ``spec`` ended, for the loop and for a lane alike: its record and trace
        entry, and the state. A completed step's value that cannot be stored fails it.

        The run's first failure starts its rollback (``rolling_back``), its first halt ends it
        (``halted``), unless the other came first; ``completes``: the completed step was the
        last, and its checkpoint completes the run. ``current_step``: the cursor to write with
        a completed step (the step that runs next).
        """
        if isinstance(result, StepDone):
            try:
                stored, value = roundtrip(result.value)
            except ResultNotSerializable as bad:
                self.drop_held()  # an atomic step's writes go with the value they returned
                error = self.error_info(bad, ErrorKind.RESULT, spec, arguments, result.attempts)
                result = StepFailed(error, started=not spec.atomic, attempts=result.attempts)
            else:
                return self._record_done(
                    spec, result, arguments, stored, value, started_at, current_step, completes
                )
        if isinstance(result, StepFailed):
            return self._record_failure(spec, result, arguments, started_at)
        return self._record_halt(spec, result, arguments, started_at)

    def _record_done(
        self,
        spec: StepSpec,
        done: StepDone,
        arguments: dict[str, object],
        stored: JSONValue,
        value: object,
        started_at: dt.datetime | None,
        current_step: str | None,
        completes: bool,
    ) -> Recorded:
        status = StepStatus.SKIPPED if done.skipped else StepStatus.COMPLETED
        if probes.active is not None:
            probes.active("before_step_commit", spec.name)
        run_value = None
        with self.lock:
            # The entry's number, the order of the commits and the undo stack agree: the
            # rollback rule undoes the newest first, in the order the trace shows.
            event = self.event(
                EventKind.SKIP if done.skipped else EventKind.RUN,
                step=spec.name,
                attempt=done.attempts,
                duration_ms=done.duration_ms,
            )
            batch = JournalBatch(
                events=[event],
                step=StepWrite.of(
                    spec, status, event, done.attempts, arguments, started_at, result=stored
                ),
                current_step=current_step,
                published=done.published or None,
                attributes=done.attributes or None,
            )
            state = self.state  # as state.completed(), without the call: a map's hot path
            state.results[spec.name] = value
            state.done.add(spec.name)
            if not done.skipped:
                state.undo_stack.append(UndoEntry(spec.name, arguments, value))
            if completes:
                # The last step: its checkpoint and the run's completion commit together.
                if done.successor is not None:
                    # ...and, continuing as new, the successor's creation.
                    batch.events.append(
                        self.event(
                            EventKind.CONTINUE,
                            data={
                                "continued_as": str(done.successor.execution_id),
                                "step": spec.name,
                            },
                        )
                    )
                    batch.successor = done.successor
                run_value = self.completion(batch)
            written = self.send(batch)
        if self.notices.observer is None and probes.active is None:
            return Recorded("done", written, value=run_value)  # a map's element: nothing to tell

        def wait() -> StopRequest | None:
            cancel = written()
            self.notices.step_completed(spec.name, status, done.attempts, done.duration_ms)
            if probes.active is not None:
                probes.active("after_step_commit", spec.name)
            return cancel

        return Recorded("done", wait, value=run_value)

    def _record_failure(
        self,
        spec: StepSpec,
        failed: StepFailed,
        arguments: dict[str, object],
        started_at: dt.datetime | None,
    ) -> Recorded:
        error = failed.error
        if failed.arguments is not None:
            arguments = failed.arguments
        with self.lock:
            batch = self.failed_step(
                spec,
                error,
                arguments,
                attempts=failed.attempts,
                started_at=started_at,
                compensable=failed.started,
            )
            if self.stopping is None:
                self.stopping = "failed"
                batch.status = ExecutionStatus.ROLLING_BACK
                batch.failure = error.to_dict()  # known now, even if rollback is cut short
            written = self.send(batch)
            if failed.started:
                self.state.compensation_due(spec.name, arguments, error)

        def wait() -> StopRequest | None:
            cancel = written()
            self.notices.step_failed(spec.name, error, failed.attempts)
            return cancel

        return Recorded("failed", wait, error=error)

    def _record_halt(
        self,
        spec: StepSpec,
        halted: StepHalted,
        arguments: dict[str, object],
        started_at: dt.datetime | None,
    ) -> Recorded:
        reason = shown(halted.reason)
        with self.lock:
            event = self.event(
                EventKind.HALT,
                step=spec.name,
                attempt=halted.attempts,
                duration_ms=halted.duration_ms,
                data={"reason": reason},
            )
            batch = JournalBatch(
                events=[event],
                step=StepWrite.of(
                    spec,
                    StepStatus.HALTED,
                    event,
                    halted.attempts,
                    arguments,
                    started_at,
                    result=reason,
                ),
            )
            if self.stopping is None:
                self.stopping = "halted"
                batch.status = ExecutionStatus.HALTED
                batch.current_step = spec.name
                batch.result = {"halted_at": spec.name, "reason": reason}
                batch.finished = True
            written = self.send(batch)
        return Recorded("halted", written, reason=halted.reason)

    def completion(self, batch: JournalBatch) -> object:
        """Make ``batch`` complete the run; return the run's value."""
        definition = self.definition
        if definition.returns is not None:
            value = self.state.results.get(definition.returns)
            stored = encode(value)
        else:
            value = {
                name: result
                for name, result in self.state.results.items()
                if construct_for(definition.by_name[name]).in_value
            }
            # Each result as its step stored it: nested one level deeper, still storable.
            stored = {name: encode(result) for name, result in value.items()}
        batch.events.append(self.event(EventKind.COMPLETE))
        batch.status = ExecutionStatus.COMPLETED
        batch.result = stored
        batch.result_secrets = definition.value_secret_paths
        batch.finished = True
        return value
