"""A step body's lost database connection: the attempt is abandoned, not failed.

A failover, a pooler restart, an idle-session timeout or an operator's ``pg_terminate_backend``
breaks the connection a body was using; that says nothing about the body's work. When the
run's :class:`~.context.Reconnect` recognises the error, the attempt (or the undo, or the
compensation) is abandoned: an atomic action's transaction was rolled back with the
connection, so nothing of it committed; the broken connection is dropped; the trace notes a
``reconnect`` entry (with the next checkpoint: no write of its own, which could not reach the
database yet); and the body runs again on a new connection, with the same attempt number and
idempotency key. Such a run again is not one of the step's attempts: its retry policy is for
its own failures. Past ``Reconnect.within`` seconds of losses in a row, the lost connection is
the attempt's failure, as any error is.

Unless the run is no longer this process's: a connection is also lost when the process stalled
(stopped, swapped out, cut off) past its lease and the process that took the run over ended
its session. That process runs the step; this one stops (``LeaseLost``, from
:meth:`~.context.RunContext.ensure_owned`) instead of running it a second time.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..states import EventKind
from .outcomes import exception_message, qualified_class_name

if TYPE_CHECKING:
    from .context import RunContext
    from .spec import StepSpec

logger = logging.getLogger("django_reactor.executor")


class ConnectionLosses:
    """The lost connections of one action of one step (its run, undo or compensate), in a
    row: whether to run its body again, and after what pause."""

    __slots__ = ("count", "since")

    def __init__(self) -> None:
        self.count = 0
        self.since: float | None = None

    def recovered(
        self, run: RunContext, spec: StepSpec, action: str, error: BaseException, attempt: int
    ) -> bool:
        """Whether ``error`` was a lost connection after which the body runs again: the
        connection was repaired, the pause was waited, the run is still this process's, the
        trace has a note. False for any other error, and for a loss past the run's
        ``Reconnect.within``; ``LeaseLost`` when another process has taken the run over."""
        reconnect = run.policy.reconnect
        # Always asked, even past the bound: it drops the broken connection, so that the
        # failure that follows can be recorded.
        if reconnect is None or not reconnect.after(error):
            return False
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now - self.since > reconnect.within:
            logger.warning(
                "step %r of execution %s: the database connection was lost again after %.0f s "
                "of losses; the attempt fails",
                spec.name,
                run.execution_id,
                now - self.since,
            )
            return False
        self.count += 1
        pause = reconnect.pause(self.count)
        if pause:
            run.sleep(pause)
        # Raises when the run was taken over while the connection was gone: the new owner runs
        # the step; running it here as well would do it twice.
        run.ensure_owned()
        message = exception_message(error)
        run.note(
            EventKind.RECONNECT,
            {
                "action": action,
                "attempt": attempt,
                "error": message,
                "exception_class": qualified_class_name(error),
                "losses": self.count,
            },
            step=spec.name,
        )
        # Expected in production and handled: one line, the traceback only at DEBUG.
        logger.warning(
            "step %r of execution %s lost its database connection during its %s (%s); "
            "running it again on a new connection",
            spec.name,
            run.execution_id,
            action,
            message.splitlines()[0] if message else type(error).__name__,
        )
        logger.debug("the lost connection's error", exc_info=error)
        return True
