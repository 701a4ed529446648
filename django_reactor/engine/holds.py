"""The run's own coordination (``Meta.coordination``): taken before its first step, taken
again when it lapses, given back when the run stops.

What to hold is declared with :mod:`.coordination` (locks, semaphores, rate limits, periods,
ordered locks); the Django layer's :class:`~.coordination.Coordinator` acquires it. What cannot
be held halts the run, fails it, or makes it wait: a worker reschedules it, an inline caller
hands it to one. A step's own coordination is its construct's
(:mod:`.constructs.coordination`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..states import EventKind, ExecutionStatus
from .constructs.coordination import WAITING_KINDS, snooze
from .coordination import NOT_STARTED, Blocked, Coordinator
from .journal import JournalBatch
from .observers import CoordinationEvent
from .outcomes import Dispatched, ErrorInfo, Failed, Halted, Outcome

if TYPE_CHECKING:
    from .executor import Executor
    from .serialization import JSONObject


class RunHolds:
    """The coordination of one run on its :class:`Coordinator`, as its executor uses it."""

    def __init__(self, run: Executor, coordinator: Coordinator) -> None:
        self.run = run
        self.coordinator = coordinator
        # Acquisitions noted in the trace, told to the observers once the run has started.
        self._acquisitions: list[CoordinationEvent] = []

    @property
    def lost(self) -> bool:
        """A lock or slot lapsed while the run held it."""
        return self.coordinator.lost

    def enter(self, *, new: bool) -> Outcome | None:
        """Take the run's holds before its first step; None when held, otherwise how the run
        stopped."""
        blocked = self.coordinator.enter(new=new)
        self.acquired()
        return self._blocked(blocked) if blocked is not None else None

    def retake(self) -> Outcome | None:
        """Take the holds again after one lapsed; None when held, otherwise how the run
        stopped."""
        blocked = self.coordinator.enter(new=False)
        self.acquired()
        self.tell()
        return self._blocked(blocked) if blocked is not None else None

    def exit(self, status: str | None) -> None:
        """Give the holds back as the run stops with ``status`` (None: interrupted)."""
        self.coordinator.exit(status)

    def enter_rollback(self) -> None:
        """Take what the run's rollback needs (an undo outside a running run)."""
        self.coordinator.enter_rollback()

    def acquired(self, step: str = "") -> None:
        """Put what the coordinator just acquired in the trace (with the next state change),
        and tell the observers (a run's own acquisitions once it has started)."""
        coordinator = self.coordinator
        run = self.run
        if coordinator.notes:
            for data in coordinator.notes:
                run.note(EventKind.ACQUIRE, data, step=step)
                if run.notices.observer is not None:
                    self._acquisitions.append(self._coordination_event(data, step))
            coordinator.notes.clear()
        if step:
            self.tell()

    def tell(self) -> None:
        """Tell the observers what was acquired since they were last told."""
        for event in self._acquisitions:
            self.run.notices.coordination_acquired(event)
        self._acquisitions.clear()

    def _coordination_event(self, data: JSONObject, step: str) -> CoordinationEvent:
        kind = next((k for k in ("lock", "semaphore", "rate_limit", "period") if k in data), "lock")
        fence = data.get("fence")  # a lock's fencing number (an int), absent for the others
        return CoordinationEvent(
            execution_id=self.run.execution_id,
            reactor=self.run.definition.name,
            kind=kind,
            key=str(data.get(kind, "")),
            step=step or None,
            fence=fence if isinstance(fence, int) else None,
        )

    def _blocked(self, blocked: Blocked) -> Outcome:
        """The run's coordination cannot be held now: halt, fail, wait on a worker, or hand
        the run to a worker (an inline caller never sleeps for it once steps have run)."""
        run = self.run
        state = run.state
        if blocked.kind == "halt":
            reason = blocked.message
            run.commit(
                JournalBatch(
                    events=[run.event(EventKind.HALT, data={"reason": reason})],
                    status=ExecutionStatus.HALTED,
                    result={"halted_at": "", "reason": reason},
                    finished=True,
                    close_interrupts=True,
                )
            )
            self.coordinator.exit(ExecutionStatus.HALTED)
            run.notices.halted(step=None, reason=reason)
            return Halted(execution_id=run.execution_id, reason=reason, step=None)
        waiting = blocked.kind in WAITING_KINDS
        if waiting and run.policy.retry_later:
            if not self.coordinator.snoozes_left():
                blocked = Blocked(
                    "fail",
                    f"{blocked.message}; gave up after REACTOR['MAX_CONTENTION_SNOOZES'] "
                    "reschedules",
                    error_kind=blocked.error_kind,
                )
            else:
                return snooze(run, blocked, step="")
        elif waiting and (state.done or state.undo_stack):
            # Steps ran already (a resumed run): a worker goes on once it can hold them.
            run.commit(
                JournalBatch(
                    events=[
                        run.event(
                            EventKind.HANDOFF,
                            data={"waiting_for": blocked.message, "delay": blocked.retry_after},
                        )
                    ],
                    status=ExecutionStatus.PENDING,
                    release=True,
                    handed_off=True,
                    dispatch="retry",
                    dispatch_delay=blocked.retry_after,
                    wake_after=blocked.retry_after,
                )
            )
            return Dispatched(execution_id=run.execution_id, results=dict(state.results))
        error = ErrorInfo(
            kind=blocked.error_kind,
            message=blocked.message,
            reactor=run.definition.name,
            retryable=blocked.retryable,
            inputs=run.redacted_inputs(),
        )
        if state.undo_stack or state.pending_compensation:
            run.rollback(final_status=ExecutionStatus.FAILED, failure=error)
            return Failed(execution_id=run.execution_id, error=error)
        run.commit(
            JournalBatch(
                events=[
                    run.event(EventKind.FAIL, data={"kind": error.kind, "error": error.message})
                ],
                status=ExecutionStatus.FAILED,
                failure=error.to_dict(),
                finished=True,
                close_interrupts=True,
            )
        )
        # Nothing ran: it leaves its ordered-lock queue without halting the chain.
        self.coordinator.exit(NOT_STARTED if not state.done else ExecutionStatus.FAILED)
        run.notices.failed(ExecutionStatus.FAILED, failure=error.to_dict())
        return Failed(execution_id=run.execution_id, error=error)
