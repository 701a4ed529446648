"""django_reactor: durable sagas for Django.

The public API, importable without touching models::

    from django_reactor import Reactor, Step, step, interrupt, arg, Retry
    from django_reactor import Success, Failure, Halt, Skip, ContinueAsNew
"""

from __future__ import annotations

__version__ = "0.1.0"

from .engine.actors import Actor, acting_as
from .engine.constructs.async_unit import async_reactor
from .engine.constructs.compose import compose
from .engine.constructs.events import EmittedEvent, on_event, wait_for_event
from .engine.constructs.interrupt import ContinueWith, interrupt
from .engine.constructs.map import map_over
from .engine.constructs.receive import receive
from .engine.constructs.sleep import sleep, sleep_until
from .engine.coordination import Lock, OrderedLock, Period, RateLimit, Semaphore
from .engine.declarations import async_step, step
from .engine.flow import Batch, Concurrency, Debounce, Throttle
from .engine.outcomes import (
    Aborted,
    Cancelled,
    Completed,
    ContinueAsNew,
    Dispatched,
    ErrorInfo,
    Failed,
    Failure,
    Halt,
    Halted,
    InProgress,
    Outcome,
    Paused,
    PendingInterrupt,
    Queued,
    Rescheduled,
    RollbackFailure,
    Scheduled,
    Skip,
    Success,
)
from .engine.retry import Retry
from .engine.step import Step, StepContext, step_context
from .engine.templates import arg
from .events import aemit, emit
from .mailbox import asend, send
from .reactor import Reactor

__all__ = [
    "Aborted",
    "Actor",
    "Batch",
    "Cancelled",
    "Completed",
    "Concurrency",
    "ContinueAsNew",
    "ContinueWith",
    "Debounce",
    "Dispatched",
    "EmittedEvent",
    "ErrorInfo",
    "Failed",
    "Failure",
    "Halt",
    "Halted",
    "InProgress",
    "Lock",
    "OrderedLock",
    "Outcome",
    "Paused",
    "PendingInterrupt",
    "Period",
    "Queued",
    "RateLimit",
    "Reactor",
    "Rescheduled",
    "Retry",
    "RollbackFailure",
    "Scheduled",
    "Semaphore",
    "Skip",
    "Step",
    "StepContext",
    "Success",
    "Throttle",
    "__version__",
    "acting_as",
    "aemit",
    "arg",
    "asend",
    "async_reactor",
    "async_step",
    "compose",
    "emit",
    "interrupt",
    "map_over",
    "on_event",
    "receive",
    "send",
    "sleep",
    "sleep_until",
    "step",
    "step_context",
    "wait_for_event",
]
