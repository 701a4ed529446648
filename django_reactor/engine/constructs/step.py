"""A plain step: its body run in attempts as its retry policy says, then undone or compensated.

The body returns ``Success`` (or a plain value), ``Skip``, ``Halt`` or ``Failure``, or raises (a
retryable failure); the run's last step may return ``ContinueAsNew`` (:mod:`..continuation`).
A failure is retried while the policy allows: inline after the backoff, or, on a worker
(``retry_later``), by parking the run for the backoff. Rollback calls the
step's ``undo(result, ...)`` or ``compensate(error, ...)`` with the arguments it ran with.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING

from ...exceptions import PatchRemoved
from ...states import EventKind, RollbackStatus
from .. import continuation, probes, timevalues
from ..coordination import StepHold
from ..journal import Event, JournalBatch, RollbackWrite
from ..outcomes import (
    ContinueAsNew,
    ErrorInfo,
    ErrorKind,
    Failure,
    Halt,
    Rescheduled,
    RollbackFailure,
    Skip,
    StepOutcome,
    Success,
    as_step_outcome,
    exception_message,
    qualified_class_name,
)
from ..reconnection import ConnectionLosses
from ..serialization import printable
from ..step import StepContext, acting, awaited
from ..supervision import supervised, timeouts
from .base import (
    INTERRUPTIONS,
    ROLLBACK_KINDS,
    Construct,
    Postponed,
    RollbackAction,
    StepDone,
    StepFailed,
    StepHalted,
    StepResult,
    Stop,
    record_no_handler,
)

if TYPE_CHECKING:
    from ..context import RunContext
    from ..spec import StepSpec


class PlainStep(Construct):
    """Runs a step's body with retries; rolls it back with its own undo or compensate."""

    name = "step"

    def claims(self, spec: StepSpec) -> bool:
        return True

    def undoes(self, spec: StepSpec) -> bool:
        return spec.has_undo

    def run(
        self, run: RunContext, spec: StepSpec, arguments: dict[str, object], started_at: dt.datetime
    ) -> StepResult:
        """Run the step's body, retrying as its policy says; say how it ended."""
        attempt = run.state.attempts_done.pop(spec.name, 0)

        def abort(interruption: BaseException) -> None:
            run.abort(
                interruption,
                spec=spec,
                arguments=arguments,
                attempt=attempt,
                started_at=started_at,
            )

        losses: ConnectionLosses | None = None  # made at the first failure: most steps have none
        while True:
            attempt += 1
            context = run.context(spec, "run", attempt)
            if run.notices.observer is not None:  # a map's element: nobody to tell, many times
                run.notices.step_started(spec.name, attempt)
            t0 = time.perf_counter()
            exc: BaseException | None = None
            if probes.active is not None:
                probes.active("before_step", spec.name)
            # An atomic step: each attempt in a transaction of its own, never a backoff in it.
            transaction = run.begin(spec.name, "run") if spec.atomic else None
            try:
                outcome: StepOutcome = _attempt(run, spec, context, arguments)
                if transaction is not None and not isinstance(outcome, Failure):
                    transaction.settle()
            except INTERRUPTIONS as interruption:
                if transaction is not None:
                    transaction.rollback()
                abort(interruption)
                raise
            except PatchRemoved:
                # Not the step's failure (nothing is rolled back): its process parks the run.
                if transaction is not None:
                    transaction.rollback()
                raise
            except BaseException as raised:  # every other exception from step code is a failure
                exc = raised
                outcome = Failure(raised)
            duration = (time.perf_counter() - t0) * 1000
            if transaction is not None:
                if isinstance(outcome, Failure):
                    transaction.rollback()
                else:  # its record (done, skipped or halted) commits with its writes
                    run.hold(transaction)

            if isinstance(outcome, ContinueAsNew):
                successor = continuation.prepare(run, spec, outcome, arguments)
                if isinstance(successor, ErrorInfo):
                    run.drop_held()  # an atomic step's writes go with the run it could not end
                    return StepFailed(successor, started=not spec.atomic, attempts=attempt)
                return StepDone(
                    continuation.marker(successor.execution_id),
                    attempts=attempt,
                    duration_ms=duration,
                    published=context.published,
                    attributes=context.attributes_set,
                    successor=successor,
                )
            if isinstance(outcome, Success | Skip):
                return StepDone(
                    outcome.value,
                    attempts=attempt,
                    duration_ms=duration,
                    skipped=isinstance(outcome, Skip),
                    published=context.published,
                    attributes=context.attributes_set,
                )
            if isinstance(outcome, Halt):
                return StepHalted(outcome.reason, attempts=attempt, duration_ms=duration)

            assert isinstance(outcome, Failure)
            if exc is not None:
                if losses is None:
                    losses = ConnectionLosses()
                try:
                    if losses.recovered(run, spec, "run", exc, attempt):
                        attempt -= 1  # abandoned, not failed: the same attempt runs again
                        continue
                except INTERRUPTIONS as interruption:
                    abort(interruption)
                    raise
            if _should_retry(spec, outcome, exc, attempt):
                delay = spec.retry.delay_after(attempt)
                policy = run.policy
                if policy.max_retry_delay is not None:
                    delay = min(delay, policy.max_retry_delay)
                if policy.retry_later and delay > 0:
                    if run.in_branch():
                        # Alongside other steps: the run parks once they have settled.
                        run.commit(
                            JournalBatch(
                                events=[
                                    _retry_event(run, spec, outcome, exc, attempt, duration, delay)
                                ]
                            )
                        )
                        _notify_retry(run, spec, outcome, exc, attempt, duration, delay)
                        error = _failure_info(run, outcome, exc, spec, arguments, attempt)
                        return Postponed(error, attempt, delay)
                    return Stop(_retry_later(run, spec, outcome, exc, attempt, delay, duration))
                run.commit(
                    JournalBatch(
                        events=[_retry_event(run, spec, outcome, exc, attempt, duration, delay)],
                        current_step=spec.name,
                    )
                )
                _notify_retry(run, spec, outcome, exc, attempt, duration, delay)
                if delay:
                    try:
                        run.sleep(timevalues.wait_slice(delay))
                    except INTERRUPTIONS as interruption:
                        abort(interruption)
                        raise
                continue
            error = _failure_info(run, outcome, exc, spec, arguments, attempt)
            # An atomic step's writes were rolled back with the attempt: nothing to compensate.
            return StepFailed(error, started=not spec.atomic, attempts=attempt)

    def finish(self, run: RunContext, spec: StepSpec) -> None:
        """An atomic step's transaction that no record joined is rolled back."""
        if spec.atomic:  # only an atomic step's actions hold a transaction
            run.drop_held()

    def rollback(
        self,
        run: RunContext,
        spec: StepSpec,
        action: RollbackAction,
        first: object,
        arguments: dict[str, object],
    ) -> list[RollbackFailure]:
        """Call the step's undo or compensate; without one, the trace says so."""
        if not has_handler(spec, action):
            return record_no_handler(run, spec, action)
        return self.call_handler(run, spec, action, first, arguments)

    def call_handler(
        self,
        run: RunContext,
        spec: StepSpec,
        action: RollbackAction,
        first: object,
        arguments: dict[str, object],
        hold: StepHold | None = None,
    ) -> list[RollbackFailure]:
        """Run the step's undo or compensate (``hold``, taken for it, is given back once it
        returns) and record how it went."""
        ok_kind, failed_kind, _skipped, ok_status = ROLLBACK_KINDS[action]
        signature = spec.undo_signature if action == "undo" else spec.compensate_signature
        context = run.context(spec, action, 1)
        losses = ConnectionLosses()
        while True:
            if probes.active is not None:
                probes.active(f"before_{action}", spec.name)
            t0 = time.perf_counter()
            failure: RollbackFailure | None = None
            raised: BaseException | None = None
            # An atomic step's undo and compensate commit with their rollback record.
            transaction = run.begin(spec.name, action) if spec.atomic else None
            try:
                with acting(context):
                    returned = awaited(
                        getattr(spec.impl(context), action)(first, **signature.filter(arguments))
                    )
                if isinstance(returned, Failure):
                    error = returned.error
                    failure = RollbackFailure(
                        step=spec.name,
                        action=action,
                        exception_class=(
                            qualified_class_name(error)
                            if isinstance(error, BaseException)
                            else None
                        ),
                        message=str(error),
                    )
                elif transaction is not None:
                    transaction.settle()
            except (*INTERRUPTIONS, PatchRemoved):
                if transaction is not None:
                    transaction.rollback()
                if hold is not None:
                    hold.release(True)
                raise
            except BaseException as exc:
                raised = exc
                failure = RollbackFailure(
                    step=spec.name,
                    action=action,
                    exception_class=qualified_class_name(exc),
                    message=exception_message(exc),
                )
            if raised is None:
                break
            if transaction is not None:
                transaction.rollback()  # before the connection is repaired: nothing committed
                transaction = None
            try:
                if not losses.recovered(run, spec, action, raised, 1):
                    break
            except BaseException:  # an interruption, or the run taken over (LeaseLost)
                if hold is not None:
                    hold.release(True)
                raise
        if hold is not None and transaction is None:
            hold.release(True)
        duration = (time.perf_counter() - t0) * 1000
        if transaction is not None:
            if failure is None:
                run.hold(transaction)
            else:
                transaction.rollback()
        if failure is None:
            event = run.event(ok_kind, step=spec.name, duration_ms=duration)
            rollback = RollbackWrite(spec.name, ok_status, event.at)
        else:
            event = run.event(
                failed_kind,
                step=spec.name,
                duration_ms=duration,
                data={"error": failure.message, "exception_class": failure.exception_class},
            )
            rollback = RollbackWrite(
                spec.name, RollbackStatus.FAILED, event.at, error=failure.to_dict()
            )
        try:
            run.commit(JournalBatch(events=[event], rollback=rollback))
        finally:
            if hold is not None and transaction is not None:
                hold.release(True)  # only once the undo's writes are visible to others
        run.notices.rolled_back(action, spec.name, rollback.status, duration, failure)
        return [failure] if failure is not None else []


def _attempt(
    run: RunContext, spec: StepSpec, context: StepContext, arguments: dict[str, object]
) -> StepOutcome:
    """One attempt of the body: here, or under a watch when the step has a timeout or a
    heartbeat timeout (:mod:`..supervision`)."""
    timeout, heartbeat_timeout = timeouts(spec, run.policy.step_timeout)
    if timeout is None and heartbeat_timeout is None:
        with acting(context):
            return as_step_outcome(awaited(spec.impl(context).run(**arguments)))

    def body() -> StepOutcome:
        with acting(context):
            return as_step_outcome(awaited(spec.impl(context).run(**arguments)))

    assert context.watch is not None  # the context of a run action has its watch
    return supervised(
        body,
        context.watch,
        timeout=timeout,
        heartbeat_timeout=heartbeat_timeout,
        on_thread_end=run.thread_finished,
    )


def has_handler(spec: StepSpec, action: RollbackAction) -> bool:
    """Whether the step defines the rollback ``action``."""
    return spec.has_undo if action == "undo" else spec.has_compensate


def _should_retry(
    spec: StepSpec, outcome: Failure, exc: BaseException | None, attempt: int
) -> bool:
    if attempt >= spec.retry.attempts or not outcome.retryable:
        return False
    error = exc if exc is not None else outcome.error
    if isinstance(error, BaseException):
        return spec.retry.retries_exception(error)
    return True


def _retry_later(
    run: RunContext,
    spec: StepSpec,
    outcome: Failure,
    exc: BaseException | None,
    attempt: int,
    delay: float,
    duration: float,
) -> Rescheduled:
    """Park the run for the retry's backoff; a task (or the sweeper) resumes it."""
    event = _retry_event(run, spec, outcome, exc, attempt, duration, delay)
    parked = run.park(
        spec.name,
        reason="retry",
        delay=delay,
        event=event,
        by_task=True,
        attempt=attempt,
        tell=False,
    )
    _notify_retry(run, spec, outcome, exc, attempt, duration, delay)
    run.notices.parked(spec.name, "retry", parked.delay)
    return parked


def _retry_event(
    run: RunContext,
    spec: StepSpec,
    outcome: Failure,
    exc: BaseException | None,
    attempt: int,
    duration: float,
    delay: float,
) -> Event:
    return run.event(
        EventKind.RETRY,
        step=spec.name,
        attempt=attempt,
        duration_ms=duration,
        data={**_error_summary(outcome, exc), "delay": delay},
    )


def _notify_retry(
    run: RunContext,
    spec: StepSpec,
    outcome: Failure,
    exc: BaseException | None,
    attempt: int,
    duration: float,
    delay: float,
) -> None:
    summary = _error_summary(outcome, exc)
    run.notices.step_retried(
        spec.name,
        attempt,
        duration_ms=duration,
        error=summary["error"],
        error_class=summary["exception_class"],
        delay=delay,
    )


def _failure_info(
    run: RunContext,
    outcome: Failure,
    exc: BaseException | None,
    spec: StepSpec,
    arguments: dict[str, object],
    attempts: int,
) -> ErrorInfo:
    error = exc if exc is not None else outcome.error
    if isinstance(error, BaseException):
        info = run.error_info(error, ErrorKind.STEP, spec, arguments, attempts)
        retryable = outcome.retryable and getattr(error, "retryable", True) is not False
    else:
        info = run.step_error(
            spec, ErrorKind.STEP, str(error), arguments=arguments, attempts=attempts
        )
        retryable = outcome.retryable
    return ErrorInfo(**{**info._fields(), "retryable": retryable})


def _error_summary(outcome: Failure, exc: BaseException | None) -> dict[str, str | None]:
    error = exc if exc is not None else outcome.error
    if isinstance(error, BaseException):
        return {
            "error": exception_message(error),
            "exception_class": qualified_class_name(error),
        }
    return {"error": printable(str(error)), "exception_class": None}


STEP = PlainStep()
