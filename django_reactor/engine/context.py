"""What a construct may do with the run it runs a step of: :class:`RunContext`, and the
:class:`RunPolicy` the run is executed under (with its :class:`Reconnect`).

A construct (:mod:`.constructs`) never sees the executor. It reads the run (its definition,
state, arguments, the time), records through it (trace entries, checkpoints, an atomic
action's transaction, an abort), parks it, spawns nested work (the child runner), asks for
coordination (the run's holds) and tells the observers (``notices``). The executor implements
the protocol.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from uuid import UUID

    from .constructs.compose import ChildRunner
    from .holds import RunHolds
    from .journal import Event, JournalBatch, StepTransaction, StepWrite, StopRequest
    from .notices import Notices
    from .outcomes import ErrorInfo, Rescheduled
    from .serialization import JSONMapping, JSONObject
    from .spec import ReactorDefinition, StepSpec
    from .state import RunState
    from .step import StepContext
    from .templates import ResolutionScope


@dataclass(frozen=True, slots=True)
class Reconnect:
    """How a process repairs a database connection that a step's body lost.

    A lost connection (a failover, a pooler restart, an idle-session timeout, an operator's
    ``pg_terminate_backend``) is not the step's failure: the attempt is abandoned, the
    connection repaired, and the body runs again on a new one, for as long as ``within``
    seconds from the first loss; past that, the loss counts as the attempt's failure.
    """

    #: Whether ``error`` (raised by a body) says this thread's database connection was lost;
    #: when it does, it drops the broken connection so that the next statement connects again.
    after: Callable[[BaseException], bool]
    #: Seconds from the first loss during which an attempt is abandoned and run again.
    within: float

    def pause(self, losses: int) -> float:
        """Seconds to wait before running a body again after its ``losses``-th lost
        connection in a row (none after the first: most losses are one broken connection)."""
        return min(0.25 * 2 ** (losses - 2), 4.0) if losses > 1 else 0.0


@dataclass(frozen=True, slots=True)
class RunPolicy:
    """How this process executes a run: where it stops, how it waits, what bounds it.

    The one place that builds executors (``django_reactor.runtime.executors``) sets it for
    the caller of ``run()``, a worker, a composed child and an operator's operation.
    """

    #: The caller: stop at the reactor's background hand-off point (``Meta.background``).
    hand_off: bool = False
    #: A worker: park the run for a retry's backoff, contention, an async unit or a map,
    #: instead of waiting in the process.
    retry_later: bool = False
    #: A composed child: it parks with its parent, which holds the dispatch that resumes both.
    attached: bool = False
    #: Give every interrupt reached a resume token (returned in the ``Paused`` outcome).
    issue_tokens: bool = False
    #: Seconds after which a parked run is woken anyway, should its wake-up be lost.
    park_poll: float = 2.0
    #: The longest backoff waited for in the process (None: as the retry policy says).
    max_retry_delay: float | None = None
    #: A worker: a process-level interruption gives the run back for the message's
    #: redelivery instead of aborting it.
    hand_back_on_interruption: bool = False
    #: How many steps may run at once (None: the reactor's ``Meta.max_concurrency``).
    max_concurrency: int | None = None
    #: The timeout of a step's attempt that declares none (``REACTOR["STEP_TIMEOUT"]``).
    step_timeout: float | None = None
    #: The largest value a step may publish, in bytes of JSON (``REACTOR["PUBLISH_MAX_BYTES"]``).
    publish_max_bytes: int = 16384
    #: Steps may set the run's attributes (``context.set_attribute``); not a map's element,
    #: which is no run of its own.
    keeps_attributes: bool = True
    #: Steps may ask which branch of a patch the run takes (``context.patched``); not a map's
    #: element, which has no decisions of its own.
    keeps_patches: bool = True
    #: Past it no step starts: the run rolls back or halts (``Meta.on_deadline``).
    deadline: dt.datetime | None = None
    #: What a step's body's lost database connection does (None: it fails the attempt).
    reconnect: Reconnect | None = None
    #: A run of its own, kept in the database: its last step may return ContinueAsNew (not
    #: a composed child, an async unit or a map's element).
    continues: bool = False


class RunContext(Protocol):
    """The run a construct runs a step of: what the construct may read and do."""

    definition: ReactorDefinition
    state: RunState
    policy: RunPolicy
    scope: ResolutionScope
    notices: Notices
    #: The runner of composed children, async units and maps (None: this run has none).
    children: ChildRunner | None
    #: The run's coordination (None: nothing declared).
    holds: RunHolds | None
    #: The fencing numbers held for the step running now, by lock key.
    fences: dict[str, int]
    #: What constructs keep for this run, by construct name.
    memo: dict[str, Any]

    @property
    def execution_id(self) -> UUID | None:
        """The run's id (None for a run in memory)."""
        ...

    # -- reading -------------------------------------------------------------------------

    def clock(self) -> dt.datetime:
        """The current time, as this run reads it."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait in the process (an inline retry's backoff)."""
        ...

    def next_after(self, spec: StepSpec) -> StepSpec | None:
        """The step that runs next once ``spec`` is done."""
        ...

    def in_branch(self) -> bool:
        """Whether this thread runs a step alongside others (``Meta.max_concurrency``)."""
        ...

    def context(self, spec: StepSpec, action: str, attempt: int) -> StepContext:
        """The context a step's body (``action``: run, undo, compensate) sees."""
        ...

    # -- recording -----------------------------------------------------------------------

    def event(
        self,
        kind: str,
        *,
        step: str = "",
        attempt: int = 0,
        duration_ms: float | None = None,
        data: JSONMapping | None = None,
    ) -> Event:
        """The next trace entry."""
        ...

    def note(self, kind: str, data: JSONMapping | None = None, *, step: str = "") -> None:
        """A trace entry written with the next checkpoint."""
        ...

    def commit(self, batch: JournalBatch) -> StopRequest | None:
        """Write ``batch``; what an operator asked of the run (cancel it, pause it), if
        anything."""
        ...

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
        """Release the run until ``delay`` seconds from now (or its deadline): ``event`` (and
        ``record``, the step's) written with the park; ``by_task``: a task wakes it (else the
        sweeper, or the work it waits for)."""
        ...

    def begin(self, step: str, action: str) -> StepTransaction:
        """Open the transaction an atomic step's action runs in."""
        ...

    def hold(self, transaction: StepTransaction) -> None:
        """The next commit of this thread records the action inside ``transaction``."""
        ...

    def drop_held(self) -> None:
        """Roll back a held transaction that no checkpoint joined."""
        ...

    def thread_finished(self) -> None:
        """A thread that ran a step's body ends: give back what it took."""
        ...

    def ensure_owned(self) -> None:
        """Raise ``LeaseLost`` when another process has taken the run."""
        ...

    def abort(
        self,
        exc: BaseException,
        *,
        spec: StepSpec | None = None,
        arguments: dict[str, object] | None = None,
        attempt: int = 0,
        started_at: dt.datetime | None = None,
    ) -> None:
        """The process is interrupted (``exc``): record it, as the policy says."""
        ...

    # -- reporting -----------------------------------------------------------------------

    def step_error(
        self,
        spec: StepSpec,
        kind: str,
        message: str,
        *,
        arguments: dict[str, object] | None = None,
        **fields: Any,
    ) -> ErrorInfo:
        """An error of ``spec`` of this run."""
        ...

    def error_info(
        self,
        exc: BaseException,
        kind: str,
        spec: StepSpec,
        arguments: dict[str, object],
        attempts: int,
    ) -> ErrorInfo:
        """An error describing ``exc``, raised for ``spec``."""
        ...

    def redacted_inputs(self) -> JSONObject:
        """The run's inputs as error reports show them."""
        ...

    def redacted_arguments(self, spec: StepSpec, arguments: dict[str, object]) -> JSONObject:
        """A step's arguments as error reports show them."""
        ...
