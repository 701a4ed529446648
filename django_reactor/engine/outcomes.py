"""What a step returns, and what a run returns to its caller.

A step body returns one of :class:`Success`, :class:`Failure`, :class:`Halt` or :class:`Skip`
(a plain value counts as ``Success(value)``; raising counts as a retryable ``Failure``), or
from a run's last step :class:`ContinueAsNew` (see :mod:`.continuation`). A run
returns an :class:`Outcome`: :class:`Completed`, :class:`Failed`, :class:`Halted` and friends.
"""

from __future__ import annotations

import datetime as dt
import traceback as tb
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from ..states import ExecutionStatus
from .serialization import JSONObject, encode, printable

# --------------------------------------------------------------------------- step outcomes


@dataclass(frozen=True, slots=True)
class Success:
    """The step did its work; ``value`` is its result, passed to dependants."""

    value: Any = None


@dataclass(frozen=True, slots=True)
class Failure:
    """The step failed. ``retryable=False`` stops retries even if the step has a policy."""

    error: object = "failed"
    retryable: bool = True


@dataclass(frozen=True, slots=True)
class Halt:
    """Stop the run cleanly here: nothing after it runs and nothing is rolled back."""

    reason: Any = ""


@dataclass(frozen=True, slots=True)
class Skip:
    """The step did nothing. ``value`` still flows to dependants; a skipped step is never undone."""

    value: Any = None


@dataclass(frozen=True, slots=True)
class ContinueAsNew:
    """End this run completed and start a new run of the same reactor with ``inputs``: a
    long-lived loop goes on in a run with a fresh trace.

    Return it from the run's last step (every other step has ended). The new run (the
    *successor*) is validated by the reactor's ``Inputs`` like any start, is created in the
    same transaction as this run's final checkpoint, and starts on a worker.
    """

    inputs: Mapping[str, Any] = field(default_factory=dict)


StepOutcome = Success | Failure | Halt | Skip | ContinueAsNew


def as_step_outcome(returned: object) -> StepOutcome:
    """Normalise what a step body returned: plain values are successes."""
    if isinstance(returned, Success | Failure | Halt | Skip | ContinueAsNew):
        return returned
    return Success(returned)


# --------------------------------------------------------------------------- failure details

MAX_TRACEBACK_FRAMES = 100


class ErrorKind:
    """Why a run failed (the ``kind`` of an :class:`ErrorInfo`)."""

    INPUT_VALIDATION = "input_validation"
    CONTRACT = "contract"
    ARGUMENT = "argument_resolution"
    STEP = "step"
    RESULT = "result_not_serializable"
    INTERRUPTED = "interrupted"
    ROLLBACK = "rollback"
    RECOVERY_LIMIT = "recovery_limit"
    REACTOR_MISSING = "reactor_missing"
    DEFINITION_CHANGED = "definition_changed"
    # An interrupt's correlation id could not be computed or is taken by another live run.
    CORRELATION = "correlation"
    # Too many invalid payloads for an interrupt (its max_attempts).
    PAYLOAD = "invalid_payload"
    # An interrupt expired with on_timeout="fail".
    TIMEOUT = "interrupt_timeout"
    # A stored row this code cannot read (an unknown type tag, inputs that are not an object, a
    # definition shape that does not parse): parked for a person, never retried.
    UNREADABLE = "unreadable_record"
    # The engine (not a step's code) raised while running the run: parked, not recovered in a loop.
    ENGINE = "engine_error"
    # The coordination backend could not be reached or used (nothing runs unlocked).
    COORDINATION_UNAVAILABLE = "coordination_unavailable"
    # The run's deadline passed (Meta.deadline, run(..., deadline=)) before it finished.
    DEADLINE = "deadline"
    # The run needs a secret of a subject that was forgotten (reactor_forget_subject): it fails
    # where it stands, nothing rolled back (the rollback would need the erased secrets too).
    SUBJECT_ERASED = "subject_erased"
    # A step called deprecated_patch() in a run on the patch's old branch: parked, nothing
    # rolled back (the code that would finish it was removed).
    PATCH_REMOVED = "patch_removed"
    # A step returned ContinueAsNew that cannot be honoured (inputs the reactor's Inputs
    # refuses, steps that had not ended, a run that is part of another).
    CONTINUATION = "continue_as_new"


@dataclass(frozen=True, slots=True, kw_only=True)
class RollbackFailure:
    """An undo or compensate that raised or returned Failure during rollback."""

    step: str
    action: str  # "undo", "compensate" or "undo_all"
    exception_class: str | None
    message: str
    # For a map element: its index in the map.
    index: int | None = None
    # Why it failed when the handler did not run (``coordination_unavailable``: its step's
    # lock could not be held; ``missing``: a map element's row is gone).
    kind: str | None = None

    def __post_init__(self) -> None:
        # Only shown, never refused: what the database cannot store is escaped.
        object.__setattr__(self, "message", printable(self.message))

    def to_dict(self) -> JSONObject:
        data: JSONObject = {
            "step": self.step,
            "action": self.action,
            "exception_class": self.exception_class,
            "message": self.message,
        }
        if self.index is not None:
            data["index"] = self.index
        if self.kind is not None:
            data["kind"] = self.kind
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RollbackFailure:
        return cls(
            step=data["step"],
            action=data["action"],
            exception_class=data.get("exception_class"),
            message=data.get("message", ""),
            index=data.get("index"),
            kind=data.get("kind"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorInfo:
    """Everything known about why a run failed.

    ``inputs`` and ``arguments`` are redacted copies: secret values read ``"[REDACTED]"``.
    """

    kind: str
    message: str
    step: str | None = None
    reactor: str | None = None
    exception_class: str | None = None
    traceback: str = ""
    field_errors: JSONObject = field(default_factory=dict)
    retryable: bool = False
    attempts: int = 0
    inputs: JSONObject = field(default_factory=dict)
    arguments: JSONObject = field(default_factory=dict)
    rollback_failures: tuple[RollbackFailure, ...] = ()

    def __post_init__(self) -> None:
        # Only shown, never refused: what the database cannot store is escaped.
        object.__setattr__(self, "message", printable(self.message))
        if self.traceback:
            object.__setattr__(self, "traceback", printable(self.traceback))

    def __str__(self) -> str:
        exc = f" ({self.exception_class.rsplit('.', 1)[-1]})" if self.exception_class else ""
        if self.step is None:
            return self.message
        if self.kind == ErrorKind.ARGUMENT:
            return f"step {self.step!r} could not resolve its arguments: {self.message}"
        if self.kind == ErrorKind.RESULT:
            return f"step {self.step!r} returned a value that cannot be stored: {self.message}"
        if self.kind == ErrorKind.INTERRUPTED:
            return f"step {self.step!r} was interrupted{exc}: {self.message}"
        if self.kind == ErrorKind.CONTRACT:
            return self.message
        return f"step {self.step!r} failed{exc}: {self.message}"

    def with_rollback_failures(self, failures: list[RollbackFailure]) -> ErrorInfo:
        return ErrorInfo(**{**self._fields(), "rollback_failures": tuple(failures)})

    def _fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def to_dict(self) -> JSONObject:
        data: JSONObject = self._fields()
        data["rollback_failures"] = [f.to_dict() for f in self.rollback_failures]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ErrorInfo:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["rollback_failures"] = tuple(
            RollbackFailure.from_dict(f) for f in data.get("rollback_failures", ())
        )
        return cls(**known)

    @classmethod
    def from_exception(cls, exc: BaseException, *, kind: str, **extra: Any) -> ErrorInfo:
        """Describe ``exc`` with its class, message and a capped traceback."""
        return cls(
            kind=kind,
            message=exception_message(exc),
            exception_class=qualified_class_name(exc),
            traceback=format_traceback(exc),
            **extra,
        )


def exception_message(exc: BaseException) -> str:
    """``str(exc)`` (the class name when empty), safe to store and show."""
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ raises
        text = ""
    return printable(text) or exc.__class__.__name__


def qualified_class_name(exc: BaseException) -> str:
    cls = exc.__class__
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def format_traceback(exc: BaseException, limit: int = MAX_TRACEBACK_FRAMES) -> str:
    """The exception's traceback, the innermost ``limit`` frames, as text."""
    frames = tb.extract_tb(exc.__traceback__)
    dropped = max(0, len(frames) - limit)
    lines = ["Traceback (most recent call last):\n"]
    if dropped:
        lines.append(f"  ... {dropped} earlier frames omitted\n")
    lines.extend(tb.format_list(frames[dropped:]))
    try:
        lines.extend(tb.format_exception_only(type(exc), exc))
    except Exception:  # an exception whose __str__ raises
        lines.append(f"{qualified_class_name(exc)}\n")
    return "".join(lines)


# --------------------------------------------------------------------------- run outcomes


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What ``Reactor.run()`` returns. Subclasses say how the run ended (or where it stands).

    ``idempotent_replay`` is True when the run was not started by this call but found through
    its idempotency key.
    """

    execution_id: UUID | None
    status: str
    idempotent_replay: bool = False

    @property
    def ok(self) -> bool:
        """True only for a completed run."""
        return self.status == ExecutionStatus.COMPLETED


@dataclass(frozen=True, slots=True, kw_only=True)
class Completed(Outcome):
    """The run completed; ``value`` is the ``Meta.returns`` step's result (or all results).

    ``continued_as``: the id of the run it continued as (a step returned ``ContinueAsNew``).
    """

    value: Any = None
    # Left out of the repr: a run that did not continue (nearly all) reads as it always did.
    continued_as: UUID | None = field(default=None, repr=False)
    status: str = ExecutionStatus.COMPLETED


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed(Outcome):
    """The run failed; ``error`` says where and why, and what rollback could not undo."""

    error: ErrorInfo
    status: str = ExecutionStatus.FAILED

    @property
    def rollback_failures(self) -> tuple[RollbackFailure, ...]:
        return self.error.rollback_failures


@dataclass(frozen=True, slots=True, kw_only=True)
class Halted(Outcome):
    """A step returned ``Halt``: the run stopped cleanly at ``step``."""

    reason: Any = ""
    step: str | None = None
    status: str = ExecutionStatus.HALTED


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancelled(Outcome):
    """The run was cancelled (by ``cancel()`` or after ``undo()``)."""

    reason: str = ""
    status: str = ExecutionStatus.CANCELLED


@dataclass(frozen=True, slots=True, kw_only=True)
class Aborted(Outcome):
    """The process running the run was interrupted; ``undo()`` rolls back what completed."""

    error: ErrorInfo | None = None
    status: str = ExecutionStatus.ABORTED


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatched(Outcome):
    """The run was handed to a Celery worker; ``results`` holds what ran in this process."""

    results: dict[str, Any] = field(default_factory=dict)
    status: str = ExecutionStatus.PENDING


@dataclass(frozen=True, slots=True, kw_only=True)
class Scheduled(Outcome):
    """The run starts later (``run(..., at=...)`` or ``delay=...``): a worker starts it at
    ``start_at``."""

    start_at: dt.datetime | None = None
    status: str = ExecutionStatus.SCHEDULED


@dataclass(frozen=True, slots=True)
class PendingInterrupt:
    """An interrupt a paused run waits at: resume it by execution id or correlation id.

    ``step`` names it as you resume it: the interrupt's step, or for an interrupt of a composed
    child its dotted path from the paused run (``"checkout.approval"``).
    """

    step: str
    correlation_id: str | None = None
    expires_at: dt.datetime | None = None
    # The single-use resume token, when REACTOR["RESUME_TOKENS"] is on (only in the outcome of
    # the call that paused the run; the database keeps its hash).
    token: str | None = field(default=None, repr=False, compare=False)

    @property
    def path(self) -> tuple[str, ...]:
        """Where the interrupt is: ``("approval",)`` for one of the run's own, or through
        composed children, ``("checkout", "approval")`` (``step`` is the same path, dotted)."""
        return tuple(self.step.split("."))


@dataclass(frozen=True, slots=True, kw_only=True)
class Paused(Outcome):
    """The run waits at one or more interrupts for their payloads (``interrupts``)."""

    interrupts: tuple[PendingInterrupt, ...] = ()
    results: dict[str, Any] = field(default_factory=dict)
    status: str = ExecutionStatus.PAUSED

    @property
    def step(self) -> str | None:
        """The first interrupt waiting (most runs have exactly one)."""
        return self.interrupts[0].step if self.interrupts else None

    @property
    def correlation_id(self) -> str | None:
        return self.interrupts[0].correlation_id if self.interrupts else None

    @property
    def expires_at(self) -> dt.datetime | None:
        return self.interrupts[0].expires_at if self.interrupts else None

    @property
    def token(self) -> str | None:
        return self.interrupts[0].token if self.interrupts else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Rescheduled(Outcome):
    """A step will be retried later: the run waits, holding no worker, until ``wake_at``."""

    step: str = ""
    delay: float = 0.0
    # "retry" (a step's backoff), "park" (a reader waiting for an async unit) or "sleep".
    reason: str = "retry"
    status: str = ExecutionStatus.PENDING


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspended(Outcome):
    """An operator paused the run (or its reactor): it stopped between steps, holds no worker,
    and goes on where it stopped when it is unpaused (``handle.unpause()``)."""

    reason: str = ""
    status: str = ExecutionStatus.SUSPENDED


@dataclass(frozen=True, slots=True, kw_only=True)
class Queued(Outcome):
    """The run is over its reactor's concurrency limit (``Meta.concurrency``): it waits,
    holding no worker, behind the runs in flight with its ``key``, and a worker starts it when
    one of them ends."""

    key: str = ""
    status: str = ExecutionStatus.QUEUED


@dataclass(frozen=True, slots=True, kw_only=True)
class InProgress(Outcome):
    """The run has not finished: another caller or process is still working on it."""


# --------------------------------------------------------------------------- as JSON


def outcome_data(outcome: Outcome) -> JSONObject:
    """An outcome as a JSON object, as the API answers it and ``reactor_* --json`` prints it.

    Always ``execution_id`` (a string, or None), ``status`` and ``idempotent_replay``; then what
    the status carries: ``value`` (completed), ``error`` (failed, and aborted when known: the
    :class:`ErrorInfo` as a dict), ``step`` and ``reason`` (halted), ``reason`` (cancelled),
    ``interrupts`` (paused: ``step``, ``correlation_id``, ``expires_at`` in ISO 8601 or None)
    and ``step`` (rescheduled). Values and reasons are encoded as the database stores them
    (:func:`~django_reactor.engine.serialization.encode`): dates, decimals, UUIDs, tuples and
    sets are tagged objects.
    """
    data: JSONObject = {
        "execution_id": str(outcome.execution_id) if outcome.execution_id else None,
        "status": str(outcome.status),
        "idempotent_replay": outcome.idempotent_replay,
    }
    if isinstance(outcome, Completed):
        data["value"] = encode(outcome.value)
        if outcome.continued_as is not None:
            data["continued_as"] = str(outcome.continued_as)
    elif isinstance(outcome, Failed | Aborted):
        if outcome.error is not None:
            data["error"] = outcome.error.to_dict()
    elif isinstance(outcome, Halted):
        data["step"] = outcome.step
        data["reason"] = encode(outcome.reason)
    elif isinstance(outcome, Cancelled | Suspended):
        data["reason"] = outcome.reason
    elif isinstance(outcome, Queued):
        data["key"] = outcome.key
    elif isinstance(outcome, Paused):
        data["interrupts"] = [
            {
                "step": pending.step,
                "correlation_id": pending.correlation_id,
                "expires_at": pending.expires_at.isoformat() if pending.expires_at else None,
            }
            for pending in outcome.interrupts
        ]
    elif isinstance(outcome, Rescheduled):
        data["step"] = outcome.step
    elif isinstance(outcome, Scheduled):
        data["start_at"] = outcome.start_at.isoformat() if outcome.start_at else None
    return data
