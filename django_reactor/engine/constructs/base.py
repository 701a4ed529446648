"""The protocol every construct implements, and what a construct hands back to the core.

A construct is one kind of step: a plain step, a composed child, an async unit, a map, an
interrupt, a sleep, a step held by coordination. The executor core (:mod:`..executor`) picks
the construct of each ready step, asks it to :meth:`Construct.run` the step and applies what
comes back; when the run fails it applies the rollback rule, asking the construct of each step
to :meth:`Construct.rollback` it; when a run goes on after a stop, the construct of each
recorded step folds its record back into the run's state (:meth:`Construct.restore`). A
construct sees the run through :class:`~..context.RunContext`, never the executor, and records
what is its own (a retry, a park, an interrupt reached) through it; completing, halting and
failing a step are recorded by the core, the same way for every construct.

A construct's ``run`` says how the step ended: :class:`StepDone` (completed or skipped, with its
value), :class:`StepHalted`, :class:`StepFailed` (with its error, started or not: only a started
step is compensated), :class:`Stop` (the construct parked, paused or dispatched the run: return
this outcome) or :data:`CONTINUE` (the construct recorded the step itself and the run goes on).
A step that parked runs again when the run resumes, and its construct continues where it
stopped; :meth:`Construct.catch_up`, :meth:`Construct.settle`, :meth:`Construct.pause` and
:meth:`Construct.parked` are the other points where a run stops and starts again.
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ...exceptions import ArgumentResolutionError
from ...states import EventKind, RollbackStatus, StepStatus
from ..journal import JournalBatch, RecordedStep, RollbackWrite
from ..outcomes import ErrorInfo, ErrorKind, Outcome, RollbackFailure
from ..serialization import JSONObject, JSONValue, decode, unstorable

if TYPE_CHECKING:
    from ..context import RunContext
    from ..continuation import SuccessorWrite
    from ..spec import StepSpec
    from ..state import RunState

#: What the rollback rule treats as the process stopping, never as a step failing (rule 6).
INTERRUPTIONS = (KeyboardInterrupt, SystemExit, MemoryError)

RollbackAction = Literal["undo", "compensate"]


# ---------------------------------------------------------------------------- step results


@dataclass(frozen=True, slots=True)
class StepDone:
    """The step completed with ``value`` (or, ``skipped``, did nothing and passes it on).

    The core stores the value, tracks a completed step for undo, and goes on.
    """

    value: object
    attempts: int
    duration_ms: float
    skipped: bool = False
    # What the step published (``context.publish``), stored with its record.
    published: Mapping[str, JSONValue] | None = None
    # The attributes the step set (``context.set_attribute``; None: removed).
    attributes: Mapping[str, str | None] | None = None
    # The step returned ContinueAsNew: the run completes with it, and this run follows.
    successor: SuccessorWrite | None = None


@dataclass(frozen=True, slots=True)
class StepHalted:
    """The step asked to stop the run cleanly: nothing after it runs, nothing is rolled back."""

    reason: object
    attempts: int
    duration_ms: float


@dataclass(frozen=True, slots=True)
class StepFailed:
    """The step failed with ``error``. ``started``: its work began, so it is compensated (by
    default it never started: nothing to compensate, rule 2).

    ``arguments``: what the failed record keeps (None: the step's resolved arguments).
    """

    error: ErrorInfo
    started: bool = False
    attempts: int = 0
    arguments: dict[str, object] | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """The construct stopped the run itself (parked, paused, dispatched): return ``outcome``."""

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Continue:
    """The construct recorded the step itself (an interrupt reached, a unit dispatched) and
    the run goes on with the steps that do not need it."""


CONTINUE = Continue()


@dataclass(frozen=True, slots=True)
class Postponed:
    """A step running alongside others failed an attempt whose retry waits for a backoff on a
    worker: its retry entry is recorded, and the run parks for ``delay`` once the other steps in
    flight have settled (``error``: the attempt's, for compensation if the run fails first)."""

    error: ErrorInfo
    attempt: int
    delay: float


StepResult = StepDone | StepHalted | StepFailed | Stop | Continue | Postponed


class RollbackPending(Exception):
    """A step's rollback goes on elsewhere (on workers): the run parks ``rolling_back`` and is
    woken to finish it. ``step`` is the step whose rollback is pending (it may be a composed
    child's); ``reason`` names the park and ``data`` goes in its trace entry."""

    reason = "rollback"

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step

    @property
    def data(self) -> JSONObject:
        """The park's trace entry data."""
        return {"waiting_for": "rollback", "step": self.step}


# ---------------------------------------------------------------------------- the protocol


class Construct(ABC):
    """One kind of step: how the executor runs it, resumes it and rolls it back.

    Subclasses implement :meth:`claims` and :meth:`run`; the rest have defaults that fit a
    construct with nothing to add. A construct is stateless and shared by every run: what it
    keeps for one run lives on the executor (``run.memo``, keyed by the construct's ``name``).
    """

    #: Names the construct in ``run.memo`` and in error messages.
    name: str = "construct"
    #: Whether the step's result is part of the run's value (an async unit's belongs to the
    #: steps that read it).
    in_value: bool = True

    @abstractmethod
    def claims(self, spec: StepSpec) -> bool:
        """Whether ``spec`` is a step of this construct."""

    def undoes(self, spec: StepSpec) -> bool:
        """Whether undoing the completed step does anything besides a trace entry (what a map
        element keeps to be undone later)."""
        return True

    @abstractmethod
    def run(
        self, run: RunContext, spec: StepSpec, arguments: dict[str, object], started_at: dt.datetime
    ) -> StepResult:
        """Run the ready step ``spec`` with its resolved (and validated) ``arguments``.

        A step that parked is run again when the run resumes: the construct continues where
        it stopped (a retry's next attempt, a child's next step, a map's remaining elements).
        A process interruption (:data:`INTERRUPTIONS`) inside step code is recorded with
        ``run.abort(...)`` and raised again.
        """

    def finish(self, run: RunContext, spec: StepSpec) -> None:
        """The core has applied what :meth:`run` returned (or the process was interrupted):
        give back what the construct took for the step. By default, nothing."""
        return None

    def catch_up(self, run: RunContext) -> None:
        """The run (re)starts: take in what arrived for this construct's steps meanwhile. By
        default, nothing."""
        return None

    def settle(
        self, run: RunContext, spec: StepSpec, reader: StepSpec, started_at: dt.datetime
    ) -> StepResult | None:
        """``reader`` is about to run and reads ``spec``, whose outcome came later (it is in
        ``run.state.units``): put the outcome in the results and return None, or say how the
        reader stops (fails, or parks the run)."""
        return None

    def pause(self, run: RunContext, waiting: list[str]) -> Outcome:
        """Nothing can run while ``waiting`` (this construct's steps first) wait: stop the run."""
        raise NotImplementedError(f"{self.name} steps never wait")

    def parked(self, run: RunContext, spec: StepSpec) -> None:
        """The run parked while the work of ``spec`` goes on elsewhere (its rollback): wake it
        at once if that work finished meanwhile. By default, nothing."""
        return None

    def rollback(
        self,
        run: RunContext,
        spec: StepSpec,
        action: RollbackAction,
        first: object,
        arguments: dict[str, object],
    ) -> list[RollbackFailure]:
        """Undo (``first`` is the result) or compensate (``first`` is the ErrorInfo) the step;
        return what could not be rolled back. By default there is nothing to run: the trace
        says so."""
        return record_no_handler(run, spec, action)

    def restore(self, state: RunState, spec: StepSpec | None, record: RecordedStep) -> None:
        """Fold ``record``, the step's record as the journal holds it, into ``state`` (a run
        restored to go on or to roll back; ``spec`` is None for a step the definition no
        longer has).

        By default, what the core records for every construct: a completed step has its
        value and is undone by a rollback (unless it was rolled back already), a skipped one
        has its value, a failed one whose work started is compensated. A construct that
        records statuses of its own folds them and hands the rest here.
        """
        status = record.status
        if status in (StepStatus.COMPLETED, StepStatus.SKIPPED):
            arguments = decode(record.arguments)
            undo = status == StepStatus.COMPLETED and state.rolls_back(record)
            state.completed(record.step, arguments, decode(record.result), undo=undo)
        elif status == StepStatus.FAILED and record.compensable and state.rolls_back(record):
            error = ErrorInfo.from_dict(record.error or {"kind": "step", "message": ""})
            state.compensation_due(record.step, decode(record.arguments), error)

    def restore_unfinished(self, state: RunState, spec: StepSpec) -> None:
        """A rollback of a stopped run finds ``spec`` unfinished: it halted, or the run
        stopped while it waited, without a value of its own. A construct whose work is a nested
        run (a composed child, a map's elements) has that work rolled back in the step's
        place; by default there is nothing to roll back."""
        return None


# ---------------------------------------------------------------------------- shared records

# The trace kinds and record status of each rollback action: done, failed, nothing to run.
ROLLBACK_KINDS: dict[str, tuple[str, str, str, str]] = {
    "undo": (
        EventKind.UNDO,
        EventKind.UNDO_FAILED,
        EventKind.UNDO_SKIPPED,
        RollbackStatus.UNDONE,
    ),
    "compensate": (
        EventKind.COMPENSATE,
        EventKind.COMPENSATE_FAILED,
        EventKind.COMPENSATE_SKIPPED,
        RollbackStatus.COMPENSATED,
    ),
}


def record_no_handler(
    run: RunContext, spec: StepSpec, action: RollbackAction
) -> list[RollbackFailure]:
    """Record that the step has no ``action`` to run (``undo_skipped``/``compensate_skipped``)."""
    event = run.event(ROLLBACK_KINDS[action][2], step=spec.name)
    run.commit(
        JournalBatch(
            events=[event],
            rollback=RollbackWrite(spec.name, RollbackStatus.NO_HANDLER, event.at),
        )
    )
    run.notices.rolled_back(action, spec.name, RollbackStatus.NO_HANDLER, None, None)
    return []


def record_nested_rollback(
    run: RunContext,
    spec: StepSpec,
    action: RollbackAction,
    failures: list[RollbackFailure],
    summary: str,
    duration: float,
) -> list[RollbackFailure]:
    """Record the rollback of a step that rolls back steps of its own (a composed child,
    a map's elements): undone, or failed with what could not be rolled back."""
    ok_kind, failed_kind, _skipped, ok_status = ROLLBACK_KINDS[action]
    if failures:
        event = run.event(
            failed_kind, step=spec.name, duration_ms=duration, data={"error": summary}
        )
        rollback = RollbackWrite(
            spec.name,
            RollbackStatus.FAILED,
            event.at,
            error={"failures": [f.to_dict() for f in failures]},
        )
    else:
        event = run.event(ok_kind, step=spec.name, duration_ms=duration)
        rollback = RollbackWrite(spec.name, ok_status, event.at)
    run.commit(JournalBatch(events=[event], rollback=rollback))
    run.notices.rolled_back(
        action, spec.name, rollback.status, duration, failures[0] if failures else None
    )
    return failures


def unstorable_arguments(
    run: RunContext, spec: StepSpec, arguments: dict[str, object]
) -> StepFailed | None:
    """A child's or a unit's arguments are its stored inputs: refused before it is created."""
    problem = unstorable(arguments)
    if problem is None:
        return None
    unfit = ArgumentResolutionError(f"the arguments cannot be stored: {problem}")
    return StepFailed(run.error_info(unfit, ErrorKind.ARGUMENT, spec, arguments, 0))
