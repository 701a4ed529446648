"""Step timeouts and heartbeats: an attempt that runs too long, or stops saying it is alive,
fails.

A step with a ``timeout`` (or ``REACTOR["STEP_TIMEOUT"]``) or a ``heartbeat_timeout`` runs
each attempt's body in a thread of its own while the run's thread watches it. When the
attempt runs past its timeout, or goes longer than its heartbeat timeout without
``self.context.heartbeat()``, the watch gives up on it: the attempt fails with
:class:`~django_reactor.exceptions.StepTimedOut` and the step's retry policy decides what
follows (inline, the next attempt after the backoff; on a worker, the run parks and another
attempt starts later, anywhere). Python cannot stop a thread: the abandoned body keeps running
until it returns, and what it returns is thrown away. ``self.context.should_stop()`` tells a
long body that it was abandoned, so it can return early; steps with timeouts should be safe to
run again (as every step is, at least once), since the abandoned attempt and the next one may
overlap.

A heartbeat is also kept where operators see it (``Execution.heartbeat``, written with the
lease's next extension), for any step that calls it.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..exceptions import StepTimedOut
from . import timevalues
from .serialization import shown

if TYPE_CHECKING:
    from .journal import Journal
    from .spec import StepSpec

T = TypeVar("T")


class Watch:
    """What the run knows of one attempt in flight: when it last said it was alive."""

    __slots__ = ("abandoned", "beats", "journal", "last", "step")

    def __init__(self, journal: Journal, step: str) -> None:
        self.journal = journal
        self.step = step
        self.last = time.monotonic()
        # Set once, by the watching thread; the body's thread reads it (should_stop). A flag,
        # not a threading.Event: every attempt of every step has a watch, few are ever watched.
        self.abandoned = False
        self.beats = threading.Lock()

    def beat(self, details: object) -> None:
        """A heartbeat from the body (any thread)."""
        with self.beats:
            self.last = time.monotonic()
        self.journal.heartbeat(self.step, shown(details) if details is not None else None)


def timeouts(spec: StepSpec, default: float | None) -> tuple[float | None, float | None]:
    """The attempt's timeout and heartbeat timeout, in seconds (None: none)."""
    timeout = spec.timeout if spec.timeout is not None else default
    return timeout, spec.heartbeat_timeout


def supervised(
    body: Callable[[], T],
    watch: Watch,
    *,
    timeout: float | None,
    heartbeat_timeout: float | None,
    on_thread_end: Callable[[], None],
) -> T:
    """Run ``body`` in a thread and wait for it; raise StepTimedOut (marking the watch
    abandoned) when it runs past ``timeout`` or goes ``heartbeat_timeout`` without a beat.
    Returns what the body returns and raises what it raises."""
    done = threading.Event()
    returned: list[T] = []
    raised: list[BaseException] = []

    def target() -> None:
        try:
            returned.append(body())
        except BaseException as exc:  # handed to the waiting thread, which raises it
            raised.append(exc)
        finally:
            done.set()
            on_thread_end()

    started = time.monotonic()
    # The body runs in the caller's context (the database its run is bound to).
    worker = threading.Thread(
        target=contextvars.copy_context().run,
        args=(target,),
        name=f"reactor-step-{watch.step}",
        daemon=True,
    )
    worker.start()
    while True:
        now = time.monotonic()
        limits = []
        if timeout is not None:
            limits.append(started + timeout)
        if heartbeat_timeout is not None:
            with watch.beats:
                limits.append(watch.last + heartbeat_timeout)
        next_check = min(limits)
        # In slices a thread can wait: a wait that raised here would record the attempt failed
        # while its body goes on running.
        if done.wait(timevalues.wait_slice(next_check - now)):
            break
        now = time.monotonic()
        if timeout is not None and now - started >= timeout:
            watch.abandoned = True
            raise StepTimedOut(
                f"step {watch.step!r} ran longer than its timeout ({timeout:g} s); the attempt "
                "was abandoned (its body may still be running: it can check "
                "self.context.should_stop())"
            )
        if heartbeat_timeout is not None:
            with watch.beats:
                silent = now - watch.last
            if silent >= heartbeat_timeout:
                watch.abandoned = True
                raise StepTimedOut(
                    f"step {watch.step!r} sent no heartbeat for {silent:.1f} s, longer than its "
                    f"heartbeat_timeout ({heartbeat_timeout:g} s); the attempt counts as lost "
                    "and was abandoned"
                )
    if raised:
        raise raised[0]
    return returned[0]
