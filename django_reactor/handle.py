"""Read-only views of a stored execution, and the operations on it."""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar
from uuid import UUID

from . import store
from .engine import timevalues
from .engine.outcomes import (
    ErrorInfo,
    Outcome,
    PendingInterrupt,
)
from .engine.redaction import redact
from .engine.serialization import decode, readable
from .exceptions import ExecutionNotFound, ReactorError, TransactionActive, WaitTimedOut
from .runtime import aio
from .states import WAITED_THROUGH, ExecutionStatus
from .store.secrets import Marks

if TYPE_CHECKING:
    from .engine.journal import RecordedStep
    from .models import Execution, ExecutionEvent, StepRecord


P = ParamSpec("P")
T = TypeVar("T")


def _in_its_database(
    method: Callable[Concatenate[ExecutionHandle, P], T],
) -> Callable[Concatenate[ExecutionHandle, P], T]:
    """A handle's ``method`` run in the database its run was read from (runs may be routed to
    several, ``REACTOR["DATABASE"]``)."""

    @functools.wraps(method)
    def in_its_database(handle: ExecutionHandle, *args: P.args, **kwargs: P.kwargs) -> T:
        with store.bound_to(handle._row):
            return method(handle, *args, **kwargs)

    return in_its_database


@dataclass(frozen=True, slots=True)
class StepView:
    """One step of a stored run as shown: values decoded, secrets redacted (``[ERASED]`` once
    their subject is forgotten; built from a
    :class:`~django_reactor.engine.journal.RecordedStep`, or a ``StepRecord``)."""

    name: str
    status: str
    attempts: int
    arguments: dict[str, Any]
    result: Any
    error: ErrorInfo | None
    rollback: str
    rollback_error: dict[str, Any] | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: RecordedStep | StepRecord, marks: Marks | None = None) -> StepView:
        """The view of ``row``; ``marks`` say which sealed secrets are erased (one per run)."""
        marks = marks or Marks()
        return cls(
            name=row.step,
            status=row.status,
            attempts=row.attempts,
            arguments=redact(readable(row.arguments, marks), row.secret_arguments),
            result=readable(row.result, marks),
            error=ErrorInfo.from_dict(row.error) if row.error else None,
            rollback=row.rollback,
            rollback_error=row.rollback_error,
            started_at=row.started_at,
            finished_at=row.finished_at,
        )


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One entry of a run's trace."""

    seq: int
    kind: str
    step: str
    attempt: int
    at: dt.datetime
    duration_ms: float | None
    data: dict[str, Any]

    @classmethod
    def from_row(cls, row: ExecutionEvent) -> TraceEvent:
        return cls(row.seq, row.kind, row.step, row.attempt, row.at, row.duration_ms, row.data)


class Operations(Protocol):
    """What a handle asks of the services to steer its run (``django_reactor.services``)."""

    def find(self, execution_id: UUID) -> ExecutionHandle: ...

    def cancel(self, execution_id: UUID, *, reason: str = "") -> ExecutionHandle: ...

    def undo(self, execution_id: UUID, *, reason: str = "") -> ExecutionHandle: ...

    def retry(self, execution_id: UUID, *, reason: str = "") -> Outcome: ...

    def pause(self, execution_id: UUID, *, reason: str = "") -> ExecutionHandle: ...

    def fork(
        self,
        execution_id: UUID,
        from_step: str,
        *,
        inputs: Mapping[str, Any] | None = None,
        undo_abandoned: bool = False,
        reason: str = "",
    ) -> Outcome: ...

    def unpause(self, execution_id: UUID, *, reason: str = "") -> ExecutionHandle: ...

    def resume_interrupt(
        self,
        execution_id: UUID,
        *,
        step: str | Sequence[str] | None,
        payload: Any,
        idempotency_key: str | None,
        background: bool | None,
        reason: str = "",
    ) -> Outcome: ...

    def send(
        self,
        execution: UUID,
        topic: str,
        payload: Any,
        *,
        idempotency_key: str | None,
        background: bool | None,
    ) -> Outcome: ...

    def waiting_warnings(self, status: str, *, wakes: bool) -> list[str]: ...


#: Statuses of a run that waits for a worker or for the sweeper's wake-up (a sleep, a backoff,
#: a scheduled start): a timed-out wait asks whether one is alive.
WAITING_STATUSES = (ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED)

_FIRST_PAUSE = 0.005
_LONGEST_PAUSE = 0.25


class ExecutionHandle:
    """A stored execution: its status, redacted inputs, steps and trace, and what you can do.

    Obtained from ``MyReactor.find(execution_id)`` or ``django_reactor.services.find``. The
    handle is a snapshot; :meth:`refresh` reads the run again. Its operations go through the
    services (``operations``); a handle made without them (to show a row) can only be read.
    """

    def __init__(self, row: Execution, operations: Operations | None = None) -> None:
        self._row = row
        self._operations = operations
        self._steps: list[StepView] | None = None
        self._trace: list[TraceEvent] | None = None
        self._attributes: dict[str, str] | None = None
        # Which sealed secrets of the run are erased, asked once per subject key.
        self._marks = Marks()

    def __repr__(self) -> str:
        return f"<ExecutionHandle {self.reactor} {self.id} {self.status}>"

    # -- identity and status
    @property
    def id(self) -> UUID:
        return self._row.id

    @property
    def reactor(self) -> str:
        return self._row.reactor

    @property
    def status(self) -> str:
        return self._row.status

    @property
    def current_step(self) -> str:
        return self._row.current_step

    @property
    def created_at(self) -> dt.datetime:
        return self._row.created_at

    @property
    def finished_at(self) -> dt.datetime | None:
        return self._row.finished_at

    @property
    def idempotency_key(self) -> str | None:
        return self._row.idempotency_key

    @property
    def retry_of(self) -> UUID | None:
        """The run this one re-runs (a retry, or a fork: see :attr:`fork_step`)."""
        return self._row.retry_of_id

    @property
    def continued_from(self) -> UUID | None:
        """The run this one continues: its last step returned ``ContinueAsNew``."""
        return self._row.continued_from_id

    @property
    @_in_its_database
    def continued_as(self) -> UUID | None:
        """The run this one continued as (its successor), if it continued as new."""
        return store.continuation.successor_of(self.id)

    @property
    def generation(self) -> int:
        """How many runs came before this one in its continue-as-new lineage (0: the first)."""
        return self._row.generation

    @property
    def concurrency_key(self) -> str:
        """The key the run holds (or, ``queued``, waits for) under its reactor's
        ``Meta.concurrency``; ``""`` for none."""
        return self._row.concurrency_key

    @property
    def debounce_key(self) -> str:
        """The key whose starts collapse into the run while it waits (``Meta.debounce``);
        ``""`` for none."""
        return self._row.debounce_key

    @property
    def batch_key(self) -> str:
        """The key whose starts the run collects as its items (``Meta.batch``); ``""`` for
        none."""
        return self._row.batch_key

    @property
    def batch_size(self) -> int:
        """How many items a batched run holds (``Meta.batch``); 0 for a run of another
        reactor."""
        return self._row.batch_size

    @property
    def throttle_key(self) -> str:
        """The key the run's start counted under (``Meta.throttle``); ``""`` for none."""
        return self._row.throttle_key

    @property
    def queue(self) -> str:
        """The Celery queue the run's tasks go to (``Meta.queue``, ``run(queue=...)``);
        ``""`` for the default queue."""
        return self._row.queue

    @property
    def priority(self) -> int:
        """The run's priority, 0 (lowest) to 9 (highest): where runs wait, higher goes first."""
        return self._row.priority

    @property
    def fork_step(self) -> str:
        """For a fork, the step it ran again from (the steps before it were carried from
        :attr:`retry_of`); ``""`` otherwise."""
        return self._row.fork_step

    @property
    @_in_its_database
    def pause_info(self) -> dict[str, Any] | None:
        """The operator's pause that holds the run (its own, else its reactor's): ``reason``,
        ``by`` and ``reactor_paused``; None when nothing pauses it."""
        asked = store.pauses.pause_for(self.reactor, self.id, parent_id=self._row.parent_id)
        if asked is None:
            return None
        return {
            "reason": asked.reason,
            "by": asked.data.get("by", ""),
            "reactor_paused": bool(asked.data.get("reactor_paused")),
        }

    @property
    def inputs(self) -> dict[str, Any]:
        """The run's inputs with secret values replaced by ``[REDACTED]`` (by ``[ERASED]`` once
        the run's subject is forgotten)."""
        return redact(readable(self._row.inputs, self._marks), self._row.secret_paths)

    @property
    def subject(self) -> str:
        """Whose secrets the run holds (its reactor's ``Meta.subject``); ``""`` for none."""
        return self._row.subject

    @property
    @_in_its_database
    def outcome(self) -> Outcome:
        return store.outcome_of(self._row)

    @property
    def published(self) -> dict[str, Any]:
        """What the run's steps published with ``self.context.publish(key, value)``, the
        latest value of each key (written with the checkpoint of the step that published it)."""
        published = decode(self._row.published) if self._row.published else {}
        return dict(published) if isinstance(published, dict) else {}

    @property
    @_in_its_database
    def attributes(self) -> dict[str, str]:
        """The run's business attributes (``Meta.attributes``, ``context.set_attribute``), by
        key, each value as stored text (``42`` is ``"42"``, ``True`` is ``"true"``)."""
        if self._attributes is None:
            self._attributes = store.attributes.of_run(self.id)
        return dict(self._attributes)

    @property
    def error(self) -> ErrorInfo | None:
        return ErrorInfo.from_dict(self._row.failure) if self._row.failure else None

    # -- steps and trace
    @property
    @_in_its_database
    def steps(self) -> list[StepView]:
        """Step records in completion order."""
        if self._steps is None:
            rows = store.step_rows(self.id)
            self._marks.prepare(value for r in rows for value in (r.arguments, r.result))
            self._steps = [StepView.from_row(r, self._marks) for r in rows]
        return self._steps

    def step(self, name: str) -> StepView:
        for view in self.steps:
            if view.name == name:
                return view
        raise KeyError(f"execution {self.id} has no record of step {name!r}")

    def step_result(self, name: str) -> Any:
        return self.step(name).result

    @property
    @_in_its_database
    def trace(self) -> list[TraceEvent]:
        """The append-only trace, oldest first."""
        if self._trace is None:
            self._trace = [TraceEvent.from_row(r) for r in store.event_rows(self.id)]
        return self._trace

    @property
    def parent_id(self) -> UUID | None:
        """For a composed child: the execution whose step runs it."""
        return self._row.parent_id

    @_in_its_database
    def child(self, step: str) -> ExecutionHandle:
        """The composed child that ``step`` ran (raises KeyError when it has none)."""
        row = store.find_child(self.id, step)
        if row is None:
            raise KeyError(f"step {step!r} of execution {self.id} did not run a composed reactor")
        return ExecutionHandle(row, self._operations)

    # -- operations (through services, which enforce the state machine and the lease)
    @property
    def _services(self) -> Operations:
        if self._operations is None:
            raise ReactorError(
                f"this handle of execution {self.id} was made to show the run; steer it through "
                "services.find(execution_id) (or MyReactor.find) instead"
            )
        return self._operations

    @_in_its_database
    def refresh(self) -> ExecutionHandle:
        return self._services.find(self.id)

    async def arefresh(self) -> ExecutionHandle:
        """The async :meth:`refresh`: the run read again (see ``django_reactor.runtime.aio``
        for the thread it runs on)."""
        return await aio.call(self.refresh)

    @_in_its_database
    def wait(self, timeout: float | None = None) -> Outcome:
        """Wait until the run stops moving by itself, and return its outcome.

        A run moves by itself while it is ``pending``, ``running`` or ``rolling_back`` (a
        worker, or the sweeper, takes it further), or ``queued`` behind the runs of its
        concurrency key; ``wait`` returns once it finished (any
        ending) or paused at an interrupt (a ``Paused`` outcome: it waits for a payload now).
        This handle then shows the run as it stands. ``timeout`` is in seconds (None: no
        limit); past it :class:`~django_reactor.exceptions.WaitTimedOut` is raised, with the
        run's status. The run's status is read by primary key, first after 5 ms, then at
        intervals that double up to 0.25 s. Refused inside ``transaction.atomic()``: a worker
        could not see a run this transaction started, and the transaction would stay open.
        """
        timeout = self._check_wait(timeout, "wait")
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _FIRST_PAUSE
        while True:
            status = store.status_of(self.id)
            if status is None:
                raise self._gone()
            if status not in WAITED_THROUGH:
                break
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    assert timeout is not None  # a deadline is set only with one
                    raise self._timed_out(status, timeout)
                pause = min(pause, left)
            time.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE)
        return self._settle()

    async def await_outcome(self, timeout: float | None = None) -> Outcome:
        """The async :meth:`wait`: wait until the run stops moving by itself (finished, or
        paused at an interrupt), then return its outcome; this handle then shows the run as it
        stands.

        ``timeout`` is in seconds (None: no limit); past it
        :class:`~django_reactor.exceptions.WaitTimedOut` is raised (a ``TimeoutError``), with
        the run's status and, for a run no worker takes, why. While it waits the caller holds
        no thread and no database connection: one poller per event loop reads the status of
        every awaited run in one query, first after 5 ms, then at intervals that double up to
        0.25 s. Refused inside ``transaction.atomic()`` (an ``async_to_sync`` caller's), as
        :meth:`wait` is.
        """
        timeout = await aio.call(self._check_wait, timeout, "await_outcome")
        alias = self._row._state.db or store.using()
        try:
            status = await aio.settled(alias, self.id, timeout)
        except TimeoutError:
            assert timeout is not None  # only a bounded wait times out
            raise await aio.call(self._timed_out_now, timeout) from None
        if status is None:
            raise self._gone()
        return await aio.call(self._settle)

    @_in_its_database
    def _check_wait(self, timeout: float | None, how: str) -> float | None:
        """``timeout`` in seconds, once a wait is known to make sense here."""
        if timeout is not None:
            timeout = timevalues.seconds(timeout, f"{how}(timeout=...)", zero=True)
        if store.inside_user_transaction():
            raise TransactionActive(
                f"cannot wait for execution {self.id} inside transaction.atomic(): workers do "
                "not see what this transaction wrote, and it would stay open while you wait. "
                "Wait after it commits (transaction.on_commit), or outside atomic()"
            )
        return timeout

    def _gone(self) -> ExecutionNotFound:
        return ExecutionNotFound(f"execution {self.id} no longer exists (pruned?)")

    @_in_its_database
    def _settle(self) -> Outcome:
        """Read the run again, once it stopped moving, and return its outcome."""
        self._row = store.get_row(self.id)
        self._steps = self._trace = None
        self._attributes = None
        return self.outcome

    @_in_its_database
    def _timed_out_now(self, timeout: float) -> ReactorError:
        status = store.status_of(self.id)
        return self._gone() if status is None else self._timed_out(status, timeout)

    def _timed_out(self, status: str, timeout: float) -> WaitTimedOut:
        """The error of a wait that gave up on a run still in ``status``: it says so, and, for a
        run that waits for a worker or a wake-up when none is alive to take it, why it does not
        move and what to start (the verdict ``reactor_show`` gives, from the heartbeats)."""
        warnings: list[str] = []
        if self._operations is not None and status in WAITING_STATUSES:
            wakes = store.get_row(self.id).wake_at is not None
            warnings = self._operations.waiting_warnings(status, wakes=wakes)
        said = f"execution {self.id} is still {status} after {timeout:g} s"
        if warnings:
            said += "".join(f". {w[:1].upper()}{w[1:]}" for w in warnings) + "."
        else:
            said += "; wait again, or look at it with reactor_show"
        return WaitTimedOut(said, execution_id=self.id, status=status, warnings=warnings)

    @_in_its_database
    def cancel(self, reason: str = "") -> ExecutionHandle:
        return self._services.cancel(self.id, reason=reason)

    async def acancel(self, reason: str = "") -> ExecutionHandle:
        """The async :meth:`cancel`."""
        return await aio.call(self.cancel, reason)

    @_in_its_database
    def undo(self, reason: str = "") -> ExecutionHandle:
        return self._services.undo(self.id, reason=reason)

    @_in_its_database
    def retry(self, reason: str = "") -> Outcome:
        return self._services.retry(self.id, reason=reason)

    @_in_its_database
    def fork(
        self,
        from_step: str,
        *,
        inputs: Mapping[str, Any] | None = None,
        undo_abandoned: bool = False,
        reason: str = "",
    ) -> Outcome:
        """Run this stopped run again from ``from_step`` as a new run that reuses the results
        of the steps it completed before (their bodies do not run again), with the code
        deployed now. Completed steps past ``from_step`` whose effects stand are undone first,
        newest first, when ``undo_abandoned`` is true (``ForkNeedsUndo`` says which
        otherwise). See ``services.fork``."""
        return self._services.fork(self.id, from_step, inputs=inputs, undo_abandoned=undo_abandoned)

    @_in_its_database
    def pause(self, reason: str = "") -> ExecutionHandle:
        """Pause the run: it stops at its next step boundary (at once when nobody runs it) and
        is ``suspended``, holding no worker, until :meth:`unpause`."""
        return self._services.pause(self.id, reason=reason)

    @_in_its_database
    def unpause(self, reason: str = "") -> ExecutionHandle:
        """Let a paused run go on where it stopped (a worker takes it)."""
        return self._services.unpause(self.id, reason=reason)

    @property
    @_in_its_database
    def interrupts(self) -> tuple[PendingInterrupt, ...]:
        """The interrupts this run waits at (empty unless it is paused); an interrupt of a
        composed child paused under it by its path (``"checkout.approval"``)."""

        return tuple(
            PendingInterrupt(store.interrupts.path_of(i), i.correlation_id, i.expires_at)
            for i in store.interrupts.waiting(self.id)
        )

    @property
    @_in_its_database
    def maps(self) -> list[dict[str, Any]]:
        """A summary of each ``map_over`` step this run reached (totals, sampled failures)."""

        return [store.maps.summary(run.pk, run) for run in store.maps.maps_of(self.id)]

    @_in_its_database
    def resume(
        self,
        step: str | Sequence[str] | None = None,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        background: bool | None = None,
        reason: str = "",
    ) -> Outcome:
        """Deliver ``payload`` to the interrupt ``step``, or to the interrupt of a composed child
        at the path ``step`` (``"checkout.approval"`` or ``("checkout", "approval")``); see
        ``services.resume_interrupt``."""
        return self._services.resume_interrupt(
            self.id,
            step=step,
            payload=payload,
            idempotency_key=idempotency_key,
            background=background,
            reason=reason,
        )

    @_in_its_database
    def send(
        self,
        topic: str,
        payload: Any,
        *,
        idempotency_key: str | None = None,
        background: bool | None = None,
    ) -> Outcome:
        """Send ``payload`` to the run on ``topic``: kept until a ``receive(topic)`` step takes
        it; see ``django_reactor.send``."""
        return self._services.send(
            self.id, topic, payload, idempotency_key=idempotency_key, background=background
        )
