"""Lifecycle notifications: what the executor tells observers about a run and its steps.

The executor calls a :class:`RunObserver` after each state change it commits (a step done, a
step failed, the run paused, ...). Events carry identities, names, timings and error summaries,
never a run's inputs or a step's arguments (they may hold secrets).

An observer that raises never breaks a run: the executor wraps whatever it is given in a
:class:`CompositeObserver`, which logs the exception and goes on with the next observer.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from types import MethodType
from uuid import UUID

logger = logging.getLogger("django_reactor.observers")

ERROR_SUMMARY_LIMIT = 500


@dataclass(frozen=True, slots=True)
class RunEvent:
    """Something happened to a whole run.

    ``status`` is the run's status afterwards (``completed``, ``failed``, ``needs_attention``,
    ``paused``, ``pending``, ``running``, ...). ``step`` is where it happened (the failed or
    halting step, the first interrupt waited for, the next step after a hand-off, the step a
    parked run waits at). ``duration_ms`` is the time this process spent on the run so far.
    """

    execution_id: UUID | None
    reactor: str
    status: str
    step: str | None = None
    duration_ms: float | None = None
    error: str | None = None
    error_class: str | None = None
    reason: str | None = None
    delay: float | None = None
    waiting_for: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StepEvent:
    """Something happened to one step of a run.

    ``status`` is ``running`` (started), ``completed``, ``skipped``, the error kind of a
    failure (``step``, ``argument``, ``contract``, ...), ``retry``, or the rollback status of an
    undo or compensate (``undone``, ``compensated``, ``failed``, ``no_handler``).
    """

    execution_id: UUID | None
    reactor: str
    step: str
    status: str
    attempt: int = 0
    duration_ms: float | None = None
    error: str | None = None
    error_class: str | None = None
    delay: float | None = None


@dataclass(frozen=True, slots=True)
class CoordinationEvent:
    """A run (or, with ``step``, one of its steps) took what its coordination declares.

    ``kind`` is ``lock`` (with its ``fence``), ``semaphore``, ``rate_limit`` or ``period``;
    ``key`` the key as computed. A lock re-adopted after a park sends none.
    """

    execution_id: UUID | None
    reactor: str
    kind: str
    key: str
    step: str | None = None
    fence: int | None = None


#: What an observer is told.
Notification = RunEvent | StepEvent | CoordinationEvent


def __getattr__(name: str) -> type[RunEvent]:
    # ``ExecutionEvent`` was this module's name for :class:`RunEvent` (it is also the trace
    # entry model's): observers typed against it keep working, with a warning.
    if name == "ExecutionEvent":
        warnings.warn(
            "django_reactor.engine.observers.ExecutionEvent is now RunEvent; import RunEvent "
            "(ExecutionEvent goes away in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return RunEvent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def summarise(message: object) -> str | None:
    """An error message short enough for a notification (``None`` stays ``None``)."""
    if message is None:
        return None
    text = str(message)
    if len(text) > ERROR_SUMMARY_LIMIT:
        return text[: ERROR_SUMMARY_LIMIT - 1] + "…"
    return text


class RunObserver:
    """Receives a run's lifecycle notifications. Every method does nothing: override some."""

    def listens(self, notification: str) -> bool:
        """Whether the notification named ``notification`` (``"step_completed"``, ...), which
        this observer's class overrides, would do anything now: the run builds a step's event
        only when one of its observers listens. True unless a subclass knows better (the
        signals' observer listens while the signal has receivers)."""
        return True

    def execution_started(self, event: RunEvent) -> None:
        """A new run starts its first step in this process."""

    def execution_resumed(self, event: RunEvent) -> None:
        """A run continues from its checkpoint (a worker took it, or a payload arrived)."""

    def execution_completed(self, event: RunEvent) -> None:
        """Every step is done."""

    def execution_failed(self, event: RunEvent) -> None:
        """The run failed and was rolled back (``status`` ``needs_attention`` when not fully)."""

    def execution_halted(self, event: RunEvent) -> None:
        """A step returned ``Halt``: the run stopped without rollback."""

    def execution_cancelled(self, event: RunEvent) -> None:
        """The run was cancelled (between steps, or by ``undo()``)."""

    def execution_paused(self, event: RunEvent) -> None:
        """The run waits at one or more interrupts for their payload."""

    def execution_suspended(self, event: RunEvent) -> None:
        """An operator's pause stopped the run between steps (``reason``); it goes on when
        unpaused."""

    def execution_handed_off(self, event: RunEvent) -> None:
        """The caller handed the rest of the run to a Celery worker (``Meta.background``)."""

    def execution_parked(self, event: RunEvent) -> None:
        """The worker released the run to wait (a retry's backoff, an async unit, a child)."""

    def step_started(self, event: StepEvent) -> None:
        """A step's body is about to run (once per attempt)."""

    def step_completed(self, event: StepEvent) -> None:
        """A step's outcome (``Success`` or ``Skip``) was checkpointed."""

    def step_failed(self, event: StepEvent) -> None:
        """A step failed for good; rollback follows."""

    def step_retried(self, event: StepEvent) -> None:
        """An attempt failed and the step will be tried again after ``delay`` seconds."""

    def step_undone(self, event: StepEvent) -> None:
        """A completed step's undo ran (or it had none: ``status`` ``no_handler``)."""

    def step_compensated(self, event: StepEvent) -> None:
        """A failed step's compensate ran (or it had none: ``status`` ``no_handler``)."""

    def coordination_acquired(self, event: CoordinationEvent) -> None:
        """The run (or a step) took a lock, a semaphore slot, a rate-limit charge or a period."""


NOTIFICATIONS = tuple(
    name for name in vars(RunObserver) if name.startswith(("execution_", "step_", "coordination_"))
)


_OVERRIDDEN: dict[type, frozenset[str]] = {}


def _overridden(cls: type) -> frozenset[str]:
    """The notifications ``cls`` does something for (overrides)."""
    names = _OVERRIDDEN.get(cls)
    if names is None:
        names = _OVERRIDDEN[cls] = frozenset(
            name
            for name in NOTIFICATIONS
            if getattr(cls, name, None) is not getattr(RunObserver, name)
        )
    return names


class CompositeObserver(RunObserver):
    """Calls several observers in order; one that raises is logged and the others still run."""

    def __init__(self, observers: Iterable[RunObserver]) -> None:
        self.observers: tuple[RunObserver, ...] = tuple(observers)
        # Per notification, only the observers that override it (the no-ops cost nothing),
        # bound the first time the notification is sent: a run sends few of the many.
        self._targets: dict[str, tuple[MethodType, ...]] = {}
        # The observers those methods are of, by notification.
        self._listeners: dict[str, tuple[RunObserver, ...]] = {}

    def _bind(self, name: str) -> tuple[MethodType, ...]:
        listeners = tuple(o for o in self.observers if name in _overridden(type(o)))
        self._listeners[name] = listeners
        targets = self._targets[name] = tuple(getattr(o, name) for o in listeners)
        return targets

    def listens(self, notification: str) -> bool:
        """Whether one of the observers listens (see :meth:`RunObserver.listens`)."""
        listeners = self._listeners.get(notification)
        if listeners is None:
            self._bind(notification)
            listeners = self._listeners[notification]
        for observer in listeners:
            try:
                if observer.listens(notification):
                    return True
            except Exception:  # told anyway: the notification itself logs what it raises
                return True
        return False

    def _notify(self, name: str, event: Notification) -> None:
        targets = self._targets.get(name)
        if targets is None:
            targets = self._bind(name)
        for method in targets:
            try:
                method(event)
            except Exception:
                logger.exception(
                    "observer %s raised in %s for execution %s; the run goes on",
                    type(method.__self__).__qualname__,
                    name,
                    getattr(event, "execution_id", None),
                )

    def execution_started(self, event: RunEvent) -> None:
        self._notify("execution_started", event)

    def execution_resumed(self, event: RunEvent) -> None:
        self._notify("execution_resumed", event)

    def execution_completed(self, event: RunEvent) -> None:
        self._notify("execution_completed", event)

    def execution_failed(self, event: RunEvent) -> None:
        self._notify("execution_failed", event)

    def execution_halted(self, event: RunEvent) -> None:
        self._notify("execution_halted", event)

    def execution_cancelled(self, event: RunEvent) -> None:
        self._notify("execution_cancelled", event)

    def execution_paused(self, event: RunEvent) -> None:
        self._notify("execution_paused", event)

    def execution_suspended(self, event: RunEvent) -> None:
        self._notify("execution_suspended", event)

    def execution_handed_off(self, event: RunEvent) -> None:
        self._notify("execution_handed_off", event)

    def execution_parked(self, event: RunEvent) -> None:
        self._notify("execution_parked", event)

    def step_started(self, event: StepEvent) -> None:
        self._notify("step_started", event)

    def step_completed(self, event: StepEvent) -> None:
        self._notify("step_completed", event)

    def step_failed(self, event: StepEvent) -> None:
        self._notify("step_failed", event)

    def step_retried(self, event: StepEvent) -> None:
        self._notify("step_retried", event)

    def step_undone(self, event: StepEvent) -> None:
        self._notify("step_undone", event)

    def step_compensated(self, event: StepEvent) -> None:
        self._notify("step_compensated", event)

    def coordination_acquired(self, event: CoordinationEvent) -> None:
        self._notify("coordination_acquired", event)


def composite(observer: RunObserver | None) -> CompositeObserver | None:
    """``observer`` made safe to call (a composite never raises); ``None`` stays ``None``."""
    if observer is None or isinstance(observer, CompositeObserver):
        return observer
    return CompositeObserver([observer])
