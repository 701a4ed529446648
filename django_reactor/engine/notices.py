"""What a run tells its observers (:mod:`.observers`), once each state change is committed.

:class:`Notices` builds the events (identities, names, timings, error summaries; never inputs
or arguments) and calls the run's observer; a run without one pays a test per notice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from ..states import ExecutionStatus
from .observers import (
    CompositeObserver,
    CoordinationEvent,
    RunEvent,
    StepEvent,
    summarise,
)
from .outcomes import ErrorInfo, RollbackFailure

if TYPE_CHECKING:
    from .journal import Journal


class RunFields(TypedDict, total=False):
    """What a :class:`RunEvent` may carry besides the run's identity, status and time."""

    step: str | None
    error: str | None
    error_class: str | None
    reason: str | None
    delay: float | None
    waiting_for: tuple[str, ...]


class StepFields(TypedDict, total=False):
    """What a :class:`StepEvent` may carry besides the step's identity, status and attempt."""

    duration_ms: float | None
    error: str | None
    error_class: str | None
    delay: float | None


class Notices:
    """The notifications of one run, told to its observer (None: nobody listens)."""

    def __init__(
        self, observer: CompositeObserver | None, reactor: str, journal: Journal | None
    ) -> None:
        self.observer = observer
        self.reactor = reactor
        # The run's id is its journal's (never the executor's: an executor that its notices
        # referred back to would live on until the garbage collector found the cycle).
        self._journal = journal
        self._t0 = time.perf_counter()

    # -- the run ------------------------------------------------------------------------

    def run_event(
        self, status: str, *, failure: Mapping[str, Any] | None = None, **fields: Unpack[RunFields]
    ) -> RunEvent:
        """What the observers are told about the run (``failure``: its stored failure)."""
        if failure is not None:
            fields.setdefault("step", failure.get("step"))
            fields["error"] = summarise(failure.get("message"))
            fields["error_class"] = failure.get("exception_class")
        return RunEvent(
            execution_id=self._journal.execution_id if self._journal else None,
            reactor=self.reactor,
            status=str(status),
            duration_ms=(time.perf_counter() - self._t0) * 1000,
            **fields,
        )

    def started(self, *, new: bool) -> None:
        """The run started (``new``) or goes on in this process."""
        if self.observer is not None:
            event = self.run_event(ExecutionStatus.RUNNING)
            if new:
                self.observer.execution_started(event)
            else:
                self.observer.execution_resumed(event)

    def completed(self) -> None:
        if self.observer is not None:
            self.observer.execution_completed(self.run_event(ExecutionStatus.COMPLETED))

    def failed(
        self,
        status: str,
        *,
        step: str | None = None,
        failure: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> None:
        """The run ended ``status`` (failed, needs attention) with ``failure`` (as stored)."""
        if self.observer is not None:
            fields: RunFields = {"step": step} if step is not None else {}
            if reason is not None:
                fields["reason"] = reason
            self.observer.execution_failed(self.run_event(status, failure=failure, **fields))

    def halted(self, *, step: str | None, reason: str) -> None:
        if self.observer is not None:
            fields: RunFields = {"step": step} if step is not None else {}
            fields["reason"] = reason
            self.observer.execution_halted(self.run_event(ExecutionStatus.HALTED, **fields))

    def cancelled(
        self,
        *,
        step: str | None = None,
        reason: str | None,
        failure: Mapping[str, Any] | None = None,
    ) -> None:
        if self.observer is not None:
            fields: RunFields = {"step": step} if step is not None else {}
            fields["reason"] = reason
            self.observer.execution_cancelled(
                self.run_event(ExecutionStatus.CANCELLED, failure=failure, **fields)
            )

    def suspended(self, *, reason: str) -> None:
        if self.observer is not None:
            self.observer.execution_suspended(
                self.run_event(ExecutionStatus.SUSPENDED, reason=reason)
            )

    def paused(self, *, step: str, waiting_for: tuple[str, ...]) -> None:
        if self.observer is not None:
            self.observer.execution_paused(
                self.run_event(ExecutionStatus.PAUSED, step=step, waiting_for=waiting_for)
            )

    def handed_off(self, *, step: str) -> None:
        if self.observer is not None:
            self.observer.execution_handed_off(self.run_event(ExecutionStatus.PENDING, step=step))

    def parked(self, step: str, reason: str, delay: float) -> None:
        """The run parked (``reason``) for ``delay`` seconds."""
        if self.observer is not None:
            self.observer.execution_parked(
                self.run_event(ExecutionStatus.PENDING, step=step, reason=reason, delay=delay)
            )

    def coordination_acquired(self, event: CoordinationEvent) -> None:
        if self.observer is not None:
            self.observer.coordination_acquired(event)

    # -- its steps ----------------------------------------------------------------------

    def step_event(
        self, step: str, status: str, attempt: int, **fields: Unpack[StepFields]
    ) -> StepEvent:
        """What the observers are told about a step (built only when one of them listens:
        :meth:`~.observers.RunObserver.listens`)."""
        if "error" in fields:
            fields["error"] = summarise(fields["error"])
        return StepEvent(
            execution_id=self._journal.execution_id if self._journal else None,
            reactor=self.reactor,
            step=step,
            status=str(status),
            attempt=attempt,
            **fields,
        )

    def step_started(self, step: str, attempt: int) -> None:
        if self.observer is not None and self.observer.listens("step_started"):
            self.observer.step_started(self.step_event(step, "running", attempt))

    def step_completed(self, step: str, status: str, attempt: int, duration_ms: float) -> None:
        if self.observer is not None and self.observer.listens("step_completed"):
            self.observer.step_completed(
                self.step_event(step, status, attempt, duration_ms=duration_ms)
            )

    def step_failed(self, step: str, error: ErrorInfo, attempts: int) -> None:
        """``step`` failed (recorded) with ``error``."""
        if self.observer is not None and self.observer.listens("step_failed"):
            self.observer.step_failed(
                self.step_event(
                    step,
                    error.kind,
                    attempts,
                    error=error.message,
                    error_class=error.exception_class,
                )
            )

    def step_retried(
        self,
        step: str,
        attempt: int,
        *,
        duration_ms: float,
        error: str | None,
        error_class: str | None,
        delay: float,
    ) -> None:
        if self.observer is not None and self.observer.listens("step_retried"):
            self.observer.step_retried(
                self.step_event(
                    step,
                    "retry",
                    attempt,
                    duration_ms=duration_ms,
                    error=error,
                    error_class=error_class,
                    delay=delay,
                )
            )

    def rolled_back(
        self,
        action: str,
        step: str,
        status: str,
        duration: float | None,
        failure: RollbackFailure | None,
    ) -> None:
        """A step was undone or compensated (or could not be)."""
        name = "step_undone" if action == "undo" else "step_compensated"
        if self.observer is None or not self.observer.listens(name):
            return
        event = self.step_event(
            step,
            status,
            1,
            duration_ms=duration,
            error=failure.message if failure is not None else None,
            error_class=failure.exception_class if failure is not None else None,
        )
        if name == "step_undone":
            self.observer.step_undone(event)
        else:
            self.observer.step_compensated(event)


#: The notices of a run without observers: every notice is nothing.
SILENT = Notices(None, "", None)
