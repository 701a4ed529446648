"""What a run has done so far: its results, its undo stack and what waits.

Empty for a new run. For a run that goes on after a stop (a worker's claim, an undo, a payload
accepted), :meth:`RunState.restore` rebuilds it from the run's records (:class:`RunRecords`,
read through the journal): each record is folded by its step's construct
(:meth:`~.constructs.base.Construct.restore`), so what a status means is said once, beside the
code that writes it. The executor and its constructs then change the state as steps complete,
fail, wait and roll back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..states import ExecutionStatus, RollbackStatus, StepStatus
from .constructs import construct_for
from .constructs.step import STEP
from .outcomes import ErrorInfo, ErrorKind, RollbackFailure

if TYPE_CHECKING:
    from .journal import RecordedStep, RunRecords
    from .spec import ReactorDefinition


@dataclass(slots=True)
class UndoEntry:
    """A completed step waiting on the undo stack."""

    step: str
    arguments: dict[str, object]
    result: object


@dataclass(slots=True)
class PendingCompensation:
    """A failed (or interrupted) step whose compensate has not run yet."""

    step: str
    arguments: dict[str, object]
    error: ErrorInfo


@dataclass(slots=True)
class RunState:
    """What a run has done so far (empty for a new run, restored from its records otherwise)."""

    results: dict[str, object] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    undo_stack: list[UndoEntry] = field(default_factory=list)
    pending_compensation: list[PendingCompensation] = field(default_factory=list)
    next_seq: int = 1
    # Attempts a step already made before this process took the run (a retry resumed later).
    attempts_done: dict[str, int] = field(default_factory=dict)
    # Steps an earlier process of the run may have started without recording an outcome (its
    # retries' attempts, or in flight when it stopped): their patch decisions (``patches``).
    attempted_before: set[str] = field(default_factory=set)
    # Async units dispatched whose outcome no reader has collected yet.
    units: set[str] = field(default_factory=set)
    # Every step with a record (done, failed, halted or dispatched), as restored.
    recorded: set[str] = field(default_factory=set)
    # Interrupts reached whose payload has not come yet.
    waiting: set[str] = field(default_factory=set)
    # Interrupts whose payload was accepted while the run was paused: recorded as their steps'
    # results when the run continues.
    claimed: dict[str, object] = field(default_factory=dict)
    # Sleeps reached, by step: the time (ISO 8601) each waits until.
    sleeping: dict[str, str] = field(default_factory=dict)
    # Restored from a run that was rolling back: it finishes its rollback.
    rolling_back: bool = False
    # The run's failure as stored (restored), and whether one of its steps failed.
    failure: ErrorInfo | None = None
    step_failed: bool = False
    # Restored for a rollback: the run's process stopped while steps were in flight
    # (``abandoned``), and the steps that may have started without recording an outcome
    # (``in_flight``), which the rollback compensates.
    abandoned: bool = False
    in_flight: list[str] = field(default_factory=list)
    # Whether a step whose rollback failed is rolled back again: yes for an operator's undo
    # (that is what it asks for); no when a rollback its process did not finish is resumed
    # (handlers are not retried by themselves): its failure stays, in ``rollback_failures``.
    retry_failed_rollbacks: bool = True
    rollback_failures: list[RollbackFailure] = field(default_factory=list)

    # -- what constructs record --------------------------------------------------------------

    def completed(
        self, step: str, arguments: dict[str, object], value: object, *, undo: bool
    ) -> None:
        """``step`` is done with ``value``; ``undo``: it goes on the undo stack."""
        self.results[step] = value
        self.done.add(step)
        if undo:
            self.undo_stack.append(UndoEntry(step, arguments, value))

    def compensation_due(self, step: str, arguments: dict[str, object], error: ErrorInfo) -> None:
        """``step`` failed after its work started: a rollback compensates it."""
        self.pending_compensation.append(PendingCompensation(step, arguments, error))

    def rolled_back_in_place(self, step: str) -> None:
        """``step`` has work of its own that a rollback undoes where the step stands, though it
        recorded no value (a composed child, a map's elements)."""
        self.undo_stack.append(UndoEntry(step, {}, None))

    def forget_undo(self, step: str) -> None:
        """Take ``step`` off the undo stack (it goes on, and records its own entry when done)."""
        self.undo_stack[:] = [entry for entry in self.undo_stack if entry.step != step]

    def rolls_back(self, record: RecordedStep) -> bool:
        """Whether a rollback of this run rolls the step of ``record`` back: it never was, or
        its rollback failed and :attr:`retry_failed_rollbacks`. A failure that is not tried
        again is kept in :attr:`rollback_failures` (the run's rollback reports it)."""
        if record.rollback == RollbackStatus.NONE:
            return True
        if record.rollback != RollbackStatus.FAILED:
            return False
        if self.retry_failed_rollbacks:
            return True
        error = record.rollback_error or {}
        self.rollback_failures.append(
            RollbackFailure.from_dict(error)
            if error.get("step") and error.get("action")
            else RollbackFailure(
                step=record.step,
                action="undo",
                exception_class=None,
                message=str(error.get("message") or "its rollback failed"),
            )
        )
        return False

    @property
    def rollback_due(self) -> bool:
        """Whether a rollback has anything to do."""
        return bool(self.undo_stack or self.pending_compensation or self.in_flight)

    # -- restoring ---------------------------------------------------------------------------

    @classmethod
    def restore(
        cls, definition: ReactorDefinition, records: RunRecords, *, for_rollback: bool = False
    ) -> RunState:
        """The state of a run of ``definition`` that holds ``records``.

        Each step record is folded by its step's construct (a record of a step the definition
        no longer has, by the plain step's). A run restored while rolling back knows the steps
        that were in flight alongside the failed one. With ``for_rollback`` (an operator's
        undo of a stopped run, a paused run failed) it also knows what the run stopped inside
        (a composed child or a map that halted or waited) and every step that may have started
        without recording an outcome (``records`` read ``for_rollback``).
        """
        rolling_back = records.status == ExecutionStatus.ROLLING_BACK
        state = cls(
            next_seq=records.last_seq + 1,
            rolling_back=rolling_back,
            failure=ErrorInfo.from_dict(dict(records.failure)) if records.failure else None,
            retry_failed_rollbacks=for_rollback or not rolling_back,
        )
        by_name = definition.by_name
        for record in records.steps:
            spec = by_name.get(record.step)
            state.recorded.add(record.step)
            construct = construct_for(spec) if spec is not None else STEP
            construct.restore(state, spec, record)
            if record.status == StepStatus.FAILED and (
                not record.error or record.error.get("kind") != ErrorKind.INTERRUPTED
            ):
                state.step_failed = True
        if records.current_attempt and records.current_step:
            state.attempts_done[records.current_step] = records.current_attempt
            # Steps that ran side by side may have parked for their retries together: the
            # attempts each made are in its retry entries.
            state.attempts_done.update(
                (step, attempts)
                for step, attempts in records.retry_attempts.items()
                if step not in state.done
            )
        state.attempted_before = _attempted_before(state, records)
        if for_rollback:
            state._plan_undo(definition, records)
        elif state.rolling_back:
            state._adopt_launched(definition, records)
        return state

    def _plan_undo(self, definition: ReactorDefinition, records: RunRecords) -> None:
        """What an undo of the stopped run rolls back besides its records."""
        by_name = definition.by_name
        for record in records.steps:
            spec = by_name.get(record.step)
            if record.status == StepStatus.HALTED and spec is not None:
                # It halted inside its child or its map: what they completed is undone.
                construct_for(spec).restore_unfinished(self, spec)
        cursor = records.current_step
        spec = by_name.get(cursor)
        if spec is not None and cursor not in self.recorded and cursor in records.nested_work:
            # It stopped while its child waited or its map ran: it has no record yet.
            construct_for(spec).restore_unfinished(self, spec)
        self.abandoned = _abandoned(records)
        if not self.abandoned:
            return
        if (
            spec is not None
            and spec.map is None  # a map's elements say themselves what they did
            and cursor not in self.recorded
        ):
            self.in_flight.append(cursor)
        self._adopt_launched(definition, records, skip={cursor})

    def _adopt_launched(
        self,
        definition: ReactorDefinition,
        records: RunRecords,
        *,
        skip: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        """Steps started side by side that never recorded an outcome were in flight when the
        run's process stopped: each is compensated like the step the cursor names."""
        if definition.max_concurrency < 2:
            return
        for name in records.launched:
            if (
                name in definition.by_name
                and name not in skip
                and name not in self.recorded
                and name not in self.in_flight
            ):
                self.in_flight.append(name)


def _attempted_before(state: RunState, records: RunRecords) -> set[str]:
    """The steps without an outcome that an earlier process of the run may have started: one
    whose failed attempts wait for a retry, and, when the run was taken over from a process
    that stopped mid-run, the step its cursor names and those it started side by side."""
    started = set(state.attempts_done)
    if records.taken_over:
        started.add(records.current_step)
        started.update(records.launched)
    started.discard("")
    return started - state.done


def _abandoned(records: RunRecords) -> bool:
    """Whether the step the run's cursor names may have started without recording an outcome.

    True for a run whose process died mid-step (still running or rolling back, cancelled while
    so, or parked after killing its workers too often), and for a step that made failed
    attempts and was waiting for its next one.
    """
    status = records.status
    if status in (ExecutionStatus.RUNNING, ExecutionStatus.ROLLING_BACK):
        return True
    if records.current_attempt:
        return True
    if status == ExecutionStatus.NEEDS_ATTENTION:
        return (
            bool(records.failure)
            and (records.failure or {}).get("kind") == ErrorKind.RECOVERY_LIMIT
        )
    return status == ExecutionStatus.CANCELLED and records.cancelled_while_running
